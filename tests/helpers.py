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


def error_summary(html: str) -> list[tuple[str, str]]:
    """The error summary's (anchor, message) links, in order; empty without a summary."""
    import html as htmllib

    if 'class="error-summary"' not in html:
        return []
    start = html.index('class="error-summary"')
    block = html[start : html.index("</div>", start)]
    return [
        (anchor, htmllib.unescape(text))
        for anchor, text in re.findall(r'<a href="#([\w-]+)">([^<]+)</a>', block)
    ]


def field_error(html: str, field_id: str) -> str | None:
    """The error message shown at one field, or None."""
    import html as htmllib

    match = re.search(
        rf'<p class="field-error" id="{re.escape(field_id)}-error">.*?</span> ([^<]+)</p>',
        html,
        re.S,
    )
    return htmllib.unescape(match.group(1).strip()) if match else None


class Unchanged:
    """Every table's row count and contents, taken now, to compare with later."""

    def __init__(self, engine: sa.Engine) -> None:
        from tests.api.guard import TableDigest

        self.digest = TableDigest(engine)
        self.before = self.digest.take()

    def changed(self) -> list[str]:
        after = self.digest.take()
        return sorted(t for t in self.before if self.before[t] != after[t])
