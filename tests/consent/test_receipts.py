"""Consent receipts: downloaded from the preference centre, checked offline.

Checked three ways: by ``portal.consent.receipt_check`` (what ``portal verify-receipt``
runs), by the standalone ``tools/verify_receipt.py`` in a separate Python process with
nothing of the portal importable, and by the server's own Merkle code
(``portal.consent.merkle``), which shares nothing with the checker.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portal.config import generate_signing_key
from portal.consent import merkle, receipt_check, tree
from portal.consent.receipt_check import ReceiptError, signed_bytes, verify_receipt
from portal.db import db
from tests.conftest import CONSENT_LOG_SIGNING_KEY
from tests.helpers import save_choices

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "verify_receipt.py"
LOG_KEY = tree.signing_key(CONSENT_LOG_SIGNING_KEY)
LOG_KEY_B64 = base64.b64encode(merkle.public_key_bytes(LOG_KEY.public_key())).decode()


def _save(client, checked, visible=("security-alerts", "order-updates", "weekly-digest", "offers")):
    page = client.get("/preferences")
    saved = save_choices(client, page.text, visible=list(visible), topics=list(checked))
    assert saved.status_code == 303
    return client.get(saved.headers["Location"])


def _receipt(client) -> dict:
    response = client.get("/preferences/receipt")
    assert response.status_code == 200, response.text
    assert response.mimetype == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["Content-Disposition"].startswith(
        'attachment; filename="consent-receipt-'
    )
    return json.loads(response.get_data())


@pytest.fixture
def receipt(client, subscribed) -> dict:
    _save(client, ["offers", "security-alerts"])
    _save(client, ["security-alerts"])  # offers: on, then off again (withdrawn)
    return _receipt(client)


def test_after_a_save_the_page_offers_the_receipt(client, subscribed):
    page = client.get("/preferences")
    assert "Download a receipt of your choices" in page.text  # on demand, always
    after = _save(client, ["offers"])
    banner = after.text.split('class="banner banner--success"', 1)[1].split("</div>", 1)[0]
    assert "Your choices are saved." in banner
    assert 'href="/preferences/receipt"' in banner  # and beside the saved message


def test_the_receipt_states_each_choice_with_its_event(app, receipt):
    assert receipt["format"] == "push-consent-portal/consent-receipt/1"
    assert receipt["signature_algorithm"] == "Ed25519"
    assert receipt["log_key"] == LOG_KEY_B64
    purposes = {p["purpose_id"]: p for p in receipt["purposes"]}
    assert purposes["offers"]["state"] == "withdrawn"
    assert purposes["offers"]["on"] is False
    assert purposes["offers"]["consent_type"] == "explicit"
    assert purposes["offers"]["policy_version"] == "v1"
    assert purposes["offers"]["source"] == "preference-centre"
    # Never chosen: no event, and says why it is on or off.
    assert purposes["weekly-digest"]["state"] == "not_given"
    assert purposes["weekly-digest"]["event_seq"] is None
    assert purposes["security-alerts"]["basis"] == "transactional_grant"
    assert purposes["security-alerts"]["on"] is True
    (notice,) = receipt["notices"]
    assert notice["policy_version"] == "v1"
    assert notice["url"].endswith("/policy/v1")
    with app.app_context():
        from portal.consent import catalogue

        assert notice["sha256"] == catalogue.policy(db.session, "v1").text_sha256
    # Every explicit choice's event, with its inclusion proof against the signed head.
    (event,) = receipt["events"]
    fields = json.loads(event["event"])
    assert fields["seq"] == purposes["offers"]["event_seq"] == event["leaf_index"] + 1
    assert fields["new_state"] == "opt_out" and fields["previous_state"] == "opt_in"
    head = merkle.TreeHead.from_json(receipt["tree_head"])
    merkle.verify_tree_head(LOG_KEY.public_key(), head)
    merkle.verify_inclusion(
        merkle.leaf_hash(event["event"].encode()),
        leaf_index=event["leaf_index"],
        tree_size=head.tree_size,
        audit_path=[base64.b64decode(h) for h in event["audit_path"]],
        root_hash=head.root_hash,
    )
    # The same proof the public API gives for that leaf.
    proof = app.test_client().get(
        "/api/consent-log/inclusion",
        query_string={"leaf": event["leaf_hash"], "size": head.tree_size},
    )
    assert proof.json == {"leaf_index": event["leaf_index"], "audit_path": event["audit_path"]}
    assert verify_receipt(receipt, LOG_KEY.public_key())["events"] == 1


def test_the_receipt_reveals_nothing_about_anyone_else(app, client, subscribed, subscriptions):
    other = app.test_client()
    sub = subscriptions()
    assert (
        other.post("/api/push/subscribe", json={"subscription": sub.to_json()}).status_code == 201
    )
    _save(other, ["offers", "weekly-digest"])
    _save(client, ["offers"])
    mine = _receipt(client)
    text = json.dumps(mine)
    with app.app_context():
        from portal.subscriptions.models import PushSubscription

        theirs = [row.subscriber_id for row in db.session.query(PushSubscription).all()]
    person = mine["pii_principal"]["subscriber_id"]
    assert {str(s) for s in theirs} - {person}
    for someone in {str(s) for s in theirs} - {person}:
        assert someone not in text
    assert sub.endpoint not in text
    for event in mine["events"]:
        assert json.loads(event["event"])["subscriber_id"] == person


def test_a_visitor_without_choices_gets_no_receipt(client, catalogue_ready):
    response = client.get("/preferences/receipt")
    assert response.status_code == 403
    assert "Download a receipt" not in response.text


def test_a_receipt_waits_for_an_event_the_log_cannot_take_yet(app, client, subscribed, monkeypatch):
    """An earlier number still open (a write in flight) holds the tree back: the receipt
    is refused for now with Retry-After, not issued without its proof."""
    _save(client, ["offers"])
    from portal.consent import receipts

    def stuck(*args, **kwargs):
        raise receipts.NotYetInTheLog("waiting")

    monkeypatch.setattr(receipts, "_head_covering", stuck)
    response = client.get("/preferences/receipt")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "2"
    assert "Your receipt is nearly ready" in response.text


def test_the_receipt_command_and_the_standalone_tool_agree(app, receipt, tmp_path):
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    result = app.test_cli_runner().invoke(
        args=["portal", "verify-receipt", str(path), "--log-key", LOG_KEY_B64]
    )
    assert result.exit_code == 0, result.output
    assert "OK: 4 choices, 1 events proven" in result.output
    # The standalone file, in a process where the portal cannot be imported.
    isolated = tmp_path / "elsewhere"
    isolated.mkdir()
    tool = isolated / "verify_receipt.py"
    tool.write_bytes(TOOL.read_bytes())
    key_file = isolated / "key.json"
    key_file.write_text(app.test_client().get("/api/consent-log/key").get_data(as_text=True))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-I", str(tool), str(path), "--log-key", str(key_file)],
        cwd=isolated,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "OK: 4 choices, 1 events proven" in run.stdout
    # One byte changed: refused, naming what failed.
    receipt["purposes"][0]["purpose"] += "!"
    path.write_text(json.dumps(receipt))
    run = subprocess.run(
        [sys.executable, "-I", str(tool), str(path)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 1
    assert "the receipt's signature does not verify with the log key" in run.stderr


def test_the_tool_is_the_checker_the_portal_runs():
    """tools/verify_receipt.py is portal/consent/receipt_check.py, byte for byte: one
    implementation, two ways to get it."""
    assert TOOL.read_bytes() == Path(receipt_check.__file__).read_bytes()


def _resigned(receipt: dict, change, key: ed25519.Ed25519PrivateKey = LOG_KEY) -> dict:
    forged = copy.deepcopy(receipt)
    change(forged)
    forged.pop("signature")
    forged["signature"] = base64.b64encode(key.sign(signed_bytes(forged))).decode()
    return forged


def _refusal(receipt: dict, key=None) -> str:
    with pytest.raises(ReceiptError) as caught:
        verify_receipt(receipt, key)
    return str(caught.value)


def test_a_forged_signature_another_key_or_another_head_is_refused(receipt):
    forged = copy.deepcopy(receipt)
    signature = bytearray(base64.b64decode(forged["signature"]))
    signature[10] ^= 4
    forged["signature"] = base64.b64encode(bytes(signature)).decode()
    assert "the receipt's signature does not verify" in _refusal(forged)

    other = ed25519.Ed25519PrivateKey.from_private_bytes(
        base64.urlsafe_b64decode(generate_signing_key() + "=")
    )
    assert "another log key" in _refusal(receipt, other.public_key())
    # Signed by someone else, naming their own key: the receipt is intact, but the given
    # log key says it is not the log's.
    impostor = _resigned(
        receipt,
        lambda r: r.update(
            log_key=base64.b64encode(merkle.public_key_bytes(other.public_key())).decode()
        ),
        other,
    )
    assert "another log key" in _refusal(impostor, LOG_KEY.public_key())
    # Without the log key it is only self-consistent: said so, never "the log's".
    assert verify_receipt(impostor)["key_given"] is False
    # Naming a head key of its own too: the head's signature does not verify with it.
    head_too = _resigned(impostor, lambda r: r.update(tree_head_key=r["log_key"]), other)
    assert "tree head's signature does not verify" in _refusal(head_too)

    # A proof against another head: a real, signed head of another size.
    head = merkle.TreeHead.from_json(receipt["tree_head"])
    later = merkle.sign_tree_head(
        LOG_KEY, tree_size=head.tree_size + 1, timestamp=head.timestamp, root_hash=head.root_hash
    )
    moved = _resigned(receipt, lambda r: r.update(tree_head=later.to_json()))
    assert "audit path" in _refusal(moved)
    rooted = merkle.sign_tree_head(
        LOG_KEY, tree_size=head.tree_size, timestamp=head.timestamp, root_hash=b"\7" * 32
    )
    other_root = _resigned(receipt, lambda r: r.update(tree_head=rooted.to_json()))
    assert "does not lead to the tree head's root" in _refusal(other_root)


def test_a_re_signed_receipt_that_lies_about_a_choice_is_refused(receipt):
    """Even with the log key (the operator), a receipt cannot say what the log does not."""

    def offers(r):
        return next(p for p in r["purposes"] if p["purpose_id"] == "offers")

    said_given = _resigned(receipt, lambda r: offers(r).update(state="given", on=True))
    assert "state 'given', the event says 'withdrawn'" in _refusal(said_given)
    other_notice = _resigned(receipt, lambda r: offers(r).update(policy_version="v2"))
    assert "policy_version 'v2', the event says 'v1'" in _refusal(other_notice)
    no_event = _resigned(receipt, lambda r: offers(r).update(event_seq=None))
    assert "must be not_given" in _refusal(no_event)

    def edit_event(r):
        fields = json.loads(r["events"][0]["event"])
        fields["new_state"] = "opt_in"
        r["events"][0]["event"] = json.dumps(fields, sort_keys=True, separators=(",", ":"))

    assert "leaf_hash is not the hash of the event" in _refusal(_resigned(receipt, edit_event))

    def rehash(r):
        edit_event(r)
        r["events"][0]["leaf_hash"] = base64.b64encode(
            merkle.leaf_hash(r["events"][0]["event"].encode())
        ).decode()

    assert "does not lead to the tree head's root" in _refusal(_resigned(receipt, rehash))
    dropped = _resigned(receipt, lambda r: r.update(events=[]))
    assert "is not among the receipt's events" in _refusal(dropped)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_any_one_byte_changed_in_the_file_is_refused(receipt, tmp_path_factory, data):
    """The downloaded file, one byte changed anywhere: refused, or unreadable — never
    accepted (whitespace between JSON tokens aside: the signature covers the content)."""
    raw = json.dumps(receipt, indent=2, sort_keys=True).encode()
    offset = data.draw(st.integers(0, len(raw) - 1), label="offset")
    if raw[offset : offset + 1] in (b" ", b"\n"):
        return
    mask = data.draw(st.integers(1, 255), label="mask")
    changed = raw[:offset] + bytes([raw[offset] ^ mask]) + raw[offset + 1 :]
    try:
        document = json.loads(changed)
    except (ValueError, UnicodeDecodeError):
        return
    if document == receipt:
        return  # an escape spelled another way: the same content
    with pytest.raises(ReceiptError):
        verify_receipt(document)


def test_a_later_head_shows_the_receipts_choices_were_not_rewritten(app, client, receipt, tmp_path):
    """A year on, the person checks the log still holds the tree their receipt is under:
    a later head and a consistency proof from the public API, checked by the standalone
    tool."""
    _save(client, ["offers"])  # the log grows
    _receipt(client)  # (integrates it)
    api = app.test_client()
    later = api.get("/api/consent-log/tree-head").json
    size = receipt["tree_head"]["tree_size"]
    assert later["tree_size"] > size
    proof = api.get(f"/api/consent-log/consistency?from={size}&to={later['tree_size']}").json
    files = {"receipt": receipt, "later": later, "proof": proof}
    for name, document in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    args = [
        "portal",
        "verify-receipt",
        str(tmp_path / "receipt.json"),
        "--log-key",
        LOG_KEY_B64,
        "--tree-head",
        str(tmp_path / "later.json"),
        "--consistency",
        str(tmp_path / "proof.json"),
    ]
    result = app.test_cli_runner().invoke(args=args)
    assert result.exit_code == 0, result.output
    assert f"the later signed tree head of size {later['tree_size']} is consistent" in (
        result.output
    )
    # History rewritten: a head over other leaves, signed with the log's own key.
    forged = merkle.sign_tree_head(
        LOG_KEY, tree_size=later["tree_size"], timestamp=later["timestamp"], root_hash=b"\5" * 32
    )
    (tmp_path / "later.json").write_text(json.dumps(forged.to_json()))
    result = app.test_cli_runner().invoke(args=args)
    assert result.exit_code == 1
    assert "does not extend the receipt's tree" in result.output
    # Only one of the pair: a usage error.
    assert app.test_cli_runner().invoke(args=args[:-2]).exit_code == 2


def test_after_a_change_of_the_log_key_both_keys_check_a_receipt_and_a_later_head(
    app, client, receipt, tmp_path, capsys
):
    """A receipt from before the log's key changed, a later head signed by the new key:
    the checker trusts both keys (given once each) and checks each signature with the
    key that made it; one key alone is refused, saying which to add."""
    new_key = generate_signing_key()
    portal = app.extensions["portal"]
    portal.settings = portal.settings.with_overrides(consent_log_signing_key=new_key)
    _save(client, ["offers"])  # the log grows
    _receipt(client)  # (integrates it, under the new key)
    api = app.test_client()
    later = api.get("/api/consent-log/tree-head").json
    size = receipt["tree_head"]["tree_size"]
    proof = api.get(f"/api/consent-log/consistency?from={size}&to={later['tree_size']}").json
    for name, document in {"receipt": receipt, "later": later, "proof": proof}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    new_b64 = base64.b64encode(
        merkle.public_key_bytes(tree.signing_key(new_key).public_key())
    ).decode()
    assert api.get("/api/consent-log/key").json["key"] == new_b64
    pair = [
        "--tree-head",
        str(tmp_path / "later.json"),
        "--consistency",
        str(tmp_path / "proof.json"),
    ]

    def check(*words: str) -> tuple[int, str]:
        status = receipt_check.main([str(tmp_path / "receipt.json"), *words])
        captured = capsys.readouterr()
        return status, captured.out + captured.err

    status, output = check("--log-key", LOG_KEY_B64, "--log-key", new_b64, *pair)
    assert status == 0, output
    assert f"the later signed tree head of size {later['tree_size']} is consistent" in output
    assert check("--log-key", new_b64, "--log-key", LOG_KEY_B64, *pair)[0] == 0
    status, output = check("--log-key", new_b64, *pair)
    assert status == 1
    assert (
        "the receipt names another log key than the one given (if the log's key changed "
        "since the receipt, pass the earlier key with --log-key too)"
    ) in output
    for words in (["--log-key", LOG_KEY_B64], []):
        status, output = check(*words, *pair)
        assert status == 1
        assert "pass both keys with --log-key" in output
    stranger = base64.b64encode(
        merkle.public_key_bytes(tree.signing_key(generate_signing_key()).public_key())
    ).decode()
    status, output = check("--log-key", LOG_KEY_B64, "--log-key", stranger, *pair)
    assert status == 1
    assert "verifies with none of the log keys given" in output
    # The portal's command passes every key on.
    args = ["portal", "verify-receipt", str(tmp_path / "receipt.json")]
    both = ["--log-key", LOG_KEY_B64, "--log-key", new_b64, *pair]
    result = app.test_cli_runner().invoke(args=[*args, *both])
    assert result.exit_code == 0, result.output
    assert app.test_cli_runner().invoke(args=[*args, "--log-key", new_b64]).exit_code == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.data())
def test_the_checkers_consistency_rule_agrees_with_the_servers(n, data):
    """The standalone checker's RFC 9162 §2.1.4.2 against portal.consent.merkle's: the
    same proofs accepted, the same changes refused."""
    m = data.draw(st.integers(1, n))
    log_tree = merkle.MemoryTree(merkle.leaf_hash(b"%d" % i) for i in range(n))
    first, second = log_tree.root(m), log_tree.root(n)
    proof = log_tree.consistency_proof(m, n)
    assert receipt_check.consistency_roots(m, n, first, proof) == (first, second)
    if proof:
        which = data.draw(st.integers(0, len(proof) - 1))
        changed = [*proof[:which], bytes(32), *proof[which + 1 :]]
        try:
            roots = receipt_check.consistency_roots(m, n, first, changed)
        except ReceiptError:
            roots = None
        assert roots != (first, second)


def test_the_checkers_command_line(receipt, tmp_path, capsys):
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    main = receipt_check.main
    assert main(["--help"]) == 0
    assert "usage: verify_receipt.py RECEIPT.json" in capsys.readouterr().out
    assert main([str(path), f"--log-key={LOG_KEY_B64}"]) == 0
    assert " OK: " in capsys.readouterr().out
    for words in ([], [str(path), "--colour"], [str(path), str(path)], [str(path), "--log-key"]):
        assert main(words) == 2, words
        assert "usage: verify_receipt.py" in capsys.readouterr().err
    assert main([str(path), "--tree-head", str(path)]) == 2
    assert "go together" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json")]) == 2
    assert main([str(path), "--log-key", "not base64!"]) == 2
    (tmp_path / "deep.json").write_text("[" * 100_000)
    assert main([str(tmp_path / "deep.json")]) == 2


def _offers(r):
    return next(p for p in r["purposes"] if p["purpose_id"] == "offers")


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda r: _offers(r).update(state="refused"), "state 'refused', the event says"),
        (lambda r: _offers(r).update(on=True), "on True, the event says False"),
        (lambda r: _offers(r).update(source="subscribe-page"), "source 'subscribe-page'"),
        (lambda r: _offers(r).update(recorded_at="2020-01-01T00:00:00.000000Z"), "recorded_at"),
        (lambda r: _offers(r).update(event_seq=True), "event_seq is not a whole number"),
        (lambda r: _offers(r).update(topic_id=float(_offers(r)["topic_id"])), "topic_id"),
        (lambda r: r["events"][0].update(seq=r["events"][0]["seq"] + 1), "is not the event's own"),
        (lambda r: r["notices"][0].update(policy_version=[]), "policy_version is not text"),
        (lambda r: r["purposes"].append(copy.deepcopy(_offers(r))), "each topic is one purpose"),
        (
            lambda r: r["purposes"].append(
                {**copy.deepcopy(_offers(r)), "purpose_id": "other", "topic_id": 999}
            ),
            "named by another purpose too",
        ),
        (lambda r: r.update(tree_head_key="AAAA"), "tree_head_key is 3 bytes"),
        (lambda r: r.update(purposes="many"), "purposes is not a list"),
    ],
)
def test_the_checker_refuses_what_the_log_does_not_say(receipt, change, refusal):
    """The review's cases: an operator (holding the log key) re-signing a receipt that
    says more, or other, than the events it cites."""
    assert refusal in _refusal(_resigned(receipt, change))


def test_a_key_given_twice_anywhere_is_refused(receipt, tmp_path):
    """A second "purposes" before the real one would show a person one thing and a
    checker another: refused wherever a key is repeated."""
    text = json.dumps(receipt, indent=2)
    forged = text.replace(
        '{\n  "collection_method"', '{\n  "purposes": [],\n  "collection_method"', 1
    )
    assert forged != text
    path = tmp_path / "forged.json"
    path.write_text(forged)
    assert receipt_check.main([str(path), "--log-key", LOG_KEY_B64]) == 2
    with pytest.raises(ReceiptError, match="given twice"):
        receipt_check.load('{"a": {"b": 1, "b": 2}}')


def test_an_empty_log_key_is_an_error_not_a_fallback(receipt, tmp_path, capsys):
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    assert receipt_check.main([str(path), "--log-key", ""]) == 2
    assert receipt_check.main([str(path), "--log-key="]) == 2
    assert receipt_check.main([str(path)]) == 0
    assert "NOT checked against the log's published key" in capsys.readouterr().out


def test_the_ok_line_lists_what_was_proven(receipt, tmp_path, capsys):
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    assert receipt_check.main([str(path), "--log-key", LOG_KEY_B64]) == 0
    out = capsys.readouterr().out
    topic = {p["purpose_id"]: p["topic_id"] for p in receipt["purposes"]}
    # The topic's number beside its name: the log records the number, the name is the
    # portal's word.
    assert f"  offers (topic {topic['offers']}): withdrawn at " in out
    assert f"  weekly-digest (topic {topic['weekly-digest']}): not_given" in out


def _respelled(value: str) -> str:
    """The same bytes in another base64 spelling: a spare bit of the last character set."""
    assert value.endswith("=")
    last = value.rstrip("=")[-1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    other = alphabet[alphabet.index(last) ^ 1]
    respelled = value.rstrip("=")[:-1] + other + "=" * (len(value) - len(value.rstrip("=")))
    assert respelled != value and base64.b64decode(respelled) == base64.b64decode(value)
    return respelled


def test_a_value_in_another_base64_spelling_is_refused(receipt, tmp_path):
    """The signature cannot cover its own spelling: without one spelling per value, a
    character of the file could change (the signature's last) and the file still check."""
    respelled = copy.deepcopy(receipt)
    respelled["signature"] = _respelled(receipt["signature"])
    assert "signature is not base64 in its one standard spelling" in _refusal(respelled)
    path = tmp_path / "respelled.json"
    path.write_text(json.dumps(respelled))
    run = subprocess.run(
        [sys.executable, "-I", str(TOOL), str(path), "--log-key", LOG_KEY_B64],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert "not base64 in its one standard spelling" in run.stderr
    # And any other base64 value, under a valid signature (the operator re-signing).
    path_hash = _resigned(
        receipt,
        lambda r: r["events"][0]["audit_path"].__setitem__(
            0, _respelled(r["events"][0]["audit_path"][0])
        ),
    )
    assert "audit_path[0] is not base64 in its one standard spelling" in _refusal(path_hash)


@pytest.mark.parametrize("field", ["policy_version", "consent_timestamp", "recorded_at", "source"])
def test_a_choice_without_an_event_claims_nothing_an_event_would(receipt, field):
    """A topic never chosen (not_given) cites no notice, time or source: nothing that no
    proof stands behind, so a re-signed receipt cannot date a choice that was never made."""
    value = {"policy_version": "v1", "source": "preference-centre"}.get(
        field, "2020-01-01T00:00:00.000000Z"
    )

    def claim(r):
        next(p for p in r["purposes"] if p["purpose_id"] == "weekly-digest")[field] = value

    assert f"{field} {value!r}, but it names no event" in _refusal(_resigned(receipt, claim))


def test_help_is_asked_for_only_as_an_option(receipt, tmp_path, capsys):
    """``--log-key -h`` gives "-h" as the key (refused), it does not print help and exit 0
    without checking anything."""
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    assert receipt_check.main([str(path), "--log-key", "-h"]) == 2
    assert receipt_check.main([str(path), "--log-key=--help"]) == 2
    assert "usage:" not in capsys.readouterr().out
    assert receipt_check.main(["-h"]) == 0
    assert receipt_check.main([str(path), "--help"]) == 0
    assert "usage: verify_receipt.py RECEIPT.json" in capsys.readouterr().out


def test_a_receipt_after_the_log_key_changed_still_checks(app, client, subscribed):
    """The head was signed by the earlier key; the receipt, signed by the new one, names
    it as tree_head_key."""
    _save(client, ["offers"])
    first = _receipt(client)
    new_key = generate_signing_key()
    portal = app.extensions["portal"]
    portal.settings = portal.settings.with_overrides(consent_log_signing_key=new_key)
    second = _receipt(client)
    new_public = tree.signing_key(new_key).public_key()
    assert second["tree_head"] == first["tree_head"]  # no new event: the same head
    assert second["tree_head_key"] == LOG_KEY_B64 != second["log_key"]
    proven = verify_receipt(second, new_public)
    assert proven["head_key"] == LOG_KEY_B64
    with pytest.raises(ReceiptError, match="another log key"):
        verify_receipt(second, LOG_KEY.public_key())


def test_the_notice_url_comes_from_public_url_not_the_host_header(app, client, subscribed):
    portal = app.extensions["portal"]
    portal.settings = portal.settings.with_overrides(public_url="https://portal.example.com")
    _save(client, ["offers"])
    # The request's own Host (the test client's "localhost") is not what is signed.
    response = client.get("/preferences/receipt")
    document = json.loads(response.get_data())
    assert document["notices"][0]["url"] == "https://portal.example.com/policy/v1"
    assert document["controller"]["url"] == "https://portal.example.com"


def test_head_builds_nothing(app, client, subscribed):
    _save(client, ["offers"])
    with app.app_context():
        before = tree.latest_head(db.session)
    response = client.head("/preferences/receipt")
    assert response.status_code == 200
    assert response.get_data() == b""
    with app.app_context():
        assert tree.latest_head(db.session) == before


def test_receipts_are_rate_limited_per_person(app, client, subscribed, subscriptions, clock):
    """Each receipt is signed and carries proofs: a loop on the link gets 429 with
    Retry-After past RATE_LIMIT_RECEIPTS a window, one person's loop never another's."""
    portal = app.extensions["portal"]
    limits = dataclasses.replace(portal.settings.rate_limit, receipts=3, window_seconds=60)
    portal.settings = dataclasses.replace(portal.settings, rate_limit=limits)
    _save(client, ["offers"])
    clock.advance(seconds=60 - clock.now().timestamp() % 60)  # the start of a window
    client.head("/preferences/receipt")  # a look at the link is not a receipt
    for _ in range(3):
        _receipt(client)
    refused = client.get("/preferences/receipt")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "60"
    assert refused.headers["Cache-Control"] == "no-store"
    assert "Too many receipts at once" in refused.text
    assert "you can download a receipt again in 1 minute" in refused.text
    assert "BEGIN" not in refused.text and "audit_path" not in refused.text

    other = app.test_client()
    sub = subscriptions()
    assert (
        other.post("/api/push/subscribe", json={"subscription": sub.to_json()}).status_code == 201
    )
    _save(other, ["offers"])
    _receipt(other)  # someone else is not held back

    clock.advance(seconds=30)
    assert client.get("/preferences/receipt").headers["Retry-After"] == "30"
    clock.advance(seconds=29)
    last = client.get("/preferences/receipt")
    assert last.headers["Retry-After"] == "1"
    assert "you can download a receipt again in 1 second." in last.text
    clock.advance(seconds=1)  # a new window
    _receipt(client)
