"""The look-up's search service: by short reference, account ID prefix, erasure receipt ID
and the exact IDs, paginated in a stable order, refusing what it cannot run."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from portal.compliance import services
from portal.compliance.services import Match, SearchRefused, search_subscribers
from portal.consent import log
from portal.consent.models import EventKind
from portal.db import db, uuid7
from portal.retention.services import (
    erase_subscriber,
    erasure_by_receipt_id,
    parse_receipt_id,
    receipt_id,
)
from portal.staff.models import StaffUser
from portal.subscriptions import reference
from tests.factories import make_subscriber
from tests.helpers import all_rows


def _search(app, query, page=1):
    with db.begin(app) as session:
        return search_subscribers(session, query, page, actor=None)


def _refused(app, query, page=1) -> SearchRefused:
    with pytest.raises(SearchRefused) as refused, db.begin(app) as session:
        search_subscribers(session, query, page, actor=None)
    return refused.value


@pytest.fixture
def accounts(app):
    """57 accounts acct-001 … acct-057, and a few that only look alike."""
    with db.begin(app) as session:
        ids = {f"acct-{n:03d}": make_subscriber(session, f"acct-{n:03d}").id for n in range(1, 58)}
        for other in ("ACCT-999", "account-1", "xacct-001"):
            make_subscriber(session, other)
    return ids


def test_a_reference_finds_its_person_however_it_is_typed(app):
    with db.begin(app) as session:
        person = make_subscriber(session, "acct-1")
        make_subscriber(session, "acct-2")
        given = reference.reference_for(session, person.id, draw=lambda: "K70M31PA")
    assert given == "K70M31PA"
    for typed in ("K70M-31PA", "k70m31pa", " k7om 3ipa ", "K7OM-3LPA"):
        found = _search(app, typed)
        assert [(f.subscriber_id, f.matched) for f in found.results] == [
            (person.id, (Match.REFERENCE,))
        ]
        assert found.results[0].reference == "K70M-31PA"


def test_an_account_id_prefix_pages_through_everyone_in_a_stable_order(app, accounts):
    pages = [_search(app, "acct-", page) for page in (1, 2, 3)]
    assert [p.total for p in pages] == [57, 57, 57]
    assert [(p.first, p.last, p.pages) for p in pages] == [(1, 20, 3), (21, 40, 3), (41, 57, 3)]
    assert [(p.previous_page, p.next_page) for p in pages] == [(None, 2), (1, 3), (2, None)]
    seen = [f.external_user_id for p in pages for f in p.results]
    assert seen == sorted(accounts)  # each once, in account ID order, none left out
    assert {f.matched for p in pages for f in p.results} == {(Match.ACCOUNT_PREFIX,)}
    assert [f.external_user_id for f in _search(app, "acct-", 2).results] == seen[20:40]


def test_a_broad_start_lists_the_first_matches_and_says_that_more_match(
    app, engine, accounts, monkeypatch
):
    monkeypatch.setattr(services, "PREFIX_LISTED", 25)
    with db.begin(app) as session:
        make_subscriber(session, "acct-")  # the text itself is an account: listed first
    pages = [_search(app, "acct-", page) for page in (1, 2)]
    assert [(p.total, p.more, p.pages) for p in pages] == [(26, True, 2), (26, True, 2)]
    assert [(p.first, p.last) for p in pages] == [(1, 20), (21, 26)]
    seen = [f.external_user_id for p in pages for f in p.results]
    assert seen == ["acct-", *sorted(accounts)[:25]]  # the exact one, then the first 25
    assert pages[0].results[0].matched == (Match.ACCOUNT_ID,)
    refused = _refused(app, "acct-", 3)
    assert (refused.status, refused.message) == (404, "There is no page 3: this search has 2 pages")
    # Narrowed below the cap, all of them and no "more".
    narrowed = _search(app, "acct-05")
    assert (narrowed.total, narrowed.more, narrowed.pages) == (8, False, 1)
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == "consent.looked_up"]
    details = [
        json.loads(r["detail"]) if isinstance(r["detail"], str) else r["detail"] for r in rows
    ]
    assert details[:2] == [
        {"by": "search", "found": 26, "page": 1, "more": True},
        {"by": "search", "found": 26, "page": 2, "more": True},
    ]


def test_a_start_at_the_cap_says_nothing_more(app, accounts, monkeypatch):
    monkeypatch.setattr(services, "PREFIX_LISTED", 57)
    found = _search(app, "acct-", 3)
    assert (found.total, found.more, found.last) == (57, False, 57)
    monkeypatch.setattr(services, "PREFIX_LISTED", 56)
    found = _search(app, "acct-", 3)
    assert (found.total, found.more, found.last) == (56, True, 56)
    assert found.results[-1].external_user_id == "acct-056"


def test_an_exact_account_id_comes_first(app, accounts):
    found = _search(app, "acct-05")
    assert found.total == 8  # acct-05 is no account; acct-050 … acct-057 start with it
    with db.begin(app) as session:
        make_subscriber(session, "acct-05")
    found = _search(app, "acct-05")
    assert [f.external_user_id for f in found.results][:2] == ["acct-05", "acct-050"]
    assert found.results[0].matched == (Match.ACCOUNT_ID,)


def test_a_prefix_keeps_its_case(app, accounts):
    assert [f.external_user_id for f in _search(app, "ACCT").results] == ["ACCT-999"]
    assert _search(app, "Acct").total == 0


@pytest.mark.parametrize(
    ("query", "expected"),
    [("50%", ["50%off"]), ("a_b", ["a_b1"]), ("x\\y", ["x\\y1"]), ("%%%", []), ("___", [])],
)
def test_like_wildcards_match_only_themselves(app, query, expected):
    with db.begin(app) as session:
        for account in ("50%off", "50xoff", "500ff", "a_b1", "axb1", "x\\y1", "xy1", "abc"):
            make_subscriber(session, account)
    assert [f.external_user_id for f in _search(app, query).results] == expected


def test_a_short_search_is_only_an_exact_account_id(app):
    with db.begin(app) as session:
        short = make_subscriber(session, "42").id
        make_subscriber(session, "420")
    assert [f.subscriber_id for f in _search(app, "42").results] == [short]
    refused = _refused(app, "ab")
    assert refused.status == 422
    assert "type at least 3 characters" in refused.message


def test_a_subscriber_id_finds_them(app, accounts):
    wanted = accounts["acct-007"]
    found = _search(app, str(wanted).upper())
    assert [(f.subscriber_id, f.matched) for f in found.results] == [
        (wanted, (Match.SUBSCRIBER_ID,))
    ]


def test_an_erasure_receipt_id_finds_the_erased_person(app, clock):
    with db.begin(app) as session:
        person = make_subscriber(session, "acct-1")
        given = reference.reference_for(session, person.id)
        receipt = erase_subscriber(session, person.id, now=clock.now())
    rid = receipt.receipt_id
    assert rid == receipt_id(receipt.event_seq, receipt.event_hash)
    assert rid.startswith(f"ER-{receipt.event_seq}-")
    for typed in (rid, rid.lower(), rid.replace("-", " "), f"  {rid}  "):
        found = _search(app, typed)
        assert [(f.subscriber_id, f.matched) for f in found.results] == [
            (person.id, (Match.RECEIPT,))
        ]
        assert found.results[0].erased_at == clock.now()
    # Erasure took the account ID and the reference with it.
    assert _search(app, "acct-1").total == 0
    assert _search(app, given).total == 0
    assert _search(app, str(person.id)).total == 1


def test_a_receipt_id_with_a_wrong_check_names_nobody(app, clock):
    with db.begin(app) as session:
        person = make_subscriber(session, "acct-1")
        receipt = erase_subscriber(session, person.id, now=clock.now())
        live = make_subscriber(session, "acct-2")
    wrong = "0" if receipt.event_hash[0] != "0" else "1"
    assert _search(app, f"ER-{receipt.event_seq}-{wrong}{receipt.event_hash[1:8]}").total == 0
    # Another event's number with this check is no erasure either.
    assert _search(app, f"ER-{receipt.event_seq + 1}-{receipt.event_hash[:8]}").total == 0
    assert live is not None


def test_receipt_ids_parse_leniently():
    assert parse_receipt_id("ER-12-3FA9C2D1") == (12, "3fa9c2d1")
    assert parse_receipt_id("er 12 3fa9c2d1") == (12, "3fa9c2d1")
    assert parse_receipt_id("ER12-3FA9C2DI") == (12, "3fa9c2d1")
    for bad in ("ER-12", "12-3fa9c2d1", "ER-x-3fa9c2d1", "ER-12-3fa9", "ER-١٢-3fa9c2d1"):
        assert parse_receipt_id(bad) is None


@pytest.mark.parametrize(
    ("query", "page", "status", "words"),
    [
        ("", 1, 422, "Enter a reference"),
        ("   ", 1, 422, "Enter a reference"),
        ("x" * 256, 1, 422, "at most 255 characters"),
        ("https://fcm.googleapis.com/fcm/send/abc", 1, 422, "use the endpoint form"),
        ("acct\x00-1", 1, 422, "must not contain control characters"),
        ("acct-", 0, 400, "whole number"),
        ("acct-", -1, 400, "whole number"),
        ("acct-", 10**9, 400, "whole number"),
        ("acct-", 4, 404, "There is no page 4: this search has 3 pages"),
        ("nobody-here", 2, 404, "There is no page 2: this search has 1 page"),
    ],
)
def test_what_the_search_refuses(app, accounts, query, page, status, words):
    refused = _refused(app, query, page)
    assert (refused.status, words in refused.message) == (status, True)


@pytest.mark.parametrize("text", ["abc", "0", "-1", "1.5", "1e3", "١", "9999999", " 2", "+2"])
def test_a_page_is_a_plain_whole_number(text):
    with pytest.raises(SearchRefused) as refused:
        services.parse_page(text)
    assert refused.value.status == 400


def test_pages_that_parse():
    assert [services.parse_page(t) for t in (None, "", "1", "2", "999999")] == [1, 1, 1, 2, 999999]


def test_a_search_is_audited_without_its_value_and_a_refusal_is_not(app, engine, accounts):
    with db.begin(app) as session:
        officer = session.scalars(sa.select(StaffUser).limit(1)).first()
    assert officer is None  # no staff here: the system searches
    _search(app, "acct-02", 1)
    _refused(app, "ab")
    _refused(app, "acct-", 9)
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == "consent.looked_up"]
    assert len(rows) == 1
    detail = rows[0]["detail"]
    detail = json.loads(detail) if isinstance(detail, str) else detail
    assert detail == {"by": "search", "found": 10, "page": 1}
    assert "acct-02" not in json.dumps(rows, default=str)


def test_a_receipt_id_from_before_the_tree_still_finds_the_erased_person(
    app, engine, clock, backend
):
    """A receipt issued while the log was a hash chain (before migration 0018) names the
    erased event's chain hash: it still finds the person; the leaf hash does too."""
    person = uuid7()
    fields = log.event_fields(
        seq=1,
        subscriber_id=person,
        subscription_id=None,
        topic_id=None,
        kind=EventKind.ERASED.value,
        previous_state=None,
        new_state="erased",
        source="preference-centre",
        policy_version=None,
        decided_at=clock.now(),
        recorded_at=clock.now(),
        actor="subscriber",
        context="{}",
    )
    chained = log.chain_hash(log.GENESIS, fields)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(log._t),
            [
                {
                    **fields,
                    "subscriber_id": person,
                    "decided_at": clock.now(),
                    "recorded_at": clock.now(),
                    "prev_hash": log.GENESIS,
                    "hash": chained,
                }
            ],
        )
        if backend == "postgresql":
            conn.execute(sa.text("SELECT setval('consent_event_seq', 1)"))
    with app.app_context():
        (row,) = db.session.execute(sa.select(log._t)).all()
        leaf = log.event_leaf_hash(row).hex()
        for check in (chained.hex(), leaf):
            assert erasure_by_receipt_id(db.session, receipt_id(1, check)) == person
        wrong = "0" if leaf[0] != "0" and chained.hex()[0] != "0" else "f"
        assert erasure_by_receipt_id(db.session, f"ER-1-{wrong}{leaf[1:8]}") is None
