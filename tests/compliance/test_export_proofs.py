"""An export proves its events are leaves of the consent log: the signed tree head it was
cut at (checked with the log's key), a subset proof from the exported leaf hashes to that
head's root, and, later, a consistency proof from that head to a newer one.

The attacks are a dishonest exporter's, who holds the export signing key and re-signs the
manifest after changing something: only the tree proof and the log key stand between
that and a passing bundle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from portal.compliance.export import PROOF_FILE, canonical, manifest_bytes
from portal.compliance.verify import verify_bundle
from portal.config import generate_signing_key
from portal.consent import merkle, receipt_check, tree
from portal.db import db
from tests.compliance.conftest import subscribe
from tests.compliance.test_export import KEY, _export, _verify
from tests.conftest import CONSENT_LOG_SIGNING_KEY


def _log_key_b64() -> str:
    return base64.b64encode(
        merkle.public_key_bytes(tree.signing_key(CONSENT_LOG_SIGNING_KEY).public_key())
    ).decode()


@pytest.fixture
def crowd(app, clock, subscriptions, person):
    """Nine more people after ``person``, so one person's events are a few scattered
    leaves of a larger tree."""
    return [subscribe(app, subscriptions) for _ in range(9)]


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _resign_manifest(bundle: Path, manifest: dict) -> None:
    manifest.pop("signature", None)
    manifest["signature"] = KEY.sign(canonical(manifest)).hex()
    (bundle / "manifest.json").write_bytes(manifest_bytes(manifest))


def _rewrite_lines(path: Path, change) -> list[str]:
    """Replace a file's lines with ``change(lines)``; return the new lines."""
    lines = change(path.read_text().splitlines())
    path.write_text("".join(line + "\n" for line in lines))
    return lines


def _rewrite_proof(bundle: Path, change) -> None:
    path = bundle / PROOF_FILE
    lines = _rewrite_lines(path, change)
    manifest = _manifest(bundle)
    manifest["tree_proof"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest["tree_proof"]["hashes"] = len(lines)
    _resign_manifest(bundle, manifest)


@pytest.fixture
def one_person(app, tmp_path, person, crowd) -> Path:
    out = tmp_path / "one"
    result = _export(app, out, "--subscriber", str(person.subscriber_id), "--format", "ndjson")
    assert result.exit_code == 0, result.output
    return out


def test_one_persons_scattered_events_are_proven_under_the_head(app, one_person, person):
    manifest = _manifest(one_person)
    assert manifest["format"] == "push-consent-portal/consent-export/3"
    with app.app_context():
        size = tree.latest_head(db.session).tree_size
    assert manifest["data"]["rows"] == 6  # their subscribe and two changes
    assert manifest["tree_head"]["tree_size"] == size == 6 + 9 * 4  # a subscribe is 4 events
    assert manifest["log_key"] == _log_key_b64()
    lines = (one_person / PROOF_FILE).read_text().splitlines()
    assert manifest["tree_proof"]["hashes"] == len(lines) > 0
    assert all(len(line) == 64 for line in lines)

    result = _verify(app, one_person, "--public-key", KEY.public.hex, "--log-key", _log_key_b64())
    assert result.exit_code == 0, result.output
    assert f"every event is a leaf of the consent log's signed tree head of size {size}" in (
        result.output
    )
    # The proof is what the tree gives: the root it leads to is the head's.
    rows = [
        json.loads(line) for line in (one_person / "consent-events.ndjson").read_text().splitlines()
    ]
    leaves = [(row["seq"] - 1, bytes.fromhex(row["leaf_hash"])) for row in rows]
    head = merkle.TreeHead.from_json(manifest["tree_head"])
    assert (
        merkle.root_from_subset_proof(leaves, [bytes.fromhex(x) for x in lines], size)
        == head.root_hash
    )


def test_the_log_key_file_from_the_api_is_accepted(app, one_person, tmp_path):
    key_file = tmp_path / "key.json"
    key_file.write_text(app.test_client().get("/api/consent-log/key").get_data(as_text=True))
    result = _verify(app, one_person, "--log-key", str(key_file))
    assert result.exit_code == 0, result.output
    assert "--log-key" not in result.output  # no note: the key was given


def test_another_log_key_is_named(app, one_person):
    other = ed25519.Ed25519PrivateKey.from_private_bytes(
        base64.urlsafe_b64decode(generate_signing_key() + "=")
    )
    other_b64 = base64.b64encode(merkle.public_key_bytes(other.public_key())).decode()
    result = _verify(app, one_person, "--log-key", other_b64)
    assert result.exit_code == 1
    assert "log key: the manifest names another consent log key" in result.output
    assert "tree head: the tree head's signature does not verify" in result.output
    assert _verify(app, one_person, "--log-key", "not a key").exit_code == 2


def test_a_changed_proof_hash_is_caught_even_when_re_signed(app, one_person):
    rng = random.Random(7)

    def flip(lines):
        which = rng.randrange(len(lines))
        digit = "0" if lines[which][5] != "0" else "1"
        lines[which] = lines[which][:5] + digit + lines[which][6:]
        return lines

    _rewrite_proof(one_person, flip)
    result = _verify(app, one_person)
    assert result.exit_code == 1
    assert f"FAILED {PROOF_FILE}: tree proof: the exported events are not proven leaves" in (
        result.output
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda lines: lines[:-1],  # one hash short
        lambda lines: [*lines, lines[0]],  # one too many
        lambda lines: list(reversed(lines)),
    ],
)
def test_a_shortened_lengthened_or_reordered_proof_is_caught(app, one_person, change):
    _rewrite_proof(one_person, change)
    assert _verify(app, one_person).exit_code == 1


def test_a_malformed_proof_line_is_named(app, one_person):
    _rewrite_proof(one_person, lambda lines: ["XYZ", *lines[1:]])
    result = _verify(app, one_person)
    assert result.exit_code == 1
    assert f"FAILED {PROOF_FILE}: format: line 1 is not 64 lowercase hex digits" in result.output


def test_a_dropped_event_is_caught_unless_the_proof_is_derived_again(app, one_person):
    """Leaving out one of a person's events and re-signing the manifest: the rows, their
    hashes and the first and last events still check; the bundle's tree proof does not.

    (The proof shows inclusion, not completeness: an exporter who derives a new proof for
    the rows left — it can, from the old proof and the leaf hashes — passes. What was left
    out shows only against the log: ``verify-log``, or the person's own receipt.)"""
    data = one_person / "consent-events.ndjson"
    lines = data.read_text().splitlines()
    del lines[2]  # the middle one: the first and last events stay as the manifest says
    data.write_text("".join(line + "\n" for line in lines))
    manifest = _manifest(one_person)
    manifest["data"]["sha256"] = hashlib.sha256(data.read_bytes()).hexdigest()
    manifest["data"]["bytes"] = data.stat().st_size
    manifest["data"]["rows"] = len(lines)
    _resign_manifest(one_person, manifest)
    report = verify_bundle(one_person)
    assert [(p.file, p.check) for p in report.problems] == [(PROOF_FILE, "tree proof")]


def test_a_forged_tree_head_is_caught(app, one_person):
    manifest = _manifest(one_person)
    signature = bytearray(base64.b64decode(manifest["tree_head"]["tree_head_signature"]))
    signature[0] ^= 1
    manifest["tree_head"]["tree_head_signature"] = base64.b64encode(bytes(signature)).decode()
    _resign_manifest(one_person, manifest)
    result = _verify(app, one_person, "--log-key", _log_key_b64())
    assert result.exit_code == 1
    assert "tree head: the tree head's signature does not verify with the log key" in (
        result.output
    )


def test_a_later_head_consistent_with_the_export_passes(app, one_person, subscriptions, tmp_path):
    """Saved with the bundle, a later head and a consistency proof (both from the public
    API) show the log still holds every exported event."""
    subscribe(app, subscriptions)  # four more events
    with db.begin(app) as session:
        tree.integrate(
            session,
            tree.signing_key(CONSENT_LOG_SIGNING_KEY),
            now=app.extensions["portal"].clock.now(),
            gap_grace_seconds=10,
        )
    client = app.test_client()
    head = tmp_path / "head.json"
    head.write_text(client.get("/api/consent-log/tree-head").get_data(as_text=True))
    size = _manifest(one_person)["tree_head"]["tree_size"]
    later = json.loads(head.read_text())["tree_size"]
    assert later == size + 4
    proof = tmp_path / "proof.json"
    proof.write_text(
        client.get(f"/api/consent-log/consistency?from={size}&to={later}").get_data(as_text=True)
    )
    args = ["--log-key", _log_key_b64(), "--tree-head", str(head), "--consistency", str(proof)]
    result = _verify(app, one_person, *args)
    assert result.exit_code == 0, result.output
    assert f"the later signed tree head of size {later} is consistent with it" in result.output

    # A log rewritten since: the operator signs a head over other history.
    key = tree.signing_key(CONSENT_LOG_SIGNING_KEY)
    forged = merkle.sign_tree_head(
        key,
        tree_size=later,
        timestamp=json.loads(head.read_text())["timestamp"],
        root_hash=b"\1" * 32,
    )
    head.write_text(json.dumps(forged.to_json()))
    result = _verify(app, one_person, *args)
    assert result.exit_code == 1
    assert f"later tree head: consistency: the log of size {later} does not extend" in (
        result.output
    )
    # Only one of the pair is a usage error.
    assert _verify(app, one_person, "--tree-head", str(head)).exit_code == 2


def _b64(key: ed25519.Ed25519PrivateKey) -> str:
    return base64.b64encode(merkle.public_key_bytes(key.public_key())).decode()


def test_after_a_change_of_the_log_key_both_keys_check_the_export_and_a_later_head(
    app, one_person, subscriptions, tmp_path
):
    """The export's head was signed by the first key, the later head by the one that
    replaced it: each head is checked with the key that signed it, among those the
    checker trusts; one key alone is refused, saying what to pass."""
    new_key = generate_signing_key()
    portal = app.extensions["portal"]
    portal.settings = portal.settings.with_overrides(consent_log_signing_key=new_key)
    subscribe(app, subscriptions)
    with db.begin(app) as session:
        tree.integrate(
            session, tree.signing_key(new_key), now=portal.clock.now(), gap_grace_seconds=10
        )
    client = app.test_client()
    assert client.get("/api/consent-log/key").get_json()["key"] == _b64(tree.signing_key(new_key))
    head = tmp_path / "head.json"
    head.write_text(client.get("/api/consent-log/tree-head").get_data(as_text=True))
    size = _manifest(one_person)["tree_head"]["tree_size"]
    later = json.loads(head.read_text())["tree_size"]
    proof = tmp_path / "proof.json"
    proof.write_text(
        client.get(f"/api/consent-log/consistency?from={size}&to={later}").get_data(as_text=True)
    )
    old_b64, new_b64 = _log_key_b64(), _b64(tree.signing_key(new_key))
    pair = ["--tree-head", str(head), "--consistency", str(proof)]

    both = _verify(app, one_person, "--log-key", old_b64, "--log-key", new_b64, *pair)
    assert both.exit_code == 0, both.output
    assert f"the later signed tree head of size {later} is consistent with it" in both.output
    assert "--log-key" not in both.output  # no note: the keys were given
    either_order = _verify(app, one_person, "--log-key", new_b64, "--log-key", old_b64, *pair)
    assert either_order.exit_code == 0, either_order.output

    only_new = _verify(app, one_person, "--log-key", new_b64, *pair)
    assert only_new.exit_code == 1
    assert (
        "log key: the manifest names another consent log key than the one given (if the "
        "log's key changed since the export, pass the earlier key with --log-key too)"
    ) in only_new.output
    only_old = _verify(app, one_person, "--log-key", old_b64, *pair)
    assert only_old.exit_code == 1
    assert "later tree head: signature:" in only_old.output
    assert "pass both keys with --log-key" in only_old.output
    none_given = _verify(app, one_person, *pair)
    assert none_given.exit_code == 1
    assert "pass both keys with --log-key" in none_given.output
    # A third key the checker trusts instead of the new one proves nothing.
    stranger = _b64(tree.signing_key(generate_signing_key()))
    wrong = _verify(app, one_person, "--log-key", old_b64, "--log-key", stranger, *pair)
    assert wrong.exit_code == 1
    assert "verifies with none of the log keys given" in wrong.output
    # The export alone still checks with its own key.
    assert _verify(app, one_person, "--log-key", old_b64).exit_code == 0


def test_an_export_of_the_whole_log_needs_no_proof_hashes(app, tmp_path, person, crowd):
    out = tmp_path / "all"
    assert _export(app, out).exit_code == 0
    manifest = _manifest(out)
    assert manifest["data"]["rows"] == 42
    assert manifest["tree_proof"]["hashes"] == 0
    assert (out / PROOF_FILE).read_bytes() == b""
    assert verify_bundle(out).proven_head is not None


def test_an_empty_export_has_an_empty_proof(app, tmp_path, person):
    out = tmp_path / "empty"
    result = app.test_cli_runner().invoke(
        args=["portal", "export", "--from", "2025-01-01", "--to", "2025-01-02", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert (out / PROOF_FILE).read_bytes() == b""
    assert _verify(app, out).exit_code == 0
    (out / PROOF_FILE).write_text("00" * 32 + "\n")
    manifest = _manifest(out)
    manifest["tree_proof"]["sha256"] = hashlib.sha256((out / PROOF_FILE).read_bytes()).hexdigest()
    _resign_manifest(out, manifest)
    result = _verify(app, out)
    assert result.exit_code == 1
    assert "the export has no events, the proof has hashes" in result.output


def test_a_proof_file_without_line_ends_is_read_a_line_at_a_time():
    """A crafted zip member that inflates to gigabytes on one line: refused after reading
    one line's worth, not read whole."""
    import io

    from portal.compliance import verify

    handle = io.BytesIO(b"a" * 10_000_000)
    with pytest.raises(verify._BadProofLine):
        list(verify._proof_hashes(handle))
    assert handle.tell() <= 66
    text = io.StringIO("x" * (verify.MAX_LINE * 3))
    with pytest.raises(ValueError, match="longer than"):
        list(verify._lines(text))
    assert text.tell() <= verify.MAX_LINE + 1


def test_an_empty_log_key_is_a_usage_error(app, one_person):
    assert _verify(app, one_person, "--log-key", "").exit_code == 2


def _rewrite_rows(bundle: Path, change) -> None:
    """Edit the data file's lines and re-sign the manifest, as whoever holds the export
    key could."""
    path = bundle / "consent-events.ndjson"
    _rewrite_lines(path, change)
    manifest = _manifest(bundle)
    manifest["data"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest["data"]["bytes"] = path.stat().st_size
    _resign_manifest(bundle, manifest)


def _edit_row(number: int, **values):
    def change(lines: list[str]) -> list[str]:
        row = json.loads(lines[number])
        row.update(values)
        lines[number] = json.dumps(row, separators=(",", ":"))
        return lines

    return change


@pytest.mark.parametrize(
    ("change", "named"),
    [
        # A number too large for any float: int() of it raised OverflowError.
        (
            lambda lines: [lines[0], lines[1].replace('"seq":2,', '"seq":1e999,', 1), *lines[2:]],
            "line 2: seq is not what the export writes",
        ),
        (_edit_row(1, subscriber_id=5), "line 2: subscriber_id is not what the export writes"),
        (_edit_row(1, seq=True), "line 2: seq is not what the export writes"),
        (_edit_row(1, topic_id="4"), "line 2: topic_id is not what the export writes"),
        (_edit_row(1, context=None), "line 2: context is not what the export writes"),
        # A time whose UTC form is past the calendar's end.
        (_edit_row(1, decided_at="9999-12-31T23:59:59-05:00"), "a value cannot be read"),
    ],
)
def test_a_crafted_row_is_refused_by_name_not_by_a_traceback(app, one_person, change, named):
    _rewrite_rows(one_person, change)
    result = _verify(app, one_person, "--public-key", KEY.public.hex)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # an answer, not an uncaught error
    assert named in result.output


def test_files_nested_too_deeply_are_refused(app, one_person, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    other = tmp_path / "head.json"
    other.write_text("{}")
    for option in ("--tree-head", "--consistency"):
        files = (deep, other) if option == "--tree-head" else (other, deep)
        result = _verify(
            app, one_person, "--tree-head", str(files[0]), "--consistency", str(files[1])
        )
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit)
    key = tmp_path / "key.json"
    key.write_text('{"key":' + "[" * 200_000 + "]" * 200_000 + "}")
    result = _verify(app, one_person, "--log-key", str(key))
    assert result.exit_code == 2 and "nested too deeply" in result.output


def test_a_later_head_or_proof_with_a_key_given_twice_is_refused(app, one_person, tmp_path):
    """As the receipt checker reads them: readers disagree on which copy of a repeated
    key counts, so one file could show a person one size and the checker another."""
    twice = tmp_path / "twice.json"
    twice.write_text('{"tree_size": 999, "tree_size": 5}')
    proof_twice = tmp_path / "proof-twice.json"
    proof_twice.write_text('{"consistency": [], "consistency": []}')
    head = tmp_path / "head.json"
    head.write_text(json.dumps(app.test_client().get("/api/consent-log/tree-head").json))
    for option, files in (("--tree-head", (twice, head)), ("--consistency", (head, proof_twice))):
        result = _verify(
            app, one_person, "--tree-head", str(files[0]), "--consistency", str(files[1])
        )
        assert result.exit_code == 2, result.output
        assert "given twice" in result.output and option in result.output


def test_a_format_the_tool_does_not_know_is_refused(app, one_person):
    """A bundle re-labelled with another format used to skip its tree proof and pass."""
    manifest = _manifest(one_person)
    manifest["format"] = "push-consent-portal/consent-export/999"
    _resign_manifest(one_person, manifest)
    result = _verify(app, one_person, "--public-key", KEY.public.hex)
    assert result.exit_code == 1
    assert "format 'push-consent-portal/consent-export/999' is not one this tool reads" in (
        result.output
    )


def test_the_log_key_reads_as_the_receipt_checker_reads_it(app, one_person, tmp_path):
    """One reading of --log-key for both checkers: standard base64 with its padding, or
    the key's JSON with no key given twice."""
    good = _log_key_b64()
    assert _verify(app, one_person, "--log-key", good).exit_code == 0
    duplicated = tmp_path / "twice.json"
    duplicated.write_text(f'{{"key": "{good}", "key": "{good}"}}')
    # The URL-safe alphabet ("-" and "_" where standard base64 has "+" and "/"): not read,
    # whatever key it would spell. (The log key is random: its own URL-safe spelling may
    # be the same string, hence the first two characters.)
    url_safe = "-_" + good[2:].replace("+", "-").replace("/", "_")
    for refused in (
        good.rstrip("="),  # no padding
        url_safe,  # the URL-safe alphabet
        f"!!{good} junk?",
        str(duplicated),
    ):
        result = _verify(app, one_person, "--log-key", refused)
        assert result.exit_code == 2, (refused, result.output)
        with pytest.raises(receipt_check.ReceiptError):
            receipt_check.parse_log_key(refused)
