"""The consent log: append-only at the database, a Merkle tree that finds tampering."""

from __future__ import annotations

import json
import threading
import time

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portal.consent import catalogue, log
from portal.consent.models import PreferenceState, TopicPreference
from portal.consent.preferences import Decision, apply_decisions, preference_rows
from portal.consent.tree import verify_chain
from portal.db import db, uuid7
from portal.identity import sign_assertion
from portal.seams import current_portal
from portal.subscriptions.models import Subscriber
from tests.helpers import (
    confirm_account_link,
    count_rows,
    csrf_token,
    sequence,
    stored_preferences,
)


def _subscriber(app, clock):
    with db.begin(app) as session:
        subscriber = Subscriber(id=uuid7(), created_at=clock.now())
        session.add(subscriber)
    return subscriber.id


def _decide(app, clock, subscriber_id, pairs):
    with db.begin(app) as session:
        topics = {t.slug: t for t in catalogue.active_topics(session)}
        return apply_decisions(
            session,
            subscriber_id,
            [Decision(topics[slug], PreferenceState(state)) for slug, state in pairs],
            source="preference-centre",
            policy_version="v1",
            decided_at=clock.now(),
            recorded_at=clock.now(),
        )


def _verify(engine, app=None):
    if app is not None:
        sequence(app)
    with engine.connect() as conn:
        return verify_chain(conn)


SLUGS = ["security-alerts", "order-updates", "weekly-digest", "offers"]
STATES = [s.value for s in PreferenceState]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.lists(
                st.tuples(st.sampled_from(SLUGS), st.sampled_from(STATES)),
                max_size=4,
                unique_by=lambda p: p[0],
            ),
        ),
        max_size=12,
    )
)
def test_current_state_is_the_fold_of_the_log(catalogue_ready, engine, clock, submissions):
    app = catalogue_ready
    subscribers = getattr(app, "_test_subscribers", None)
    if subscribers is None:
        subscribers = app._test_subscribers = [_subscriber(app, clock) for _ in range(3)]
    for who, pairs in submissions:
        clock.advance(seconds=1)
        _decide(app, clock, subscribers[who], pairs)

    with engine.connect() as conn:
        folded: dict[tuple, str] = {}
        for row in conn.execute(
            sa.text(
                "SELECT subscriber_id, topic_id, previous_state, new_state FROM consent_event WHERE kind = 'preference_changed' ORDER BY seq"
            )
        ):
            key = (str(row.subscriber_id), row.topic_id)
            assert (
                folded.get(key, "unset") == row.previous_state
            )  # every event starts where the last ended
            folded[key] = row.new_state
        table = {
            (str(r.subscriber_id), r.topic_id): r.state
            for r in conn.execute(
                sa.text("SELECT subscriber_id, topic_id, state FROM topic_preference")
            )
        }
    assert table == folded
    report = _verify(engine, app)
    assert report.ok, report.problem
    assert report.pending == 0


def test_only_real_transitions_are_logged(catalogue_ready, engine, clock):
    who = _subscriber(catalogue_ready, clock)
    assert len(_decide(catalogue_ready, clock, who, [("offers", "opt_in")])) == 1
    assert _decide(catalogue_ready, clock, who, [("offers", "opt_in")]) == []
    assert count_rows(engine, "consent_event") == 1
    withdrawn = _decide(catalogue_ready, clock, who, [("offers", "opt_out")])
    assert [(c.previous, c.new) for c in withdrawn] == [("opt_in", "opt_out")]
    assert count_rows(engine, "topic_preference") == 1  # a withdrawal never deletes


def test_a_topic_decided_twice_in_one_call_is_stored_as_its_last_step(
    catalogue_ready, engine, clock
):
    who = _subscriber(catalogue_ready, clock)
    changes = _decide(catalogue_ready, clock, who, [("offers", "opt_in"), ("offers", "opt_out")])
    assert [(c.previous, c.new) for c in changes] == [("unset", "opt_in"), ("opt_in", "opt_out")]
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT state, event_seq FROM topic_preference")).one()
    assert tuple(stored) == ("opt_out", changes[-1].event_seq)


def test_the_rows_a_session_holds_show_the_save_with_nothing_left_to_flush(
    catalogue_ready, engine, clock
):
    """The save writes its changed topics with one upsert; the preference objects the
    caller's session already holds read as the database does, and none is left dirty."""
    app = catalogue_ready
    who = _subscriber(app, clock)
    _decide(app, clock, who, [("offers", "opt_in"), ("weekly-digest", "opt_in")])
    clock.advance(seconds=5)
    with db.begin(app) as session:
        held = preference_rows(session, who)
        topics = {t.slug: t for t in catalogue.active_topics(session)}
        changes = apply_decisions(
            session,
            who,
            [
                Decision(topics["offers"], PreferenceState.OPT_OUT),
                Decision(topics["order-updates"], PreferenceState.OPT_IN),
            ],
            source="api",
            policy_version="v1",
            decided_at=clock.now(),
            recorded_at=clock.now(),
        )
        offers = held[topics["offers"].id]
        assert (offers.state, offers.source, offers.recorded_at, offers.event_seq) == (
            "opt_out",
            "api",
            clock.now(),
            changes[0].event_seq,
        )
        assert not session.dirty and not session.new
        assert held[topics["weekly-digest"].id].state == "opt_in"  # untouched
        again = preference_rows(session, who)
        assert again[topics["order-updates"].id].event_seq == changes[1].event_seq
    with engine.connect() as conn:
        stored = dict(
            conn.execute(
                sa.select(TopicPreference.topic_id, TopicPreference.state).where(
                    TopicPreference.subscriber_id == who
                )
            ).all()
        )
    assert stored == {
        topics["offers"].id: "opt_out",
        topics["weekly-digest"].id: "opt_in",
        topics["order-updates"].id: "opt_in",
    }


@pytest.mark.parametrize(
    "statement", ["UPDATE consent_event SET kind = 'erased'", "DELETE FROM consent_event"]
)
def test_the_database_refuses_to_change_the_log(catalogue_ready, engine, clock, statement):
    _decide(catalogue_ready, clock, _subscriber(catalogue_ready, clock), [("offers", "opt_in")])
    with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as conn:
        conn.execute(sa.text(statement))
    assert count_rows(engine, "consent_event") == 1


@pytest.mark.parametrize(
    "statement", ["UPDATE policy_version SET text = 'edited'", "DELETE FROM policy_version"]
)
def test_the_database_refuses_to_change_a_published_policy(catalogue_ready, engine, statement):
    with pytest.raises(sa.exc.DatabaseError, match="immutable"), engine.begin() as conn:
        conn.execute(sa.text(statement))


@pytest.mark.postgres_only
def test_truncate_is_refused_too(catalogue_ready, engine):
    with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE consent_event"))


def _tamper(engine, backend, sql):
    """Edit the log behind the application's back: the guard trigger is lifted for it."""
    with engine.begin() as conn:
        if backend == "postgresql":
            conn.execute(
                sa.text("ALTER TABLE consent_event DISABLE TRIGGER consent_event_append_only")
            )
            conn.execute(sa.text(sql))
            conn.execute(
                sa.text("ALTER TABLE consent_event ENABLE TRIGGER consent_event_append_only")
            )
        else:
            ddl = dict(
                conn.execute(
                    sa.text(
                        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'consent_event'"
                    )
                ).all()
            )
            for name in ddl:
                conn.execute(sa.text(f"DROP TRIGGER {name}"))
            conn.execute(sa.text(sql))
            for statement in ddl.values():
                conn.execute(sa.text(statement))


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "UPDATE consent_event SET new_state = 'unset' WHERE seq = 3",
            "event 3: leaf hash does not match its content",
        ),
        (
            "UPDATE consent_event SET recorded_at = recorded_at WHERE seq = 2; UPDATE consent_event SET actor = 'staff' WHERE seq = 2",
            "event 2: leaf hash does not match",
        ),
        ("DELETE FROM consent_event WHERE seq = 4", "event 4: missing"),
        (
            # Two events edited: the first in the log is the one named.
            "UPDATE consent_event SET new_state = 'opt_in' WHERE seq = 4; UPDATE consent_event SET actor = 'staff' WHERE seq = 2",
            "event 2: leaf hash does not match",
        ),
    ],
    ids=["edited-state", "edited-actor", "deleted", "two-edited"],
)
def test_verify_log_names_the_first_tampered_event(
    catalogue_ready, engine, clock, backend, sql, expected
):
    who = _subscriber(catalogue_ready, clock)
    for state in ["opt_in", "opt_out", "opt_in", "opt_out", "opt_in"]:
        clock.advance(seconds=5)
        _decide(catalogue_ready, clock, who, [("offers", state)])
    sequence(catalogue_ready)
    runner = catalogue_ready.test_cli_runner()
    ok = runner.invoke(args=["portal", "verify-log"])
    assert ok.exit_code == 0
    assert "consent log intact: 5 events" in ok.output
    for statement in sql.split("; "):
        _tamper(engine, backend, statement)
    broken = runner.invoke(args=["portal", "verify-log"])
    assert broken.exit_code == 1
    assert expected in broken.output


def test_a_save_of_several_topics_writes_each_table_with_one_statement(
    catalogue_ready, engine, clock
):
    """Three changed topics: one INSERT of their events and one upsert of their rows, each
    a single statement, never a statement per row or a batch of them (on PostgreSQL psycopg
    sends a batch in pipeline mode, where it waits for the answers by polling a socket
    that is always writable: a save spent a twentieth of its CPU there)."""
    person = _subscriber(catalogue_ready, clock)
    _decide(catalogue_ready, clock, person, [("offers", "opt_in")])
    # What the driver is asked to do: run one statement, or run one for each parameter set.
    sent: list[tuple[str, bool]] = []

    def capturing(many: bool):
        def capture(_cursor, statement, _parameters, _context) -> None:
            if statement.lstrip().startswith("INSERT"):
                sent.append((statement.split("(")[0].strip(), many))

        return capture

    listeners = [("do_execute", capturing(False)), ("do_executemany", capturing(True))]
    for name, listener in listeners:
        sa.event.listen(engine, name, listener)
    try:
        changes = _decide(
            catalogue_ready,
            clock,
            person,
            [("offers", "opt_out"), ("weekly-digest", "opt_out"), ("order-updates", "opt_in")],
        )
    finally:
        for name, listener in listeners:
            sa.event.remove(engine, name, listener)
    assert len(changes) == 3
    if engine.dialect.name == "postgresql":
        assert sent == [
            ("INSERT INTO consent_event", False),
            ("INSERT INTO topic_preference", False),
        ]
    else:  # numbered by the transaction holding SQLite's write lock: one batch
        assert sent[-1] == ("INSERT INTO topic_preference", False)
    assert stored_preferences(engine) == {
        "offers": "opt_out",
        "weekly-digest": "opt_out",
        "order-updates": "opt_in",
    }


def test_a_topic_decided_twice_in_one_save_is_one_chain(catalogue_ready, engine, clock):
    """Two decisions for one topic in one call: each event starts where the one before it
    left the topic, not both from the stored state (the fifty-writer test below decides
    ``offers`` twice in some of its saves)."""
    person = _subscriber(catalogue_ready, clock)
    _decide(catalogue_ready, clock, person, [("offers", "opt_out"), ("offers", "opt_in")])
    _decide(catalogue_ready, clock, person, [("offers", "opt_out"), ("offers", "opt_out")])
    with engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT previous_state, new_state FROM consent_event "
                "WHERE topic_id IS NOT NULL ORDER BY seq"  # the only person's
            )
        ).all()
    assert [tuple(e) for e in events] == [
        ("unset", "opt_out"),
        ("opt_out", "opt_in"),
        ("opt_in", "opt_out"),
    ]


@pytest.mark.postgres_only
def test_fifty_concurrent_submissions_keep_one_event_per_transition(catalogue_ready, engine, clock):
    """No global lock: the per-subscriber row lock alone keeps every person's events a
    chain of transitions (previous_state = the last new_state), and the tree takes them
    all."""
    app = catalogue_ready
    people = [_subscriber(app, clock) for _ in range(10)]
    barrier = threading.Barrier(50)
    failures: list[BaseException] = []

    def submit(index: int) -> None:
        barrier.wait()
        try:
            state = "opt_in" if index % 2 else "opt_out"
            _decide(
                app, clock, people[index % 10], [("offers", state), (SLUGS[index % 4], "opt_in")]
            )
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT seq, subscriber_id, topic_id, previous_state, new_state "
                "FROM consent_event ORDER BY seq"
            )
        ).all()
        table = {
            (r.subscriber_id, r.topic_id): r.state
            for r in conn.execute(sa.text("SELECT * FROM topic_preference"))
        }
    folded: dict[tuple, str] = {}
    for row in rows:
        key = (row.subscriber_id, row.topic_id)
        assert folded.get(key, "unset") == row.previous_state, row
        assert row.previous_state != row.new_state
        folded[key] = row.new_state
    assert folded == table
    assert len(rows) >= 10
    report = _verify(engine, app)
    assert report.ok, report.problem
    assert report.head.tree_size == len(rows) == rows[-1].seq


def test_events_hold_no_raw_personal_data(app, engine, subscriptions, catalogue_ready):
    """Ids, a screen and a user-agent family: never an address, an endpoint, a key, the
    user-agent string or the host product's account id."""
    secret = "host-secret"
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        identity_assertion_secrets=(secret,)
    )
    agent = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/140.0.1.2 Safari/537.36 Trace/91c"
    headers = {"User-Agent": agent, "X-Forwarded-For": "198.51.100.23"}
    browser = app.test_client()
    browser.environ_base.update({"REMOTE_ADDR": "203.0.113.77", "HTTP_USER_AGENT": agent})
    first, second = subscriptions(), subscriptions("autopush")
    assert (
        browser.post(
            "/api/push/subscribe",
            json={"subscription": first.to_json(), "topics": ["offers"], "policyVersion": "v1"},
            headers=headers,
        ).status_code
        == 201
    )
    body = {
        "endpoint": first.endpoint,
        "decisions": [{"slug": "weekly-digest", "state": "opt_in"}],
        "policyVersion": "v1",
        "decidedAt": "2025-12-31T23:00:00Z",
    }
    assert browser.post("/api/push/preferences", json=body, headers=headers).status_code == 200
    page = browser.get("/preferences", headers=headers).text
    browser.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(page),
            "policy_version": "v1",
            "visible": ["offers"],
            "topics": [],
        },
        headers=headers,
    )
    moved = browser.post(
        "/api/push/change",
        json={"oldEndpoint": first.endpoint, "subscription": second.to_json()},
        headers=headers,
    )
    assert moved.json["moved"] is True
    link = sign_assertion({"sub": "customer-4711", "exp": time.time() + 60}, secret)
    assert confirm_account_link(browser, link, headers=headers).status_code == 303
    browser.post("/api/push/unsubscribe", json={"endpoint": second.endpoint}, headers=headers)

    with engine.connect() as conn:
        events = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM consent_event"))]
    assert {e["kind"] for e in events} >= {
        "permission_granted",
        "subscribed",
        "preference_changed",
        "endpoint_rotated",
        "account_linked",
        "unsubscribed",
    }
    dump = "\n".join(repr(value) for event in events for value in event.values())
    for sub in (first, second):
        for needle in (sub.endpoint, sub.p256dh, sub.auth_b64, sub.auth.hex()):
            assert needle not in dump
    for needle in ("203.0.113.77", "198.51.100.23", "Trace/91c", "X11", "customer-4711"):
        assert needle not in dump
    clients = {json.loads(e["context"]).get("client") for e in events}
    assert clients == {"Chrome 140"}  # the family and major version, nothing finer


HASHED = [
    "seq",
    "subscriber_id",
    "subscription_id",
    "topic_id",
    "kind",
    "previous_state",
    "new_state",
    "source",
    "policy_version",
    "decided_at",
    "recorded_at",
    "actor",
    "context",
]


def _blob(backend: str, value: bytes) -> str:
    return f"decode('{value.hex()}', 'hex')" if backend == "postgresql" else f"X'{value.hex()}'"


def _five_decisions(app, clock):
    who = _subscriber(app, clock)
    for state in ["opt_in", "opt_out", "opt_in", "opt_out", "opt_in"]:
        clock.advance(seconds=5)
        _decide(app, clock, who, [("offers", state)])
    sequence(app)


def test_a_saved_tree_head_finds_the_newest_events_deleted(
    catalogue_ready, engine, clock, backend, tmp_path
):
    """Events deleted with the tree cut back and re-signed still make a tree that
    verifies on its own; the head saved earlier finds it."""
    _five_decisions(catalogue_ready, clock)
    runner = catalogue_ready.test_cli_runner()
    saved = tmp_path / "head.json"
    first = runner.invoke(args=["portal", "verify-log", "--save-tree-head", str(saved)])
    assert first.exit_code == 0, first.output
    assert json.loads(saved.read_text())["tree_size"] == 5
    # The operator rebuilds the tree from three events with the log key.
    _rebuild(engine, backend, catalogue_ready, "DELETE FROM consent_event WHERE seq >= 4")
    alone = runner.invoke(args=["portal", "verify-log"])
    assert alone.exit_code == 0, alone.output  # a shorter tree still verifies on its own
    assert "3 events" in alone.output
    checked = runner.invoke(args=["portal", "verify-log", "--tree-head", str(saved)])
    assert checked.exit_code == 1
    assert "the saved tree head has 5 leaves" in checked.output


def test_a_saved_tree_head_finds_history_rewritten(
    catalogue_ready, engine, clock, backend, tmp_path
):
    """An event edited and the whole tree rebuilt and re-signed: only a saved head tells,
    since no consistency proof from it exists."""
    _five_decisions(catalogue_ready, clock)
    runner = catalogue_ready.test_cli_runner()
    saved = tmp_path / "head.json"
    assert (
        runner.invoke(args=["portal", "verify-log", "--save-tree-head", str(saved)]).exit_code == 0
    )
    _decide(catalogue_ready, clock, _subscriber(catalogue_ready, clock), [("offers", "opt_in")])
    sequence(catalogue_ready)
    good = runner.invoke(args=["portal", "verify-log", "--tree-head", str(saved)])
    assert good.exit_code == 0, good.output
    assert "consistent with the saved head of size 5" in good.output
    _rebuild(
        engine,
        backend,
        catalogue_ready,
        "UPDATE consent_event SET new_state = 'opt_out' WHERE seq = 3",
    )
    assert runner.invoke(args=["portal", "verify-log"]).exit_code == 0  # a consistent forgery
    checked = runner.invoke(args=["portal", "verify-log", "--tree-head", str(saved)])
    assert checked.exit_code == 1
    assert "event 5: the tree of the saved head's size has another root" in checked.output


def test_a_saved_tree_head_signed_by_another_key_is_refused(catalogue_ready, clock, tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from portal.consent import merkle, tree

    _five_decisions(catalogue_ready, clock)
    with catalogue_ready.extensions["portal.db"].engine.connect() as conn:
        head = tree.latest_head(conn)
    forged = merkle.sign_tree_head(
        ed25519.Ed25519PrivateKey.generate(),
        tree_size=head.tree_size,
        timestamp=head.timestamp,
        root_hash=head.root_hash,
    )
    saved = tmp_path / "head.json"
    saved.write_text(json.dumps(forged.to_json()))
    result = catalogue_ready.test_cli_runner().invoke(
        args=["portal", "verify-log", "--tree-head", str(saved)]
    )
    assert result.exit_code == 1
    assert "signature does not verify" in result.output
    saved.write_text('{"tree_size": 5}')
    result = catalogue_ready.test_cli_runner().invoke(
        args=["portal", "verify-log", "--tree-head", str(saved)]
    )
    assert result.exit_code == 1
    assert "is not a signed tree head" in result.output


def test_after_the_log_key_changed_earlier_heads_verify_with_the_earlier_key_given(
    catalogue_ready, clock, tmp_path
):
    """A new CONSENT_LOG_SIGNING_KEY: the heads signed before stay signed by the old one.
    verify-log trusts this deployment's key and the earlier ones given with --log-key,
    never a key merely stored beside a head (whoever rewrites the database can store
    their own); without the earlier key it says to give it."""
    import dataclasses

    from portal import create_app
    from portal.config import generate_signing_key
    from portal.consent import merkle, tree

    _five_decisions(catalogue_ready, clock)
    old_key = tree.signing_key(current_portal(catalogue_ready).settings.consent_log_signing_key)
    old_json = tmp_path / "old-key.json"
    old_json.write_text(json.dumps(merkle.log_key_to_json(old_key.public_key())))
    saved = tmp_path / "head.json"
    runner = catalogue_ready.test_cli_runner()
    assert (
        runner.invoke(args=["portal", "verify-log", "--save-tree-head", str(saved)]).exit_code == 0
    )
    rotated = create_app(
        dataclasses.replace(
            current_portal(catalogue_ready).settings, consent_log_signing_key=generate_signing_key()
        ),
        clock=clock,
    )
    try:
        runner = rotated.test_cli_runner()
        # No event since: the latest head is still the old key's.
        alone = runner.invoke(args=["portal", "verify-log"])
        assert alone.exit_code == 1
        assert "pass the earlier key with --log-key" in alone.output
        both = runner.invoke(args=["portal", "verify-log", "--log-key", str(old_json)])
        assert both.exit_code == 0, both.output
        assert "consent log intact: 5 events" in both.output
        # A new event: its head is the new key's; the saved head is the old key's.
        _decide(rotated, clock, _subscriber(rotated, clock), [("offers", "opt_in")])
        sequence(rotated)
        assert runner.invoke(args=["portal", "verify-log"]).exit_code == 0
        check = ["portal", "verify-log", "--tree-head", str(saved)]
        without = runner.invoke(args=check)
        assert without.exit_code == 1
        assert "the saved tree head" in without.output
        assert "pass the earlier key with --log-key" in without.output
        old_b64 = merkle.log_key_to_json(old_key.public_key())["key"]
        given = runner.invoke(args=[*check, "--log-key", old_b64])
        assert given.exit_code == 0, given.output
        assert "consistent with the saved head of size 5" in given.output
        # A key nobody trusts is refused, and so is a malformed one.
        stranger = merkle.log_key_to_json(tree.signing_key(generate_signing_key()).public_key())
        other = runner.invoke(args=[*check, "--log-key", stranger["key"]])
        assert other.exit_code == 1
        assert "verifies with none of the log keys given" in other.output
        bad = runner.invoke(args=[*check, "--log-key", "not a key"])
        assert bad.exit_code == 2
        assert "--log-key" in bad.output
    finally:
        rotated.extensions["portal.db"].engine.dispose()


def test_a_saved_tree_head_with_a_key_given_twice_is_refused(catalogue_ready, clock, tmp_path):
    """Readers disagree on which copy of a repeated key counts: a person could read one
    size and the checker another."""
    _five_decisions(catalogue_ready, clock)
    runner = catalogue_ready.test_cli_runner()
    saved = tmp_path / "head.json"
    assert (
        runner.invoke(args=["portal", "verify-log", "--save-tree-head", str(saved)]).exit_code == 0
    )
    text = saved.read_text()
    saved.write_text(text.replace("{", '{\n  "tree_size": 999,', 1))
    result = runner.invoke(args=["portal", "verify-log", "--tree-head", str(saved)])
    assert result.exit_code == 1
    assert "given twice" in result.output


def _rebuild(engine, backend, app, sql):
    """Tamper with the events, then rebuild the tree from them and sign it with the log
    key: what an operator with the database and the key could do."""
    _tamper(engine, backend, sql)
    with engine.begin() as conn:
        if backend == "postgresql":
            conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
            conn.execute(sa.text("DELETE FROM consent_log_node"))
            conn.execute(sa.text("DELETE FROM consent_tree_head"))
        else:
            for table in ("consent_log_node", "consent_tree_head"):
                conn.execute(sa.text(f"DROP TRIGGER {table}_no_delete"))
                conn.execute(sa.text(f"DELETE FROM {table}"))
                conn.execute(
                    sa.text(
                        f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
                        f"BEGIN SELECT RAISE(ABORT, 'append-only: DELETE refused on {table}'); END"
                    )
                )
        conn.execute(
            sa.text("UPDATE consent_log_state SET tree_size = 0, frontier = :f, gap_seq = NULL"),
            {"f": b"\x01" + bytes(8)},
        )
    sequence(app)


def test_an_anchor_is_a_leaf_hash(catalogue_ready, engine, clock, backend):
    from portal.consent import tree

    _five_decisions(catalogue_ready, clock)
    with engine.connect() as conn:
        leaf = tree.DatabaseNodes(conn).node_hashes([tree.merkle.NodeId(0, 4)])[0]
    runner = catalogue_ready.test_cli_runner()
    anchor = f"5:{leaf.hex()}"
    assert runner.invoke(args=["portal", "verify-log", "--anchor", anchor]).exit_code == 0
    _rebuild(engine, backend, catalogue_ready, "DELETE FROM consent_event WHERE seq >= 5")
    broken = runner.invoke(args=["portal", "verify-log", "--anchor", anchor])
    assert broken.exit_code == 1
    assert "event 5: missing: the log ends at seq 4" in broken.output


def test_events_from_before_the_tree_keep_their_chain(catalogue_ready, engine, clock, backend):
    """Events chained before migration 0018 are the tree's first leaves; their chain is
    still checked, and an edit is named by it."""
    from portal.consent.models import EventKind

    who = _subscriber(catalogue_ready, clock)
    prev = log.GENESIS
    rows = []
    for seq in (1, 2, 3):
        fields = log.event_fields(
            seq=seq,
            subscriber_id=who,
            subscription_id=None,
            topic_id=None,
            kind=EventKind.ACCOUNT_LINKED.value,
            previous_state=None,
            new_state=None,
            source="system",
            policy_version=None,
            decided_at=clock.now(),
            recorded_at=clock.now(),
            actor="system",
            context="{}",
        )
        digest = log.chain_hash(prev, fields)
        row = {
            **fields,
            "subscriber_id": who,
            "decided_at": clock.now(),
            "recorded_at": clock.now(),
            "prev_hash": prev,
            "hash": digest,
        }
        rows.append(row)
        prev = digest
    with engine.begin() as conn:
        conn.execute(sa.insert(log._t), rows)
        if backend == "postgresql":
            conn.execute(sa.text("SELECT setval('consent_event_seq', 3)"))
    _decide(catalogue_ready, clock, who, [("offers", "opt_in")])  # seq 4, unchained
    report = _verify(engine, catalogue_ready)
    assert report.ok, report.problem
    assert report.head.tree_size == 4
    assert report.last_hash == prev
    _tamper(engine, backend, "UPDATE consent_event SET actor = 'staff' WHERE seq = 2")
    report = _verify(engine)
    assert str(report.problem) == "event 2: hash does not match its content (altered)"


@pytest.mark.parametrize("value", ["5", "x:00", "0:" + "00" * 32, "3:" + "00" * 31, "3:zz"])
def test_a_malformed_anchor_is_refused(catalogue_ready, value):
    result = catalogue_ready.test_cli_runner().invoke(
        args=["portal", "verify-log", "--anchor", value]
    )
    assert result.exit_code == 2
    assert "SEQ:HASH" in result.output
