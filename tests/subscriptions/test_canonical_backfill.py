"""The ``canonicalise-endpoints`` backfill: rows stored before endpoints were canonical
are rewritten to the canonical form and its hash; spellings of one resource merge."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid

import sqlalchemy as sa

from portal.consent.tree import verify_chain
from portal.jobs import NoProgress, run_job
from portal.seams import current_portal
from portal.subscriptions.models import PushSubscription
from portal.subscriptions.validation import endpoint_hash

JOB = "canonicalise-endpoints"
SUBSCRIBE = "/api/push/subscribe"
TOKEN = "bGVnYWN5LXJvdw:APA91bE-x_y"
CANONICAL = f"https://fcm.googleapis.com/fcm/send/{TOKEN}"
_t = PushSubscription.__table__


def _register_browser(app, subscriptions, clock, *, after=dt.timedelta(minutes=5)):
    """A subscription of a browser of its own (so a subscriber of its own), registered
    ``after`` later than the previous one: its id and the browser's subscription."""
    clock.advance(after)
    sub = subscriptions()
    response = app.test_client().post(SUBSCRIBE, json={"subscription": sub.to_json()})
    assert response.status_code == 201
    return uuid.UUID(response.json["id"]), sub


def _register(app, subscriptions, clock, *, after=dt.timedelta(minutes=5)):
    return _register_browser(app, subscriptions, clock, after=after)[0]


def _store_as_before(engine, subscription_id, endpoint, **values):
    """What the registry stored before: the endpoint verbatim, the hash of exactly that."""
    values |= {"endpoint": endpoint, "endpoint_hash": hashlib.sha256(endpoint.encode()).digest()}
    with engine.begin() as conn:
        conn.execute(sa.update(_t).where(_t.c.id == subscription_id).values(**values))


def _set(engine, subscription_id, **values):
    with engine.begin() as conn:
        conn.execute(sa.update(_t).where(_t.c.id == subscription_id).values(**values))


def _rows(engine):
    """Every subscription row, as Python values (UUIDs, aware datetimes) on both databases."""
    with engine.connect() as conn:
        return {r.id: dict(r._mapping) for r in conn.execute(sa.select(_t))}


def _events(engine, kind="endpoint_rotated"):
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT subscriber_id, subscription_id, previous_state, new_state, source, "
                "actor, context FROM consent_event WHERE kind = :k ORDER BY seq"
            ),
            {"k": kind},
        ).all()
    return [
        (
            uuid.UUID(str(r.subscriber_id)),
            uuid.UUID(str(r.subscription_id)),
            r.previous_state,
            r.new_state,
            r.source,
            r.actor,
            json.loads(r.context),
        )
        for r in rows
    ]


def _chain_ok(engine):
    with engine.connect() as conn:
        return verify_chain(conn).ok


def test_rows_stored_verbatim_are_rewritten_canonical_and_a_rerun_changes_nothing(
    app, engine, subscriptions, clock
):
    legacy = {
        _register(app, subscriptions, clock): f"HTTPS://FCM.GoogleAPIs.com/fcm/send/a{n}"
        for n in range(3)
    }
    for subscription_id, endpoint in legacy.items():
        _store_as_before(engine, subscription_id, endpoint)
    untouched = _register(app, subscriptions, clock)

    report = run_job(app, JOB)

    assert (report.processed, report.changed, report.problems) == (4, 3, [])
    rows = _rows(engine)
    for subscription_id, endpoint in legacy.items():
        canonical = endpoint.replace("HTTPS://FCM.GoogleAPIs.com", "https://fcm.googleapis.com")
        assert rows[subscription_id]["endpoint"] == canonical
        assert bytes(rows[subscription_id]["endpoint_hash"]) == endpoint_hash(canonical)
        assert bytes(rows[subscription_id]["endpoint_hash"]) == (
            hashlib.sha256(canonical.encode()).digest()
        )
        assert rows[subscription_id]["state"] == "pending"
    assert rows[untouched]["state"] == "pending"
    assert _events(engine) == []

    again = run_job(app, JOB)
    assert (again.processed, again.changed, again.problems) == (4, 0, [])
    assert _rows(engine) == rows
    result = app.test_cli_runner().invoke(args=["portal", "run-job", JOB])
    assert result.exit_code == 0, result.output
    assert f"{JOB}: 4 rows looked at, 0 changed" in result.output


def test_spellings_of_one_resource_merge_into_one_subscription(
    app, engine, subscriptions, clock, backend
):
    """Kept: the earliest registration (its id, subscriber and grant); its keys become
    the newest registration's; the others end as rotated, each with a consent event."""
    first = _register(app, subscriptions, clock)
    second = _register(app, subscriptions, clock)
    newest, newest_browser = _register_browser(app, subscriptions, clock)
    before = _rows(engine)
    _store_as_before(engine, first, f"https://fcm.googleapis.com:443/fcm/send/{TOKEN}")
    _store_as_before(engine, second, CANONICAL)
    _store_as_before(engine, newest, f"HTTPS://FCM.googleapis.com/fcm/send/{TOKEN}#f")
    clock.advance(minutes=5)

    report = run_job(app, JOB)

    assert report.problems == []
    assert report.changed == 2
    rows = _rows(engine)
    live = [r for r in rows.values() if r["state"] == "pending"]
    assert [r["id"] for r in live] == [rows[first]["id"]]
    kept = rows[first]
    assert kept["endpoint"] == CANONICAL
    assert bytes(kept["endpoint_hash"]) == endpoint_hash(CANONICAL)
    assert kept["subscriber_id"] == before[first]["subscriber_id"]
    assert kept["grant_event_seq"] == before[first]["grant_event_seq"]
    assert kept["created_at"] == before[first]["created_at"]
    for column in ("p256dh", "auth_sealed", "auth_key_version", "last_seen_at", "user_agent"):
        assert kept[column] == before[newest][column], column
    for ended in (second, newest):
        row = rows[ended]
        assert (row["state"], row["end_reason"]) == ("revoked", "rotated")
        assert row["ended_at"] == clock.now()
        # An ended row keeps a spelling of its own: the hash stays its endpoint's.
        assert row["endpoint"] != CANONICAL
        assert row["endpoint_hash"] == hashlib.sha256(row["endpoint"].encode()).digest()
        assert row["subscriber_id"] == before[ended]["subscriber_id"]

    kept_subscriber = kept["subscriber_id"]
    events = _events(engine)
    expected = []
    for ended in (second, newest):
        context = {"screen": JOB, "previous_subscription": str(ended)}
        expected.append((kept_subscriber, first, "pending", "pending", "system", "system", context))
        their = before[ended]["subscriber_id"]
        expected.append(
            (
                their,
                ended,
                "pending",
                "revoked",
                "system",
                "system",
                {"screen": JOB, "merged_into": str(first)},
            )
        )
    assert sorted(events, key=str) == sorted(expected, key=str)
    assert _chain_ok(engine)

    # Any spelling now names the kept row, which holds the newest browser's keys: that
    # browser proves it with its own auth secret.
    beat = app.test_client().post(
        "/api/push/heartbeat",
        json={
            "endpoint": f"https://fcm.googleapis.com.:0443/fcm/send/{TOKEN}?",
            "auth": newest_browser.to_json()["keys"]["auth"],
        },
    )
    assert beat.json == {"state": "pending", "action": "none"}

    again = run_job(app, JOB)
    assert (again.changed, again.problems) == (0, [])
    assert len(_events(engine)) == len(events)


def test_the_latest_act_decides_the_merged_state(app, engine, subscriptions, clock):
    """An unsubscribe made through one spelling after the last registration through any
    other ends the merged subscription; one made before it does not."""
    older = _register(app, subscriptions, clock)
    unsubscribed = _register(app, subscriptions, clock)
    _store_as_before(engine, older, CANONICAL)
    spelled = f"https://fcm.googleapis.com/fcm/send/{TOKEN}?"
    _store_as_before(engine, unsubscribed, spelled)
    clock.advance(minutes=5)
    _set(
        engine,
        unsubscribed,
        state="revoked",
        end_reason="unsubscribed",
        ended_at=clock.now(),
        revoked_at=clock.now(),
    )

    run_job(app, JOB)

    kept = _rows(engine)[older]
    assert (kept["state"], kept["end_reason"], kept["ended_at"]) == (
        "revoked",
        "unsubscribed",
        clock.now(),
    )

    # Registered again (through yet another spelling, before this release) after that
    # unsubscribe: that registration is the latest act, and the merged row is live.
    clock.advance(minutes=5)
    again = _register(app, subscriptions, clock)
    _store_as_before(engine, again, f"https://FCM.googleapis.com/fcm/send/{TOKEN}")
    run_job(app, JOB)
    rows = _rows(engine)
    assert (rows[older]["state"], rows[older]["end_reason"]) == ("pending", None)
    assert rows[older]["last_seen_at"] == rows[again]["last_seen_at"]
    assert (rows[again]["state"], rows[again]["end_reason"]) == ("revoked", "rotated")


def test_rows_it_cannot_rewrite_are_reported_and_left(app, engine, subscriptions, clock):
    bad = _register(app, subscriptions, clock)
    _store_as_before(engine, bad, "https://fcm.googleapis.com/fcm/send/a b<c>")
    tombstoned = _register(app, subscriptions, clock)
    _store_as_before(engine, tombstoned, CANONICAL)
    _set(
        engine,
        tombstoned,
        endpoint=None,
        p256dh=None,
        auth_sealed=None,
        state="revoked",
        end_reason="erased",
        deleted_at=clock.now(),
    )
    live = _register(app, subscriptions, clock)
    _store_as_before(engine, live, f"https://fcm.googleapis.com:443/fcm/send/{TOKEN}")
    before = _rows(engine)

    report = run_job(app, JOB)

    assert report.changed == 0
    assert report.problems == [
        f"subscription {bad}: its endpoint is not a push endpoint (invalid_endpoint); left as it is",
        f"subscription {live}: its canonical endpoint belongs to the tombstone {tombstoned}; "
        "left as it is",
    ]
    assert _rows(engine) == before
    result = app.test_cli_runner().invoke(args=["portal", "run-job", JOB])
    assert result.exit_code == 1
    assert f"{JOB}: 2 rows looked at, 0 changed, 2 problems" in result.output


def test_it_walks_in_chunks_pausing_and_stopping_when_a_replica_falls_behind(
    app, engine, subscriptions, clock
):
    from portal.subscriptions.jobs import canonicalise_endpoints

    made = [_register(app, subscriptions, clock) for _ in range(5)]
    for n, subscription_id in enumerate(made):
        _store_as_before(engine, subscription_id, f"https://fcm.googleapis.com:443/fcm/send/c{n}")
    pauses: list[float] = []
    lags = iter([0.5, 42.0])
    report = canonicalise_endpoints(
        app,
        batch_size=2,
        progress=NoProgress(),
        pause_seconds=0.075,
        max_lag_seconds=10.0,
        lag=lambda session: next(lags),
        sleep=pauses.append,
    )
    assert pauses == [0.075]
    assert (report.processed, report.changed) == (4, 4)
    assert report.problems == [
        "stopped after 4 rows: replication lag 42.0 s is over 10 s; run the job again to go on"
    ]
    again = canonicalise_endpoints(app, batch_size=2, progress=NoProgress(), sleep=pauses.append)
    assert (again.processed, again.changed, again.problems) == (5, 1, [])
    assert {r["endpoint"] for r in _rows(engine).values()} == {
        f"https://fcm.googleapis.com/fcm/send/c{n}" for n in range(5)
    }


def test_the_job_takes_its_chunk_pause_and_lag_limit_from_the_settings(app, monkeypatch):
    from portal.subscriptions import jobs

    seen = {}
    real = jobs.canonicalise_endpoints

    def spy(app_, **kwargs):
        seen.update(kwargs)
        return real(app_, **kwargs)

    monkeypatch.setattr(jobs, "canonicalise_endpoints", spy)
    run_job(app, JOB)
    settings = current_portal(app).settings
    assert seen["batch_size"] == settings.reseal_batch_size
    assert seen["pause_seconds"] == settings.backfill_pause_seconds
    assert seen["max_lag_seconds"] == settings.backfill_max_replication_lag_seconds
