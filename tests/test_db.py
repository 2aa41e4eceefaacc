"""The SQLite database on disk: readable by the portal's own user only."""

from __future__ import annotations

import datetime as dt
import importlib
import os
import stat
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from portal.config import Settings
from portal.db import create_engine, uuid7
from portal.migrate import upgrade

# The module itself: the package's ``db`` attribute is the extension, not this module.
portal_db = importlib.import_module("portal.db")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask():
    """The usual umask (group and others may read): the portal must not rely on it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_development_database_and_its_wal_are_private(tmp_path, loose_umask):
    instance = tmp_path / "instance"
    settings = Settings.from_env({}, str(instance))  # the development default: SQLite here
    engine = create_engine(settings.database_url)
    try:
        upgrade(engine)
        with engine.connect() as conn:  # a reader keeps the WAL and its index in place
            conn.execute(sa.text("SELECT count(*) FROM subscriber")).scalar_one()
            database = instance / "portal.sqlite3"
            wal = instance / "portal.sqlite3-wal"
            shm = instance / "portal.sqlite3-shm"
            assert wal.exists() and shm.exists()
            assert _mode(instance) == 0o700
            assert {p.name: _mode(p) for p in (database, wal, shm)} == {
                "portal.sqlite3": 0o600,
                "portal.sqlite3-wal": 0o600,
                "portal.sqlite3-shm": 0o600,
            }
    finally:
        engine.dispose()


def test_a_database_file_elsewhere_is_private_too(tmp_path, loose_umask):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    engine = create_engine(f"sqlite:///{folder / 'db.sqlite3'}")
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT x FROM t")).scalar_one()
            for name in ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm"):
                assert _mode(folder / name) == 0o600, name
        assert _mode(folder) == 0o755  # a folder someone else made is theirs to set
    finally:
        engine.dispose()


def test_an_existing_database_left_readable_is_made_private(tmp_path, loose_umask):
    path = tmp_path / "old.sqlite3"
    path.touch()
    path.chmod(0o644)
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1")).scalar_one()
        assert _mode(path) == 0o600
    finally:
        engine.dispose()


def _millis(value: uuid.UUID) -> int:
    return value.int >> 80


def test_ids_made_in_turn_increase_even_within_one_millisecond():
    made = [uuid7() for _ in range(20_000)]
    assert made == sorted(made) and len(set(made)) == len(made)
    # Far more ids than milliseconds went by: many shared one, and still increased.
    assert len({_millis(value) for value in made}) < len(made)
    assert {(value.version, value.variant) for value in made} == {(7, uuid.RFC_4122)}
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    assert now - 5_000 < _millis(made[-1]) <= now + 1


def test_ids_made_at_once_by_threads_are_all_different_and_each_threads_increase():
    def make() -> list[uuid.UUID]:
        return [uuid7() for _ in range(5_000)]

    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: make(), range(4)))
    assert all(run == sorted(run) for run in runs)
    assert len({value for run in runs for value in run}) == 20_000


def test_a_millisecond_of_4096_ids_borrows_the_next(monkeypatch):
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    monkeypatch.setattr(portal_db, "_last_uuid7", [now + 1_000, 4095])
    value = uuid7()
    assert _millis(value) == now + 1_001
    assert (value.int >> 64) & 0xFFF == 0
    assert (value.version, value.variant) == (7, uuid.RFC_4122)
    assert uuid7() > value


def test_the_bytes_a_campaign_splits_by_stay_random_in_a_burst():
    """Ids made faster than the clock moves still differ in every random byte: the
    counter is kept in the 12 bits after the milliseconds, not in the bytes 9-15 that
    split a campaign's audience (portal/campaigns/variants.py)."""
    made = [uuid7() for _ in range(30_000)]
    for position in range(9, 16):
        counts = Counter(value.bytes[position] for value in made)
        # 256 values, about 117 each: a byte that counted or stood still would not be.
        assert len(counts) == 256 and max(counts.values()) < 200, position


def test_an_id_for_a_given_time_carries_that_time_and_leaves_the_order_of_now_alone():
    before = uuid7()
    at = dt.datetime(2031, 3, 1, 12, 0, 0, 250_000, tzinfo=dt.UTC)
    placed = uuid7(at=at)
    assert _millis(placed) == int(at.timestamp() * 1000)
    assert dt.datetime(2020, 1, 1, tzinfo=dt.UTC) < dt.datetime.now(dt.UTC) < at
    assert before < uuid7() < placed
