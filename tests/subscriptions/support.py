"""What the subscription tests share: a person's subscription, and what an attack must not change."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask.testing import FlaskClient

from tests.factories import BrowserSubscription
from tests.helpers import all_rows

SUBSCRIBE = "/api/push/subscribe"
# What an attacker's request must leave exactly as it was.
TABLES = ("push_subscription", "subscriber", "consent_event", "topic_preference")
WRONG_AUTH = "AAAAAAAAAAAAAAAAAAAAAA"  # 16 zero bytes: well-formed, and nobody's secret


@dataclass
class Holder:
    """A browser (its cookies in ``client``) and the subscription it holds."""

    client: FlaskClient
    sub: BrowserSubscription


def snapshot(engine) -> dict[str, list[dict[str, Any]]]:
    return {table: all_rows(engine, table) for table in TABLES}


def set_subscription(engine, **values: Any) -> None:
    """Set columns of the (only) subscription row directly."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET " + ", ".join(f"{k} = :{k}" for k in values)),
            values,
        )


def put_in_state(engine, state: str, when: dt.datetime, *, end_reason: str | None = None) -> None:
    """The subscription as it would be in ``state`` (a tombstone too), last seen at ``when``."""
    if state == "tombstone":
        set_subscription(
            engine,
            state="revoked",
            **({"end_reason": end_reason} if end_reason else {}),
            endpoint=None,
            p256dh=None,
            auth_sealed=None,
            deleted_at=when,
            last_seen_at=when,
        )
    else:
        set_subscription(engine, state=state, last_seen_at=when)
