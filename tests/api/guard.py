"""The fuzzing's oracle: no 5xx, the error shape on every 4xx, and nothing written by a
refused request.

Each request is bracketed by a digest of every table (row count and a hash of the
contents); the digest after one request is the digest before the next, since nothing
else writes while the fuzzing runs (the scheduler is off).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from portal.db import is_postgres

# A signed digest that is refused is recorded on purpose (reason and counts, never the
# body) for the operations page: the one write a refusal may make.
FEEDBACK_DIGESTS = "feedback_digest"


class TableDigest:
    """Row count and contents of every table, read in one statement."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        inspector = sa.inspect(engine)
        names = sorted(n for n in inspector.get_table_names() if n != "alembic_version")
        with engine.connect() as conn:
            postgres = is_postgres(conn)
        parts = []
        for table in names:
            if postgres:
                # Each row as its text form, hashed in the database: one short answer.
                parts.append(
                    f"SELECT '{table}', count(*), md5(coalesce(string_agg(r::text, E'\\n' "
                    f"ORDER BY r::text), '')) FROM \"{table}\" r"
                )
            else:
                columns = [c["name"] for c in inspector.get_columns(table)]
                row = " || '|' || ".join(f'quote("{c}")' for c in columns)
                parts.append(
                    f"SELECT '{table}', count(*), coalesce(group_concat(line, char(10)), '') "
                    f'FROM (SELECT {row} AS line FROM "{table}" ORDER BY 1)'
                )
        self.statement = " UNION ALL ".join(parts)

    def take(self) -> dict[str, tuple[int, str]]:
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(self.statement)
            rows = cursor.fetchall()
            connection.rollback()
        finally:
            connection.close()
        return {
            table: (count, hashlib.md5(str(contents).encode()).hexdigest())
            for table, count, contents in rows
        }


def is_error_shape(body: Any) -> bool:
    if not isinstance(body, dict) or set(body) != {"error"}:
        return False
    error = body["error"]
    if not isinstance(error, dict) or not {"code", "message"} <= set(error) <= {
        "code",
        "message",
        "field",
    }:
        return False
    return all(isinstance(error[k], str) and error[k] for k in error)


@dataclass
class Guard:
    """Checks every answer; counts requests, statuses and time."""

    engine: sa.Engine
    digest: TableDigest = field(init=False)
    before: dict[str, tuple[int, str]] = field(init=False)
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.digest = TableDigest(self.engine)
        self.before = self.digest.take()

    def check(
        self,
        status: int,
        content_type: str | None,
        data: bytes,
        what: str,
        *,
        has_body: bool = True,
    ) -> None:
        self.requests += 1
        self.statuses[status] += 1
        after = self.digest.take()
        before, self.before = self.before, after
        assert status < 500, f"{what} answered {status}: {data[:500]!r}"
        if status < 400:
            return
        assert content_type == "application/json", f"{what} answered {status} as {content_type}"
        code = None
        if has_body:
            body = json.loads(data)
            assert is_error_shape(body), f"{what} answered {status} with {body!r}"
            code = body["error"]["code"]
        self._assert_nothing_written(before, after, code, what)

    def _assert_nothing_written(
        self,
        before: dict[str, tuple[int, str]],
        after: dict[str, tuple[int, str]],
        code: str | None,
        what: str,
    ) -> None:
        changed = sorted(t for t in before if before[t] != after[t])
        if changed == [FEEDBACK_DIGESTS]:
            # Only the record of a refused, signed digest, and exactly one of them.
            assert after[FEEDBACK_DIGESTS][0] == before[FEEDBACK_DIGESTS][0] + 1, what
            with self.engine.connect() as conn:
                results = conn.execute(
                    sa.text(f"SELECT result, reason FROM {FEEDBACK_DIGESTS}")
                ).all()
            assert ("rejected", code) in [tuple(r) for r in results], what
            return
        assert not changed, f"{what} was refused ({code}) but changed {changed}"

    def summary(self) -> str:
        elapsed = time.perf_counter() - self.started
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return f"{self.requests} requests in {elapsed:.1f} s ({statuses})"
