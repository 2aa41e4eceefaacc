"""The SQLite database on disk: readable by the portal's own user only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import sqlalchemy as sa

from portal.config import Settings
from portal.db import create_engine
from portal.migrate import upgrade


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
