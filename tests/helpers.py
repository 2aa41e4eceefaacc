"""Small helpers shared by tests."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

# Every statement but transaction control (SQLite's BEGIN IMMEDIATE, portal/db.py).
QUERIES = re.compile(r"(?!BEGIN)")


@contextmanager
def sent_statements(
    engine: sa.Engine, pattern: re.Pattern[str] = QUERIES
) -> Iterator[list[tuple[str, Any]]]:
    """The statements ``engine`` sends inside the block that ``pattern`` matches (from
    their start), each with its parameters, in order."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if pattern.match(statement):
            seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)


def count_rows(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()


def all_rows(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` in primary-key order.

    Without ORDER BY, PostgreSQL returns heap order, and a row updated after it was
    inserted (a job run finishing) moves behind later ones.
    """
    with engine.connect() as conn:
        key = sa.inspect(conn).get_pk_constraint(table)["constrained_columns"]
        order = f" ORDER BY {', '.join(key)}" if key else ""
        return [dict(r._mapping) for r in conn.execute(sa.text(f"SELECT * FROM {table}{order}"))]


def post_json(client: Any, url: str, body: Any, **kwargs: Any) -> Any:
    return client.post(url, json=body, **kwargs)


def csrf_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no CSRF token"
    return match.group(1)


def save_choices(
    browser: Any,
    html: str,
    *,
    visible: list[str],
    topics: list[str],
    policy_version: str = "v1",
) -> Any:
    """The preference centre's form as a browser sends it from the page ``html``: its
    CSRF token, the notice version it showed, the topics it showed and those ticked."""
    return browser.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(html),
            "policy_version": policy_version,
            "visible": visible,
            "topics": topics,
        },
    )


def stored_preferences(engine: sa.Engine) -> dict[str, str]:
    """Every stored preference as topic slug → state (one person's, in tests of one)."""
    with engine.connect() as conn:
        return dict(
            conn.execute(
                sa.text(
                    "SELECT t.slug, p.state FROM topic_preference p "
                    "JOIN topic t ON t.id = p.topic_id"
                )
            ).all()
        )


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


def subscribe_browser(app: Any, client: Any, subscription: Any) -> Any:
    """Subscribe ``subscription`` as the browser ``client`` (its cookies kept there);
    the id of the subscription row it made."""
    from portal.db import db
    from portal.subscriptions.models import PushSubscription
    from portal.subscriptions.validation import endpoint_hash

    answer = client.post("/api/push/subscribe", json={"subscription": subscription.to_json()})
    assert answer.status_code == 201, answer.json
    with db.begin(app) as session:
        return session.execute(
            sa.select(PushSubscription.id).where(
                PushSubscription.endpoint_hash == endpoint_hash(subscription.endpoint)
            )
        ).scalar_one()


def chunked_environ(path: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    """A WSGI environ for ``body`` POSTed to ``path`` chunked, as gunicorn hands such a
    request on: no Content-Length, and the server ends the stream
    (``wsgi.input_terminated``)."""
    import io

    from werkzeug.test import EnvironBuilder

    environ = EnvironBuilder(
        path=path, method="POST", input_stream=io.BytesIO(body), headers=headers
    ).get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    environ["wsgi.input_terminated"] = True
    return environ


def record_delivery(
    session: Any,
    subscription_id: Any,
    *,
    now: Any,
    delivery_id: int | None = None,
    actions: list[dict[str, str]] | None = None,
) -> str:
    """One of our deliveries to a subscription, as the sender records it (a campaign on
    the first topic, made when there is none, with ``actions`` as its buttons); returns
    its ``deliveryId``. A test that chose the id (a push it sends itself) names it."""
    from portal.campaigns.models import Campaign
    from portal.consent import catalogue
    from portal.consent.models import Topic
    from portal.delivery.models import Delivery

    topic_id = session.execute(sa.select(Topic.id).order_by(Topic.id).limit(1)).scalar()
    if topic_id is None:
        topic_id = catalogue.add_topic(
            session, slug="deliveries", category="News", label="News", now=now
        ).id
    campaign = Campaign(
        topic_id=topic_id,
        title="Hello",
        body="Hello",
        send_at=now,
        status="sending",
        created_by="test",
        created_at=now,
        actions=actions,
    )
    session.add(campaign)
    session.flush()
    delivery = Delivery(
        id=delivery_id,
        campaign_id=campaign.id,
        subscription_id=subscription_id,
        push_service="fcm",
        status="accepted",
        attempts=1,
        next_attempt_at=now,
        consent_reason="opt_in",
        updated_at=now,
    )
    session.add(delivery)
    session.flush()
    return str(delivery.id)


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


def without_cell_labels(html: str) -> str:
    """A page's HTML without the ``data-label`` each stacked-table cell carries for narrow
    screens (the column's name, shown before the value there), so a test can read cells as
    ``<td>value</td>``."""
    return re.sub(r' data-label="[^"]*"', "", html)


def sequence(app: Any) -> Any:
    """Run the consent log's sequencer once (what the scheduler does every second)."""
    from portal.consent.jobs import sequence_once

    return sequence_once(app)
