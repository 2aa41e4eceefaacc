"""Small helpers shared by tests."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa


def count_rows(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()


def all_rows(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.text(f"SELECT * FROM {table}"))]


def post_json(client: Any, url: str, body: Any, **kwargs: Any) -> Any:
    return client.post(url, json=body, **kwargs)


def csrf_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no CSRF token"
    return match.group(1)
