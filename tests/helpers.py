"""Small helpers shared by tests."""

from __future__ import annotations

import re
import threading
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


class StopAfterFirstBatch:
    """A job's progress hook that asks the job to stop once its first batch is done, as
    the scheduler does when its process shuts down mid-run."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.totals: list[int] = []
        self.batches: list[int] = []

    def start(self, total: int) -> None:
        self.totals.append(total)

    def advance(self, count: int) -> None:
        self.batches.append(count)
        self.stop.set()


def confirm_account_link(client: Any, assertion: str, **kwargs: Any) -> Any:
    """Open a host product's sign-in link and confirm it, as the person would: the link
    only asks; the confirmation page's form (with its CSRF token) links."""
    opened = client.get(f"/preferences?assertion={assertion}", **kwargs)
    if opened.status_code != 303 or not opened.headers["Location"].endswith("/preferences/link"):
        return opened
    page = client.get("/preferences/link", **kwargs)
    return client.post(
        "/preferences/link",
        data={"csrf_token": csrf_token(page.text), "action": "link"},
        **kwargs,
    )
