"""The consent log's sequencer: leaves in seq order, gaps closed, heads signed, no leaf
lost or doubled when a run dies; the public proofs, held against pymerkle."""

from __future__ import annotations

import base64
import datetime as dt
import re
import threading
import uuid
from dataclasses import replace

import pymerkle
import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portal.config import generate_signing_key
from portal.consent import jobs, log, merkle, tree
from portal.consent.models import EventKind
from portal.db import db, uuid7
from portal.seams import current_portal
from portal.subscriptions.models import Subscriber
from tests.api.guard import is_error_shape
from tests.helpers import count_rows, sent_statements, sequence


def _subscriber(app, clock) -> uuid.UUID:
    with db.begin(app) as session:
        subscriber = Subscriber(id=uuid7(), created_at=clock.now())
        session.add(subscriber)
    return subscriber.id


def _event(who: uuid.UUID, clock, actor: str = "system") -> log.NewEvent:
    return log.NewEvent(
        kind=EventKind.ACCOUNT_LINKED,
        subscriber_id=who,
        source="system",
        actor=actor,
        recorded_at=clock.now(),
    )


def _append(app, clock, who, count=1) -> list[int]:
    with db.begin(app) as session:
        return log.append_many(session, [_event(who, clock) for _ in range(count)])


def _insert_at(engine, seq: int, who: uuid.UUID, clock) -> None:
    """An event committed with an explicit seq: a late writer (or a hole left before it)."""
    with engine.begin() as conn:
        conn.execute(
            sa.insert(log._t).values(
                seq=seq,
                subscriber_id=who,
                kind=EventKind.ACCOUNT_LINKED.value,
                source="system",
                actor="late",
                decided_at=clock.now(),
                recorded_at=clock.now(),
                context="{}",
            )
        )


def _leaves(engine) -> list[bytes]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(log._t).order_by(log._t.c.seq)).all()
    return [log.event_leaf_hash(row) for row in rows]


def _public_key(app) -> ed25519.Ed25519PublicKey:
    return tree.signing_key(current_portal(app).settings.consent_log_signing_key).public_key()


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


@pytest.mark.parametrize("count", [1, 2, 9])
def test_events_appended_together_are_one_insert_numbered_in_the_order_given(
    app, engine, clock, count
):
    """However many events one call appends, one INSERT writes them (on PostgreSQL: the
    rows sorted by their place before the sequence numbers them), and the numbers rise in
    the order the events were given: a topic decided twice in one save is two steps of
    one chain, in that order."""
    who = _subscriber(app, clock)
    _append(app, clock, who, 3)  # numbers taken before: the call's are not the first
    events = [_event(who, clock, actor=f"step-{place}") for place in range(count)]
    inserting = re.compile(r"\s*INSERT INTO consent_event")
    with sent_statements(engine, inserting) as inserts, db.begin(app) as session:
        seqs = log.append_many(session, events)
    if engine.dialect.name == "postgresql":
        assert len(inserts) == 1
    assert seqs == sorted(seqs) and len(set(seqs)) == count and seqs[0] > 3
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(log._t.c.seq, log._t.c.actor)
            .where(log._t.c.actor.like("step-%"))
            .order_by(log._t.c.seq)
        ).all()
    assert [tuple(row) for row in stored] == [
        (seq, f"step-{place}") for place, seq in enumerate(seqs)
    ]


@pytest.mark.parametrize("count", [1, 3])
def test_an_append_binds_times_as_their_column_does(app, engine, clock, count):
    """The append is sent as the driver's text (log._driver_text): its values still go
    through the columns' types. An aware time in another zone is stored as the same
    instant; a naive one is refused and nothing is written."""
    who = _subscriber(app, clock)
    east = dt.timezone(dt.timedelta(hours=2))
    at = dt.datetime(2026, 5, 1, 14, 30, tzinfo=east)
    events = [
        log.NewEvent(
            kind=EventKind.ACCOUNT_LINKED,
            subscriber_id=who,
            source="system",
            actor=f"zoned-{place}",
            recorded_at=at,
            decided_at=at - dt.timedelta(minutes=1),
        )
        for place in range(count)
    ]
    with db.begin(app) as session:
        seqs = log.append_many(session, events)
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(log._t.c.recorded_at, log._t.c.decided_at).where(log._t.c.seq.in_(seqs))
        ).all()
    assert len(stored) == count
    for recorded, decided in stored:
        assert recorded == at and recorded.utcoffset() == dt.timedelta(0)
        assert decided == at - dt.timedelta(minutes=1)

    naive = [replace(event, recorded_at=at.replace(tzinfo=None)) for event in events]
    # SQLite's append goes through the unit of work, which wraps the ValueError.
    with db.session_factory(app)() as session, session.begin():
        log.lock_subscriber(session, who)
        with pytest.raises((ValueError, sa.exc.StatementError), match="naive datetime"):
            log.append_many(session, naive)
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(sa.func.count()).where(log._t.c.subscriber_id == who)
            ).scalar_one()
            == count
        )


def test_committed_events_become_leaves_in_seq_order_under_a_signed_head(app, engine, clock):
    who = _subscriber(app, clock)
    first = sequence(app)
    assert (first.before, first.after) == (0, 0)
    assert first.head is not None and first.head.root_hash == merkle.EMPTY_ROOT
    _append(app, clock, who, 7)
    clock.advance(seconds=1)
    result = sequence(app)
    assert (result.before, result.after) == (0, 7)
    head = result.head
    assert head is not None and head.tree_size == 7
    merkle.verify_tree_head(_public_key(app), head)
    assert head.root_hash == merkle.root_from_leaf_hashes(_leaves(engine))
    # Nothing new: no new head, nothing stored twice.
    nodes = count_rows(engine, "consent_log_node")
    again = sequence(app)
    assert again.leaves == 0 and again.head is None
    assert count_rows(engine, "consent_log_node") == nodes
    with engine.connect() as conn:
        report = tree.verify_log(conn, log_keys=[_public_key(app)])
    assert report.ok and report.head == head


def test_a_hole_waits_for_its_grace_period_then_is_closed_by_a_gap_event(app, engine, clock):
    """seq 3 is missing (its transaction rolled back) while 4 and 5 are committed: the tree
    stops at 2, then after the grace period a gap event takes 3 and all is integrated."""
    who = _subscriber(app, clock)
    _append(app, clock, who, 2)
    _insert_at(engine, 4, who, clock)
    _insert_at(engine, 5, who, clock)
    waiting = sequence(app)
    assert waiting.after == 2 and waiting.waiting_on == 3
    clock.advance(seconds=current_portal(app).settings.consent_log_gap_grace_seconds - 1)
    assert sequence(app).after == 2  # still inside the grace period
    clock.advance(seconds=2)
    closed = sequence(app)
    assert closed.gaps_closed == [3]
    assert closed.after == 5 and closed.waiting_on is None
    with engine.connect() as conn:
        gap = conn.execute(sa.select(log._t).where(log._t.c.seq == 3)).one()
        report = tree.verify_log(conn, log_keys=[_public_key(app)])
    assert gap.kind == "gap" and gap.subscriber_id == tree.GAP_SUBSCRIBER
    assert report.ok, report.problem
    assert report.head.tree_size == 5  # the gap is a leaf: never hidden
    # The writer that held seq 3 can no longer commit it.
    with pytest.raises(sa.exc.IntegrityError):
        _insert_at(engine, 3, who, clock)


def test_an_event_committed_late_inside_the_grace_period_takes_its_place(app, engine, clock):
    who = _subscriber(app, clock)
    _append(app, clock, who, 2)
    _insert_at(engine, 4, who, clock)
    assert sequence(app).waiting_on == 3
    clock.advance(seconds=1)
    _insert_at(engine, 3, who, clock)  # the slow transaction commits at last
    result = sequence(app)
    assert result.gaps_closed == [] and result.after == 4
    with engine.connect() as conn:
        kinds = conn.execute(sa.select(log._t.c.kind).order_by(log._t.c.seq)).scalars().all()
        assert tree.verify_log(conn).ok
    assert "gap" not in kinds
    assert result.head.root_hash == merkle.root_from_leaf_hashes(_leaves(engine))


def test_a_sequencer_that_dies_mid_integration_loses_and_doubles_nothing(
    app, engine, clock, monkeypatch
):
    """The nodes are written, then the run dies before COMMIT: it all rolls back, and the
    next run integrates every leaf exactly once."""
    who = _subscriber(app, clock)
    _append(app, clock, who, 9)

    def die(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(tree, "_sign", die)
    with pytest.raises(RuntimeError, match="killed"):
        sequence(app)
    assert count_rows(engine, "consent_log_node") == 0
    assert count_rows(engine, "consent_tree_head") == 0
    monkeypatch.undo()
    result = sequence(app)
    assert (result.before, result.after) == (0, 9)
    with engine.connect() as conn:
        leaf_rows = conn.execute(
            sa.select(sa.func.count()).select_from(tree._n).where(tree._n.c.level == 0)
        ).scalar_one()
        assert tree.verify_log(conn).ok
    assert leaf_rows == 9


def test_the_job_is_in_the_table_and_runs_every_second(app):
    from portal import jobs as table

    entry = table.find("consent-log-sequencer")
    assert entry.singleton
    assert entry.interval_seconds(current_portal(app).settings) == 1
    assert table.run_job(app, "consent-log-sequencer").name == "consent-log-sequencer"


def test_signed_heads_verify_only_with_the_log_key(app, engine, clock):
    _append(app, clock, _subscriber(app, clock), 3)
    head = sequence(app).head
    merkle.verify_tree_head(_public_key(app), head)
    other = tree.signing_key(generate_signing_key()).public_key()
    with pytest.raises(merkle.InvalidTreeHead):
        merkle.verify_tree_head(other, head)
    with engine.connect() as conn:
        report = tree.verify_log(conn, log_keys=[other])
    assert not report.ok and "signature does not verify" in str(report.problem)


# --- the public API ---------------------------------------------------------------------


def test_every_stored_node_is_the_root_of_its_leaves_across_insert_chunks(
    app, engine, clock, monkeypatch
):
    # PostgreSQL takes a run's nodes in chunks (tree._NODE_CHUNK): a chunk of 3 splits
    # 13 leaves' 23 complete subtrees over 8 statements, the last one short.
    monkeypatch.setattr(tree, "_NODE_CHUNK", 3)
    who = _subscriber(app, clock)
    _append(app, clock, who, 13)
    with sent_statements(engine) as statements:
        assert sequence(app).after == 13
    node_inserts = [text for text, _ in statements if "INSERT INTO consent_log_node" in text]
    assert len(node_inserts) == (8 if engine.dialect.name == "postgresql" else 1)
    leaves = _leaves(engine)
    with engine.connect() as conn:
        stored = conn.execute(sa.select(tree._n).order_by(tree._n.c.level, tree._n.c.idx)).all()
    expected = [
        (level, idx)
        for level in range(4)
        for idx in range(13 >> level)  # the complete subtrees of 13 leaves: 13, 6, 3, 1
    ]
    assert [(row.level, row.idx) for row in stored] == expected
    for row in stored:
        width = 1 << row.level
        span = leaves[row.idx * width : (row.idx + 1) * width]
        assert bytes(row.hash) == merkle.root_from_leaf_hashes(span), (row.level, row.idx)


def _filled(app, clock, count: int) -> list[bytes]:
    who = _subscriber(app, clock)
    _append(app, clock, who, count)
    sequence(app)
    return _leaves(app.extensions["portal.db"].engine)


def test_the_api_serves_heads_and_proofs_that_verify_and_match_pymerkle(app, client, clock):
    leaves = _filled(app, clock, 5)
    first = client.get("/api/consent-log/tree-head").json
    _append(app, clock, _subscriber(app, clock), 8)
    clock.advance(seconds=2)
    sequence(app)
    leaves = _leaves(app.extensions["portal.db"].engine)
    key = merkle.parse_log_key(client.get("/api/consent-log/key").json)
    latest = client.get("/api/consent-log/tree-head")
    assert latest.status_code == 200 and latest.headers["Cache-Control"] == "no-cache"
    head = merkle.TreeHead.from_json(latest.json)
    merkle.verify_tree_head(key, head)
    assert head.tree_size == 13
    archived = merkle.TreeHead.from_json(client.get("/api/consent-log/tree-head/5").json)
    assert archived == merkle.TreeHead.from_json(first)
    merkle.verify_tree_head(key, archived)

    # pymerkle, an independent implementation, over the same leaf data.
    with app.extensions["portal.db"].engine.connect() as conn:
        rows = conn.execute(sa.select(log._t).order_by(log._t.c.seq)).all()
    reference = pymerkle.InmemoryTree.init_from_entries(
        [log.canonical(log.row_fields(row)) for row in rows],
        algorithm="sha256",
        disable_security=False,
    )
    assert reference.get_root(13) == head.root_hash
    assert reference.get_root(5) == archived.root_hash

    for index in (0, 4, 12):
        answer = client.get(
            "/api/consent-log/inclusion",
            query_string={"leaf": _b64(leaves[index]), "size": 13},
        )
        assert answer.status_code == 200, answer.json
        proof = merkle.InclusionProof.from_json(answer.json)
        assert proof.leaf_index == index
        merkle.verify_inclusion(
            leaves[index],
            leaf_index=index,
            tree_size=13,
            audit_path=proof.audit_path,
            root_hash=head.root_hash,
        )
        theirs = reference.prove_inclusion(index + 1, 13)
        # pymerkle's path starts with the leaf's own hash; RFC 9162's audit path does not.
        assert theirs.path[0] == leaves[index]
        assert list(theirs.path[1:]) == list(proof.audit_path)
        pymerkle.verify_inclusion(leaves[index], head.root_hash, theirs)
    answer = client.get("/api/consent-log/consistency", query_string={"from": 5, "to": 13})
    proof = merkle.ConsistencyProof.from_json(answer.json)
    merkle.verify_consistency(
        first=5,
        second=13,
        first_root=archived.root_hash,
        second_root=head.root_hash,
        proof=proof.consistency,
    )
    # The same leaf hash by hex and base64url, too.
    for spelling in (leaves[3].hex(), base64.urlsafe_b64encode(leaves[3]).decode().rstrip("=")):
        answer = client.get(
            "/api/consent-log/inclusion", query_string={"leaf": spelling, "size": 13}
        )
        assert answer.json["leaf_index"] == 3


@pytest.mark.parametrize(
    ("url", "status", "code"),
    [
        ("/api/consent-log/tree-head/abc", 400, "invalid_parameter"),
        ("/api/consent-log/tree-head/-1", 400, "invalid_parameter"),
        ("/api/consent-log/tree-head/99999999999999999999", 400, "invalid_parameter"),
        ("/api/consent-log/tree-head/4", 404, "unknown_tree_size"),
        # A valid size (at most 2^64 - 1) past what the database's BIGINT holds.
        ("/api/consent-log/tree-head/18446744073709551615", 404, "unknown_tree_size"),
        ("/api/consent-log/consistency?from=1&to=18446744073709551615", 404, "unknown_tree_size"),
        ("/api/consent-log/consistency?from=0&to=3", 400, "invalid_parameter"),
        ("/api/consent-log/consistency?from=3&to=2", 400, "invalid_parameter"),
        ("/api/consent-log/consistency?from=1", 400, "invalid_parameter"),
        ("/api/consent-log/consistency?from=1&to=x", 400, "invalid_parameter"),
        ("/api/consent-log/consistency?from=1&to=4", 404, "unknown_tree_size"),
        ("/api/consent-log/inclusion?size=3", 400, "invalid_parameter"),
        ("/api/consent-log/inclusion?leaf=zz&size=3", 400, "invalid_parameter"),
        ("/api/consent-log/inclusion?leaf=" + "00" * 31 + "&size=3", 400, "invalid_parameter"),
        ("/api/consent-log/inclusion?leaf=" + "00" * 32 + "&size=0", 400, "invalid_parameter"),
        ("/api/consent-log/inclusion?leaf=" + "00" * 32 + "&size=3", 404, "unknown_leaf"),
        ("/api/consent-log/inclusion?leaf=" + "00" * 32 + "&size=9", 404, "unknown_tree_size"),
        # Given twice: no one answer (the first was served, and cached for a day).
        ("/api/consent-log/consistency?from=1&to=3&to=2", 400, "invalid_parameter"),
        ("/api/consent-log/consistency?from=1&from=2&to=3", 400, "invalid_parameter"),
        (
            "/api/consent-log/inclusion?leaf=" + "00" * 32 + "&size=3&size=9",
            400,
            "invalid_parameter",
        ),
        # A control character: named like any other bad parameter, as the API documents.
        ("/api/consent-log/tree-head/%00", 400, "invalid_parameter"),
        ("/api/consent-log/tree-head/3%0A", 400, "invalid_parameter"),
        ("/api/consent-log/consistency?from=1&to=%00", 400, "invalid_parameter"),
        ("/api/consent-log/inclusion?leaf=%01&size=3", 400, "invalid_parameter"),
        ("/api/consent-log/inclusion?size=3&%00=1", 400, "invalid_parameter"),
        ("/api/consent-log/inclusion?size=3&=%00", 400, "invalid_parameter"),
        ("/api/consent-log/tree-head/" + "0" * 5000 + "4", 404, "unknown_tree_size"),
        (
            "/api/consent-log/tree-head/" + "0" * 20 + "99999999999999999999",
            400,
            "invalid_parameter",
        ),
    ],
)
def test_bad_parameters_are_a_clear_4xx(app, client, clock, url, status, code):
    _filled(app, clock, 3)
    answer = client.get(url)
    assert answer.status_code == status, answer.text
    assert answer.json["error"]["code"] == code
    assert is_error_shape(answer.json)  # a field, when named, is a name


def test_a_parameter_given_twice_is_refused_whatever_its_first_value(app, client, clock):
    """Read as its first value, ``?from=1&to=3&to=2`` was answered (and cached for a day)
    with the proof to 3, though the URL asks for 2 as well."""
    _filled(app, clock, 3)
    for url in (
        "/api/consent-log/consistency?from=1&to=3&to=3",
        "/api/consent-log/consistency?to=3&from=1&from=1",
    ):
        answer = client.get(url)
        assert answer.status_code == 400, answer.text
        assert answer.json["error"]["field"] in {"from", "to"}
        assert (
            "Cache-Control" not in answer.headers
            or "immutable" not in answer.headers["Cache-Control"]
        )


def test_sizes_with_leading_zeros_are_the_same_size(app, client, clock):
    _filled(app, clock, 3)
    plain = client.get("/api/consent-log/tree-head/3")
    for spelling in ("03", "0" * 40 + "3", "0" * 5000 + "3"):
        padded = client.get(f"/api/consent-log/tree-head/{spelling}")
        assert padded.status_code == 200, padded.text
        assert padded.json == plain.json
    proof = client.get("/api/consent-log/consistency?from=001&to=0003")
    assert proof.status_code == 200
    assert proof.json == client.get("/api/consent-log/consistency?from=1&to=3").json


def test_a_base64_plus_sent_as_it_is_reads_as_a_plus(app, client, clock):
    """In a query string an unescaped '+' arrives as a space: a leaf hash copied into a
    URL by hand (standard base64, '+' and all) is still found."""
    who = _subscriber(app, clock)
    for _ in range(60):  # each leaf's base64 holds a '+' with odds of about one in two
        _append(app, clock, who, 1)
        sequence(app)
        leaves = _leaves(app.extensions["portal.db"].engine)
        with_plus = [(i, leaf) for i, leaf in enumerate(leaves) if "+" in _b64(leaf)]
        if with_plus:
            break
    index, leaf = with_plus[0]
    size = len(leaves)
    raw = f"/api/consent-log/inclusion?size={size}&leaf={_b64(leaf)}"  # '+' unescaped
    answer = client.get(raw)
    assert answer.status_code == 200, answer.text
    assert answer.json["leaf_index"] == index
    escaped = client.get(
        "/api/consent-log/inclusion", query_string={"leaf": _b64(leaf), "size": size}
    )
    assert escaped.json == answer.json


def test_a_leaf_beyond_the_size_asked_is_not_found(app, client, clock):
    """Knowing one leaf hash gets its proof and nothing else: not in an older tree that did
    not hold it, and no other event's content (proofs are hashes only)."""
    leaves = _filled(app, clock, 4)
    _append(app, clock, _subscriber(app, clock), 1)
    clock.advance(seconds=1)
    sequence(app)
    leaves = _leaves(app.extensions["portal.db"].engine)
    newest = _b64(leaves[4])
    assert (
        client.get(
            "/api/consent-log/inclusion", query_string={"leaf": newest, "size": 4}
        ).status_code
        == 404
    )
    answer = client.get("/api/consent-log/inclusion", query_string={"leaf": newest, "size": 5})
    assert set(answer.json) == {"leaf_index", "audit_path"}


@pytest.mark.parametrize(
    "url",
    [
        "/api/consent-log/tree-head",
        "/api/consent-log/tree-head/3",
        "/api/consent-log/consistency?from=1&to=3",
        "/api/consent-log/key",
        "/api/consent-log/tree-head/abc",  # an error is readable too
        "/api/consent-log/tree-head/99",
    ],
)
def test_an_auditors_page_on_another_origin_may_read_the_evidence(app, client, clock, url):
    """As docs/api.md says: public, no cookies, cross-origin allowed."""
    _filled(app, clock, 3)
    origin = {"Origin": "https://auditor.example"}
    answer = client.get(url, headers=origin)
    assert answer.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in answer.headers
    assert "Set-Cookie" not in answer.headers
    preflight = client.options(url, headers=origin | {"Access-Control-Request-Method": "GET"})
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert "GET" in preflight.headers["Access-Control-Allow-Methods"]


def test_the_rest_of_the_api_is_not_opened_to_other_origins(client):
    answer = client.get("/api/push/vapid-public-key", headers={"Origin": "https://a.example"})
    assert "Access-Control-Allow-Origin" not in answer.headers


def test_no_head_yet_is_a_404(client):
    answer = client.get("/api/consent-log/tree-head")
    assert answer.status_code == 404
    assert answer.json["error"]["code"] == "no_tree_head"


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    data=st.data(),
)
def test_every_proof_between_heads_verifies(app, client, clock, batches, data):
    """Random appends, a sequencer run after each batch: every archived head is consistent
    with every later one, and every leaf's inclusion proof verifies against every head."""
    who = _subscriber(app, clock)
    for count in batches:
        _append(app, clock, who, count)
        clock.advance(seconds=1)
        sequence(app)
    engine = app.extensions["portal.db"].engine
    leaves = _leaves(engine)
    with engine.connect() as conn:
        sizes = conn.execute(sa.select(tree._h.c.tree_size)).scalars().all()
    heads = {
        size: merkle.TreeHead.from_json(client.get(f"/api/consent-log/tree-head/{size}").json)
        for size in sizes
    }
    n = max(sizes)
    # The database outlives one example: draw positions, not sizes that depend on it.
    m = 1 + data.draw(st.integers(0, 10**6)) % n
    later = sorted(s for s in sizes if s >= m)
    second = later[data.draw(st.integers(0, 10**6)) % len(later)]
    proof = client.get("/api/consent-log/consistency", query_string={"from": m, "to": second})
    merkle.verify_consistency(
        first=m,
        second=second,
        first_root=merkle.root_from_leaf_hashes(leaves[:m]),
        second_root=heads[second].root_hash,
        proof=merkle.ConsistencyProof.from_json(proof.json).consistency,
    )
    index = data.draw(st.integers(0, 10**6)) % second
    answer = client.get(
        "/api/consent-log/inclusion", query_string={"leaf": _b64(leaves[index]), "size": second}
    )
    path = merkle.InclusionProof.from_json(answer.json).audit_path
    merkle.verify_inclusion(
        leaves[index],
        leaf_index=index,
        tree_size=second,
        audit_path=path,
        root_hash=heads[second].root_hash,
    )
    # Any change to the leaf is caught.
    with pytest.raises(merkle.InvalidProof):
        merkle.verify_inclusion(
            bytes([leaves[index][0] ^ 1]) + leaves[index][1:],
            leaf_index=index,
            tree_size=second,
            audit_path=path,
            root_hash=heads[second].root_hash,
        )


# --- PostgreSQL: real sequence numbers, real rollbacks, concurrency ----------------------


@pytest.mark.postgres_only
def test_a_rolled_back_append_is_a_gap_and_an_open_one_is_waited_for(app, engine, clock):
    who = _subscriber(app, clock)
    _append(app, clock, who, 1)
    rolled_back = db.session_factory(app)()
    rolled_back.begin()
    assert log.append_many(rolled_back, [_event(who, clock)]) == [2]
    rolled_back.rollback()  # the request failed: seq 2 is a hole
    rolled_back.close()
    _append(app, clock, who, 1)  # seq 3
    # seq 4 held by a transaction that stays open.
    factory = db.session_factory(app)
    open_session = factory()
    open_session.begin()
    (held,) = log.append_many(open_session, [_event(who, clock, actor="slow")])
    assert held == 4
    _append(app, clock, who, 1)  # seq 5
    try:
        assert sequence(app).waiting_on == 2
        clock.advance(seconds=60)
        result = sequence(app)
        assert result.gaps_closed == [2]
        assert result.after == 3 and result.waiting_on == 4  # seq 4 is in flight
        clock.advance(seconds=60)
        still = sequence(app)  # the close times out on the open transaction's row
        assert still.gaps_closed == [] and still.after == 3
        open_session.commit()
    finally:
        open_session.close()
    done = sequence(app)
    assert done.after == 5
    with engine.connect() as conn:
        rows = conn.execute(sa.select(log._t.c.seq, log._t.c.kind, log._t.c.actor)).all()
        assert tree.verify_log(conn, log_keys=[_public_key(app)]).ok
    by_seq = {row.seq: row for row in rows}
    assert by_seq[2].kind == "gap" and by_seq[4].actor == "slow"


def _sequencer_process(database_url: str, instance: str, key: str, stop: str) -> None:
    """A sequencer in its own process, integrating as fast as it can until ``stop`` exists
    (or five minutes have passed)."""
    import time
    from pathlib import Path

    from portal import create_app
    from portal.consent.jobs import sequence_once
    from tests.conftest import make_settings

    app = create_app(
        make_settings(
            database_url, instance, consent_log_signing_key=key, consent_log_gap_grace_seconds=1
        )
    )
    end = time.monotonic() + 300
    while time.monotonic() < end and not Path(stop).exists():
        sequence_once(app)
        time.sleep(0.01)
    app.extensions["portal.db"].engine.dispose()


@pytest.mark.postgres_only
def test_fifty_writers_and_three_sequencers_make_a_gap_free_tree_of_exactly_the_events(
    app, engine, clock, database_url, tmp_path
):
    """50 writer threads (a tenth of their transactions roll back) and 3 sequencer
    processes, one of them killed half-way and replaced: the tree's leaves are exactly the
    committed events plus a gap event per rolled-back number, none lost, none twice."""
    import multiprocessing
    import os
    import signal
    import time

    key = current_portal(app).settings.consent_log_signing_key
    people = [_subscriber(app, clock) for _ in range(50)]
    spawn = multiprocessing.get_context("spawn")

    def start() -> multiprocessing.Process:
        process = spawn.Process(
            target=_sequencer_process,
            args=(database_url, str(tmp_path / "seq"), key, str(tmp_path / "stop")),
        )
        process.start()
        return process

    sequencers = [start() for _ in range(3)]
    committed: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(50)
    failures: list[BaseException] = []

    def write(index: int) -> None:
        barrier.wait()
        try:
            for round_ in range(20):
                try:
                    with db.begin(app) as session:
                        log.lock_subscriber(session, people[index])
                        seqs = log.append_many(session, [_event(people[index], clock)])
                        if (index + round_) % 10 == 0:
                            raise KeyError("roll back")
                    with lock:
                        committed.extend(seqs)
                except KeyError:
                    pass
        except BaseException as error:
            failures.append(error)

    writers = [threading.Thread(target=write, args=(i,)) for i in range(50)]
    for thread in writers:
        thread.start()
    time.sleep(1.0)
    os.kill(sequencers[0].pid, signal.SIGKILL)  # killed wherever it was
    sequencers[0].join()
    sequencers.append(start())
    for thread in writers:
        thread.join()
    assert failures == []
    # The writers are done: the sequencers close every rolled-back number once its grace
    # period (1 s) has passed, and integrate the rest.
    deadline = time.monotonic() + 120  # a loaded machine starts processes slowly
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            top = conn.execute(sa.text("SELECT max(seq) FROM consent_event")).scalar_one()
            size = conn.execute(sa.text("SELECT tree_size FROM consent_log_state")).scalar()
            conn.rollback()
            if size == top:
                break
            time.sleep(0.2)
    (tmp_path / "stop").touch()
    for process in sequencers[1:]:
        process.join(timeout=30)
        assert process.exitcode == 0
    with engine.connect() as conn:
        rows = conn.execute(sa.select(log._t.c.seq, log._t.c.kind).order_by(log._t.c.seq)).all()
        report = tree.verify_log(conn, log_keys=[_public_key(app)])
        leaf_count = conn.execute(
            sa.select(sa.func.count()).select_from(tree._n).where(tree._n.c.level == 0)
        ).scalar_one()
    assert report.ok, report.problem
    assert [row.seq for row in rows] == list(range(1, len(rows) + 1))  # gap-free
    events = sorted(row.seq for row in rows if row.kind != "gap")
    assert events == sorted(committed)  # exactly the committed events
    assert len(committed) == 50 * 20 - 100
    gaps = [row.seq for row in rows if row.kind == "gap"]
    # One per rolled-back number below the last committed one (a number rolled back after
    # it holds nothing up: no gap is needed until an event follows it).
    assert 0 < len(gaps) <= 100
    assert report.head.tree_size == leaf_count == len(rows)
    assert jobs.sequence_once  # what the processes ran


@pytest.mark.postgres_only
@pytest.mark.parametrize("locked", [1, 2, 3])
def test_lock_subscriber_holds_the_row_of_each_person_named_and_no_other(
    app, engine, clock, locked
):
    """One person (``=``) or several (``= ANY`` of one array, in id order): each named
    row is held until the transaction ends, others are free, and the statement's text is
    the same every time (nothing rendered per call)."""
    people = [_subscriber(app, clock) for _ in range(4)]
    named, free = people[:locked], people[locked:]
    selecting = re.compile(r"\s*SELECT subscriber\.id")
    texts = set()
    for _ in range(2):
        with sent_statements(engine, selecting) as sent, db.begin(app) as session:
            log.lock_subscriber(session, *reversed(named), None)
            with engine.connect() as other:

                def held(who: uuid.UUID) -> bool:
                    try:
                        with other.begin_nested():
                            other.execute(
                                sa.text(
                                    "SELECT id FROM subscriber WHERE id = :id FOR UPDATE NOWAIT"
                                ),
                                {"id": who},
                            )
                    except sa.exc.OperationalError:
                        return True
                    return False

                assert [held(who) for who in named] == [True] * locked
                assert [held(who) for who in free] == [False] * len(free)
                other.rollback()
        texts.update(statement for statement, _ in sent)
    assert len(texts) == 1
