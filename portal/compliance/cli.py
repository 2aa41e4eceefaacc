"""``portal export`` and ``portal verify-export``.

``verify-export`` needs no database or configuration: ``python -m portal.compliance.cli
BUNDLE`` runs the same check where only the package is installed.
"""

from __future__ import annotations

import datetime as dt
import socket
import sys
import uuid
from pathlib import Path

import click
from flask.cli import AppGroup, with_appcontext

from portal.compliance import services
from portal.compliance.export import (
    DATA_FILES,
    ExportError,
    ExportFilter,
    bundle_name,
    write_bundle,
)
from portal.compliance.signing import SigningKey, SigningKeyMissing, parse_public_key
from portal.compliance.verify import BundleError, LaterHead, parse_log_keys, verify_bundle
from portal.consent import merkle, receipt_check
from portal.db import db
from portal.seams import current_portal
from portal.staff.audit import command_line_actor


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


@click.command("export")
@click.option(
    "--from",
    "start",
    required=True,
    type=click.DateTime(["%Y-%m-%d"]),
    help="First day (UTC, by recorded time).",
)
@click.option(
    "--to", "end", required=True, type=click.DateTime(["%Y-%m-%d"]), help="Last day, included."
)
@click.option(
    "--format",
    "data_format",
    type=click.Choice(sorted(DATA_FILES)),
    default="csv",
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="The bundle's folder; it must not exist yet. Default: a folder in the current "
    "one named after the period and format (consent-export-FROM_TO-FORMAT).",
)
@click.option("--topic", help="Only this topic's events (its slug).")
@click.option("--subscriber", type=click.UUID, help="Only this subscriber's events.")
@with_appcontext
def export_command(
    start: dt.datetime,
    end: dt.datetime,
    data_format: str,
    out: Path | None,
    topic: str | None,
    subscriber: uuid.UUID | None,
) -> None:
    """Export consent history as a signed bundle in OUT."""
    portal = current_portal()
    try:
        key = SigningKey.from_setting(portal.settings.export_signing_key)
    except SigningKeyMissing as missing:
        _fail(str(missing))
    try:
        filters = ExportFilter(start.date(), end.date(), topic, subscriber)
    except ExportError as error:
        _fail(str(error))
    if out is None:
        out = Path(bundle_name(filters, data_format))
    if out.exists():
        _fail(f"{out} exists already: choose a new folder")
    actor = command_line_actor()
    user = f"{actor.os_user}@{socket.gethostname()}"
    try:
        with db.begin() as session:
            plan = services.start_export(
                session,
                filters,
                data_format=data_format,
                actor=actor,
                via=f"command line ({user})",
            )
        manifest = write_bundle(
            out,
            db.engine,
            plan,
            data_format,
            exporter={"kind": "command line", "user": user},
            created_at=portal.clock.now(),
            key=key,
        )
    except ExportError as error:
        _fail(str(error))
    click.echo(
        f"exported {manifest['data']['rows']} events to {out} "
        f"({manifest['data']['file']}, sha256 {manifest['data']['sha256']})"
    )


@click.command("verify-export")
@click.argument("bundle", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--public-key",
    help="The export signing key (hex, base64url or a PEM file) from the staff console. "
    "Without it the manifest's own copy is used, which proves the bundle is intact but "
    "not who signed it.",
)
@click.option(
    "--log-key",
    "log_keys",
    multiple=True,
    help="The consent log's public key (base64, or a file with GET /api/consent-log/key's "
    "JSON): the tree head the bundle was cut at must carry its signature, and so must "
    "--tree-head. Give it again for each earlier key if the log's key changed since the "
    "export. Without it the manifest's copy is used.",
)
@click.option(
    "--tree-head",
    "later_head_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A later signed tree head (GET /api/consent-log/tree-head): with --consistency, "
    "the log it describes must still hold every exported event.",
)
@click.option(
    "--consistency",
    "consistency_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The consistency proof from the bundle's tree head to --tree-head "
    "(GET /api/consent-log/consistency?from=M&to=N).",
)
def verify_export_command(
    bundle: Path,
    public_key: str | None,
    log_keys: tuple[str, ...],
    later_head_file: Path | None,
    consistency_file: Path | None,
) -> None:
    """Check an export bundle (folder or .zip) offline; exit 1 naming what is wrong."""
    try:
        key = parse_public_key(public_key) if public_key else None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--public-key") from None
    try:
        tree_keys = parse_log_keys(log_keys)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--log-key") from None
    later = _later_head(later_head_file, consistency_file)
    try:
        report = verify_bundle(bundle, key, log_keys=tree_keys, later=later)
    except BundleError as error:
        _fail(str(error))
    if not report.ok:
        for problem in report.problems:
            click.echo(f"FAILED {problem}", err=True)
        click.echo(f"{bundle}: {len(report.problems)} problem(s); do not rely on it", err=True)
        sys.exit(1)
    assert report.key is not None
    click.echo(
        f"{bundle}: OK: {report.rows} events, data sha256 {report.data_sha256}, "
        f"signed by key {report.key.hex}"
    )
    if report.proven_head is not None:
        head = report.proven_head
        click.echo(
            f"every event is a leaf of the consent log's signed tree head of size "
            f"{head.tree_size} (root {head.root_hash.hex()})"
        )
    else:
        click.echo("note: this bundle's format carries no tree proof", err=True)
    if report.later_head is not None:
        click.echo(
            f"the later signed tree head of size {report.later_head.tree_size} is consistent "
            "with it: the log still holds every exported event"
        )
    if report.proven_head is not None and not report.log_key_given:
        click.echo(
            "note: the tree head was checked with the log key inside the manifest; pass "
            "--log-key with GET /api/consent-log/key to check it is the log's",
            err=True,
        )
    if not report.key_given:
        click.echo(
            "note: checked with the key inside the manifest; pass --public-key with the key "
            "from the staff console to check who signed it",
            err=True,
        )


def _later_head(head_file: Path | None, proof_file: Path | None) -> LaterHead | None:
    if head_file is None and proof_file is None:
        return None
    if head_file is None or proof_file is None:
        raise click.UsageError("--tree-head and --consistency go together")
    try:
        head = merkle.TreeHead.from_json(receipt_check.load(head_file.read_bytes()))
    except (ValueError, receipt_check.ReceiptError) as error:
        raise click.BadParameter(
            f"not a signed tree head ({error})", param_hint="--tree-head"
        ) from None
    try:
        proof = merkle.ConsistencyProof.from_json(receipt_check.load(proof_file.read_bytes()))
    except (ValueError, receipt_check.ReceiptError) as error:
        raise click.BadParameter(
            f"not a consistency proof ({error})", param_hint="--consistency"
        ) from None
    return LaterHead(head, proof)


def register(portal_cli: AppGroup) -> None:
    portal_cli.add_command(export_command)
    portal_cli.add_command(verify_export_command)


if __name__ == "__main__":
    verify_export_command()
