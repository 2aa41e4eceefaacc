"""``portal topic …``, ``portal policy publish`` and ``portal verify-log``.

What changes the catalogue goes through :mod:`portal.staff.catalogue`, as the console's
forms do, so each change is in the audit trail with the command line as its actor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from flask.cli import AppGroup

from portal.cli import ClickProgress
from portal.compliance.verify import BundleError, bundle_anchors, parse_log_keys
from portal.consent import catalogue, merkle, receipt_check, tree
from portal.db import db
from portal.errors import ApiError
from portal.seams import current_portal
from portal.staff import catalogue as audited
from portal.staff.audit import command_line_actor

topic_cli = AppGroup("topic", help="The topic catalogue.")
policy_cli = AppGroup("policy", help="Policy versions (immutable once published).")


def _now():  # noqa: ANN202
    return current_portal().clock.now()


def _fail(error: ApiError) -> None:
    click.echo(f"error: {error.message}", err=True)
    sys.exit(1)


@topic_cli.command("add")
@click.argument("slug")
@click.option("--category", help="A category in use, named as `portal topic list` shows it.")
@click.option(
    "--new-category",
    help="A new category (refused when one in use has the same name, whatever its capitals).",
)
@click.option("--label", required=True)
@click.option("--description", default="")
@click.option("--transactional", is_flag=True, help="Account messages the permission grant covers.")
@click.option(
    "--default", "default_state", type=click.Choice(["opt_in", "opt_out"]), default="opt_out"
)
def topic_add(
    slug: str,
    category: str | None,
    new_category: str | None,
    label: str,
    description: str,
    transactional: bool,
    default_state: str,
) -> None:
    """Add a topic to the catalogue, under a category in use or a new one."""
    name = category if new_category is None else new_category
    if name is None or (category is not None and new_category is not None):
        raise click.UsageError("give either --category (one in use) or --new-category")
    try:
        with db.begin() as session:
            topic = audited.create_topic(
                session,
                actor=command_line_actor(),
                slug=slug,
                category=name,
                new_category=new_category is not None,
                label=label,
                description=description,
                transactional=transactional,
                default_state=default_state,
                now=_now(),
            )
            click.echo(f"added {topic.slug} ({topic.category}, default {topic.default_state})")
    except ApiError as error:
        _fail(error)


@topic_cli.command("retire")
@click.argument("slug")
def topic_retire(slug: str) -> None:
    """Retire a topic: it leaves pages and audiences; its history stays."""
    try:
        with db.begin() as session:
            audited.retire_topic(session, actor=command_line_actor(), slug=slug, now=_now())
            topic = catalogue.topic_by_slug(session, slug)
            assert topic.retired_at is not None
            click.echo(f"retired {topic.slug} at {topic.retired_at:%Y-%m-%d %H:%M} UTC")
    except ApiError as error:
        _fail(error)


@topic_cli.command("list")
def topic_list() -> None:
    """List every topic, retired ones included."""
    with db.begin() as session:
        topics = catalogue.all_topics(session)
        if not topics:
            click.echo("no topics")
            return
        click.echo(f"{'slug':<28} {'category':<16} {'class':<14} {'default':<8} status")
        for t in topics:
            kind = "transactional" if t.is_transactional else "marketing"
            status = f"retired {t.retired_at:%Y-%m-%d}" if t.retired_at else "active"
            click.echo(f"{t.slug:<28} {t.category:<16} {kind:<14} {t.default_state:<8} {status}")


@policy_cli.command("publish")
@click.argument("version")
@click.option(
    "--file", "path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
def policy_publish(version: str, path: Path) -> None:
    """Publish the policy text in FILE as VERSION."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        click.echo("error: the file is not UTF-8 text", err=True)
        sys.exit(1)
    try:
        with db.begin() as session:
            policy = audited.publish_policy(
                session, actor=command_line_actor(), version=version, text=text, now=_now()
            )
            click.echo(f"published {policy.version} sha256={policy.text_sha256}")
    except ApiError as error:
        _fail(error)


def _anchor(value: str) -> tuple[int, bytes]:
    seq, _, digest = value.partition(":")
    try:
        parsed = (int(seq), bytes.fromhex(digest))
    except ValueError:
        parsed = (0, b"")
    if parsed[0] < 1 or len(parsed[1]) != 32:
        raise click.BadParameter(
            f"{value!r} is not SEQ:HASH (a sequence number and 64 hex digits)",
            param_hint="--anchor",
        )
    return parsed


@click.option(
    "--anchor",
    "anchor_values",
    multiple=True,
    metavar="SEQ:HASH",
    help="An event that must still be in the log with this hash, such as the head an "
    "earlier check printed. Repeatable.",
)
@click.option(
    "--bundle",
    "bundles",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="A signed export bundle (folder or .zip): its first and last events are anchors. "
    "Repeatable.",
)
@click.option(
    "--tree-head",
    "tree_head_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A signed tree head saved earlier (the JSON of GET /api/consent-log/tree-head): "
    "today's log must be consistent with it.",
)
@click.option(
    "--save-tree-head",
    "save_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the verified latest signed tree head here, to check against later.",
)
@click.option(
    "--log-key",
    "log_keys",
    multiple=True,
    help="An earlier key of the consent log (base64, or a file with GET "
    "/api/consent-log/key's JSON) whose heads to trust beside this deployment's own: "
    "after CONSENT_LOG_SIGNING_KEY changed, for the heads signed before. Repeatable.",
)
def verify_log(
    anchor_values: tuple[str, ...],
    bundles: tuple[Path, ...],
    tree_head_file: Path | None,
    log_keys: tuple[str, ...],
    save_file: Path | None,
) -> None:
    """Check the consent log's Merkle tree; exit 1 naming the first bad event.

    Every leaf is recomputed from its event, the root from the leaves, and the latest
    signed tree head's root and signature are checked (with the log key of this
    deployment, or an earlier one given with ``--log-key``); the events from before the
    tree keep their hash chain, checked too.
    A tree head saved earlier (``--tree-head``) shows history rewritten since, and
    anchors kept outside the database show the newest events removed.
    """
    anchors = dict(_anchor(value) for value in anchor_values)
    for bundle in bundles:
        try:
            anchors.update(bundle_anchors(bundle))
        except BundleError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(1)
    saved = None
    if tree_head_file is not None:
        try:
            saved = merkle.TreeHead.from_json(receipt_check.load(tree_head_file.read_bytes()))
        except (ValueError, receipt_check.ReceiptError) as error:
            click.echo(f"error: {tree_head_file} is not a signed tree head ({error})", err=True)
            sys.exit(1)
    key_text = current_portal().settings.consent_log_signing_key
    trusted = [tree.signing_key(key_text).public_key()] if key_text else []
    try:
        trusted += parse_log_keys(log_keys)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--log-key") from None
    with db.engine.connect() as connection:
        total = connection.exec_driver_sql("SELECT count(*) FROM consent_event").scalar_one()
        progress = ClickProgress("verify-log")
        progress.start(total)
        try:
            report = tree.verify_log(
                connection,
                progress=progress,
                anchors=anchors,
                log_keys=trusted,
                saved_head=saved,
            )
        finally:
            progress.close()
    if report.ok:
        checked = f", {len(anchors)} anchors found" if anchors else ""
        if saved is not None:
            checked += f", consistent with the saved head of size {saved.tree_size}"
        head = report.head
        described = (
            f"signed tree head size {head.tree_size} root {head.root_hash.hex()}"
            if head is not None
            else "no signed tree head yet"
        )
        click.echo(
            f"consent log intact: {report.events} events ({report.pending} not yet in the "
            f"tree){checked}, {described}"
        )
        if save_file is not None and head is not None:
            save_file.write_text(json.dumps(head.to_json(), indent=2) + "\n")
        return
    click.echo(f"consent log BROKEN at {report.problem}", err=True)
    sys.exit(1)


@click.argument("receipt", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--log-key",
    "log_keys",
    multiple=True,
    help="The consent log's public key (base64, or a file with GET /api/consent-log/key's "
    "JSON); again for each earlier key if the log's key changed since the receipt. "
    "Without it the receipt's own copy is used.",
)
@click.option(
    "--tree-head",
    "later_head",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A later signed tree head (GET /api/consent-log/tree-head); with --consistency.",
)
@click.option(
    "--consistency",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The consistency proof from the receipt's tree head to --tree-head.",
)
def verify_receipt(
    receipt: Path, log_keys: tuple[str, ...], later_head: Path | None, consistency: Path | None
) -> None:
    """Check a consent receipt offline: its signature, its tree head, each event's
    inclusion proof, and a later head's consistency with it; exit 1 naming what fails (the
    same check as tools/verify_receipt.py)."""
    args = [str(receipt)]
    for log_key in log_keys:
        args += ["--log-key", log_key]
    for flag, value in (
        ("--tree-head", later_head),
        ("--consistency", consistency),
    ):
        if value is not None:
            args += [flag, str(value)]
    sys.exit(receipt_check.main(args))


def register(portal_cli: AppGroup) -> None:
    portal_cli.add_command(topic_cli)
    portal_cli.add_command(policy_cli)
    portal_cli.command("verify-log")(verify_log)
    portal_cli.command("verify-receipt")(verify_receipt)
