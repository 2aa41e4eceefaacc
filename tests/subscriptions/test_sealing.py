"""Sealing the auth secret and rotating the data key (seed 000 §4)."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from portal import create_app
from portal.jobs import NoProgress, run_job
from portal.seams import current_portal
from portal.subscriptions.jobs import reseal
from portal.subscriptions.sealing import KeyRing, SealBroken, UnknownKeyVersion
from tests.helpers import StopAfterFirstBatch, all_rows

URL = "/api/push/subscribe"
K1, K2 = os.urandom(32), os.urandom(32)


@given(st.binary(min_size=16, max_size=16))
def test_seal_round_trip_and_layout(secret):
    ring = KeyRing({1: K1}, 1)
    sealed = ring.seal(secret)
    assert len(sealed.sealed) == 12 + 16 + 16  # iv ‖ tag ‖ ciphertext
    assert sealed.key_version == 1
    assert secret not in sealed.sealed
    assert ring.open(sealed.sealed, 1) == secret


def test_two_seals_of_one_secret_differ():
    ring = KeyRing({1: K1}, 1)
    secret = os.urandom(16)
    assert ring.seal(secret).sealed != ring.seal(secret).sealed


def test_a_changed_byte_or_wrong_key_is_refused():
    ring = KeyRing({1: K1, 2: K2}, 1)
    sealed = bytearray(ring.seal(os.urandom(16)).sealed)
    with pytest.raises(SealBroken):
        ring.open(bytes(sealed), 2)
    sealed[-1] ^= 1
    with pytest.raises(SealBroken):
        ring.open(bytes(sealed), 1)
    with pytest.raises(UnknownKeyVersion):
        ring.open(bytes(sealed), 7)


def test_only_16_byte_secrets_are_sealed():
    with pytest.raises(ValueError, match="16 bytes"):
        KeyRing({1: K1}, 1).seal(b"short")


def _app(settings, clock, keys: dict[int, bytes], current: int):
    return create_app(
        settings.with_overrides(auth_keys=keys, auth_key_version=current, reseal_batch_size=2),
        clock=clock,
    )


def test_rotation_old_rows_open_new_rows_use_v2_and_reseal_moves_all(
    settings, clock, subscriptions
):
    old_app = _app(settings, clock, {1: K1}, 1)
    subs = [subscriptions() for _ in range(5)]
    for sub in subs[:4]:
        assert (
            old_app.test_client().post(URL, json={"subscription": sub.to_json()}).status_code == 201
        )

    app = _app(settings, clock, {1: K1, 2: K2}, 2)
    engine = app.extensions["portal.db"].engine
    keys = current_portal(app).keys
    assert app.test_client().post(URL, json={"subscription": subs[4].to_json()}).status_code == 201

    by_endpoint = {r["endpoint"]: r for r in all_rows(engine, "push_subscription")}
    for sub in subs[:4]:
        row = by_endpoint[sub.endpoint]
        assert row["auth_key_version"] == 1
        assert keys.open(bytes(row["auth_sealed"]), 1) == sub.auth  # v1 still opens
    assert by_endpoint[subs[4].endpoint]["auth_key_version"] == 2

    report = run_job(app, "reseal")
    assert report.changed == 4
    assert report.problems == []
    for sub in subs:
        row = {r["endpoint"]: r for r in all_rows(engine, "push_subscription")}[sub.endpoint]
        assert row["auth_key_version"] == 2
        assert keys.open(bytes(row["auth_sealed"]), 2) == sub.auth
    again = run_job(app, "reseal")  # safe to run again: nothing left to move
    assert (again.processed, again.changed) == (0, 0)
    old_app.extensions["portal.db"].engine.dispose()
    engine.dispose()


def test_a_reseal_asked_to_stop_finishes_its_batch_and_the_next_run_moves_the_rest(
    settings, clock, subscriptions
):
    old_app = _app(settings, clock, {1: K1}, 1)
    for _ in range(5):
        sub = subscriptions()
        old_app.test_client().post(URL, json={"subscription": sub.to_json()})
    old_app.extensions["portal.db"].engine.dispose()
    app = _app(settings, clock, {1: K1, 2: K2}, 2)
    engine = app.extensions["portal.db"].engine
    keys = current_portal(app).keys

    progress = StopAfterFirstBatch()
    stopped = reseal(app, keys, batch_size=2, progress=progress, stop=progress.stop)

    assert (progress.totals, progress.batches) == ([5], [2])
    assert (stopped.processed, stopped.changed) == (2, 2)
    versions = sorted(r["auth_key_version"] for r in all_rows(engine, "push_subscription"))
    assert versions == [1, 1, 1, 2, 2]
    assert reseal(app, keys, batch_size=2, progress=NoProgress()).changed == 3
    versions = {r["auth_key_version"] for r in all_rows(engine, "push_subscription")}
    assert versions == {2}
    engine.dispose()


def test_unknown_version_is_reported_and_the_rest_still_move(settings, clock, subscriptions):
    app = _app(settings, clock, {1: K1, 2: K2}, 1)
    engine = app.extensions["portal.db"].engine
    subs = [subscriptions() for _ in range(5)]
    for sub in subs:
        app.test_client().post(URL, json={"subscription": sub.to_json()})
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET auth_key_version = 9 WHERE endpoint = :e"),
            {"e": subs[2].endpoint},
        )
    engine.dispose()

    rotated = _app(settings, clock, {1: K1, 2: K2}, 2)
    runner = rotated.test_cli_runner()
    result = runner.invoke(args=["portal", "run-job", "reseal"])
    assert result.exit_code == 1
    assert "reseal: 5 rows looked at, 4 changed, 1 problems" in result.output
    assert "no data key for auth_key_version 9" in result.output
    engine = rotated.extensions["portal.db"].engine
    versions = {r["endpoint"]: r["auth_key_version"] for r in all_rows(engine, "push_subscription")}
    assert versions.pop(subs[2].endpoint) == 9
    assert set(versions.values()) == {2}
    engine.dispose()


def test_unknown_version_row_fails_alone_when_opened(settings, clock):
    ring = KeyRing({2: K2}, 2)
    with pytest.raises(UnknownKeyVersion, match="auth_key_version 1"):
        ring.open(KeyRing({1: K1}, 1).seal(os.urandom(16)).sealed, 1)


def test_run_job_rejects_an_unknown_name(app):
    result = app.test_cli_runner().invoke(args=["portal", "run-job", "nope"])
    assert result.exit_code != 0
    assert "unknown job" in result.output


class _Interrupted(Exception):
    pass


class _Recording:
    """Progress as the job reports it; optionally stops the job (an operator's Ctrl-C, a
    killed process) after some batches have committed."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.total: int | None = None
        self.batches: list[int] = []
        self.stop_after = stop_after

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, count: int) -> None:
        self.batches.append(count)
        if self.stop_after is not None and len(self.batches) >= self.stop_after:
            raise _Interrupted


def test_reseal_goes_in_chunks_and_picks_up_after_an_interruption(settings, clock, subscriptions):
    from portal.subscriptions.jobs import reseal

    old_app = _app(settings, clock, {1: K1}, 1)
    subs = [subscriptions() for _ in range(5)]
    for sub in subs:
        assert (
            old_app.test_client().post(URL, json={"subscription": sub.to_json()}).status_code == 201
        )
    old_app.extensions["portal.db"].engine.dispose()
    app = _app(settings, clock, {1: K1, 2: K2}, 2)
    engine = app.extensions["portal.db"].engine
    keys = current_portal(app).keys

    stopped = _Recording(stop_after=1)
    with pytest.raises(_Interrupted):
        reseal(app, keys, batch_size=2, progress=stopped)
    assert (stopped.total, stopped.batches) == (5, [2])
    rows = all_rows(engine, "push_subscription")
    assert sorted(r["auth_key_version"] for r in rows) == [1, 1, 1, 2, 2]
    by_endpoint = {r["endpoint"]: r for r in rows}
    for sub in subs:  # every row opens, whichever version it is under
        row = by_endpoint[sub.endpoint]
        assert keys.open(bytes(row["auth_sealed"]), row["auth_key_version"]) == sub.auth

    resumed = _Recording()
    report = reseal(app, keys, batch_size=2, progress=resumed)
    assert (resumed.total, resumed.batches) == (3, [2, 1])  # only what was left
    assert (report.processed, report.changed, report.problems) == (3, 3, [])
    for row in all_rows(engine, "push_subscription"):
        assert row["auth_key_version"] == 2
    engine.dispose()
