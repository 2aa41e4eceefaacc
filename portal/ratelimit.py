"""Rate limits: fixed windows counted in the database.

On the JSON API two limits, each per route: requests from one client address, and
requests naming one push subscription endpoint; and consent receipts per subscriber.
The counters live in ``rate_limit_counter`` so every worker process of every server
shares them; one atomic upsert per check counts the request and reads the total. Keys
are HMACs (the secret key as pepper) of what is counted, so client addresses are never
stored. A refused request answers 429 with Retry-After.

Each count is its own transaction, committed at once, unless the route asks for its
counts to join the request's own transaction (:func:`count_in_the_request`): a route
that writes one row per request (a notification receipt) then costs one write
transaction, not three. Should that request be refused (any 4xx or 5xx answer), what it
wrote is rolled back and its counts are written again on their own, so a refused request
still counts, once.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import ipaddress
import logging
import math
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

import sqlalchemy as sa
from flask import Flask, Response, current_app, g, request
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapped, mapped_column

from portal.batches import delete_batches
from portal.consent.log import lock_subscriber, subscriber_lock_text
from portal.db import Base, UTCDateTime, db
from portal.errors import ApiError
from portal.identity import device_from_cookie
from portal.jobreport import JobReport, Progress
from portal.seams import current_portal
from portal.subscriptions.validation import endpoint_hash

log = logging.getLogger("portal.ratelimit")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class RateLimitCounter(Base):
    """Requests counted in the current window for one key (kind, route, who)."""

    __tablename__ = "rate_limit_counter"

    key: Mapped[bytes] = mapped_column(sa.LargeBinary(32), primary_key=True)
    window_start: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    hits: Mapped[int] = mapped_column(sa.Integer, nullable=False)

    __table_args__ = (
        sa.CheckConstraint("hits >= 1", name="hits_positive"),
        sa.CheckConstraint("length(key) = 32", name="key_len"),
        sa.Index("ix_rate_limit_counter_window_start", "window_start"),
    )


_COUNTER = cast(sa.Table, RateLimitCounter.__table__)


class Kind(StrEnum):
    ADDRESS = "address"
    ENDPOINT = "endpoint"
    SUBSCRIBER = "subscriber"


@dataclass(frozen=True)
class Verdict:
    hits: int
    limit: int
    retry_after: int  # whole seconds until the window ends

    @property
    def allowed(self) -> bool:
        return self.hits <= self.limit


def window_start(now: dt.datetime, window_seconds: int) -> dt.datetime:
    """The start of the fixed window ``now`` falls in (windows align to the epoch)."""
    elapsed = int((now - _EPOCH).total_seconds())
    return _EPOCH + dt.timedelta(seconds=elapsed - elapsed % window_seconds)


def counter_key(pepper: bytes, kind: Kind, route: str, value: bytes) -> bytes:
    return hmac.new(
        pepper, b"\0".join((kind.encode(), route.encode(), value)), hashlib.sha256
    ).digest()


def _upsert(dialect: str) -> sa.Insert:
    # The ones are SQL, not parameters: the statement's only parameters are its key and
    # window, so its text can carry another statement (count_save_and_lock).
    one = sa.literal_column("1", sa.Integer)
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_COUNTER).values(
        key=sa.bindparam("key"), window_start=sa.bindparam("window_start"), hits=one
    )
    same_window = _COUNTER.c.window_start == insert.excluded.window_start
    return insert.on_conflict_do_update(
        index_elements=[_COUNTER.c.key],
        set_={
            # A new window starts the count again; the row is reused, not added.
            "hits": sa.case((same_window, _COUNTER.c.hits + one), else_=one),
            "window_start": insert.excluded.window_start,
        },
    ).returning(_COUNTER.c.hits)


# Built once per dialect: the check runs on every API request.
_UPSERTS = {dialect: _upsert(dialect) for dialect in ("postgresql", "sqlite")}


def hit(
    connection: Connection, key: bytes, *, now: dt.datetime, window_seconds: int, limit: int
) -> Verdict:
    """Count one request against ``key`` and say whether it is within ``limit``."""
    start = window_start(now, window_seconds)
    statement = _UPSERTS[connection.dialect.name]
    hits = connection.execute(statement, {"key": key, "window_start": start}).scalar_one()
    return _verdict(hits, limit=limit, now=now, start=start, window_seconds=window_seconds)


def _verdict(
    hits: int, *, limit: int, now: dt.datetime, start: dt.datetime, window_seconds: int
) -> Verdict:
    ends = start + dt.timedelta(seconds=window_seconds)
    retry_after = max(1, math.ceil((ends - now).total_seconds()))
    return Verdict(hits=hits, limit=limit, retry_after=retry_after)


def ended_windows(now: dt.datetime, window_seconds: int) -> sa.ColumnElement[bool]:
    """The counters of windows that have ended: nothing reads them again."""
    return _COUNTER.c.window_start < window_start(now, window_seconds)


# Endpoints (``blueprint.view``) whose counts are written in the request's transaction.
_IN_THE_REQUEST: set[str] = set()


def count_in_the_request(endpoint: str) -> None:
    """Count this endpoint's requests in the request's own transaction (``db.session``),
    which its view commits: one write transaction per request. The view must write
    nothing before a refusal it raises (it is rolled back, and the counts written again
    alone)."""
    _IN_THE_REQUEST.add(endpoint)


@dataclass(frozen=True)
class _Count:
    key: bytes
    window_seconds: int
    limit: int
    # Written again alone when the request is refused (4xx/5xx): a flood of refused
    # requests still spends the budget. Off where only what the request did counts.
    refused_counts: bool = True


def tally(kind: Kind, value: bytes, limit: int, *, refused_counts: bool = True) -> Verdict | None:
    """Count this request against ``value`` on this route; None when the limit is off.
    ``refused_counts=False`` (routes that count in the request only): a request answered
    4xx/5xx is not counted, so a refused one changes nothing."""
    if limit <= 0:
        return None
    settings = current_portal().settings.rate_limit
    counted = _Count(_key(kind, value), settings.window_seconds, limit, refused_counts)
    if request.endpoint in _IN_THE_REQUEST:
        # Joins the view's transaction; written again alone if the request is refused.
        g.setdefault("_rate_counts", []).append(counted)
        verdict = _hit(db.session.connection(), counted)
    else:
        # Its own transaction, committed at once: a request refused later still counts,
        # and the view's rollback never undoes the count.
        verdict = _count_alone([counted])
    return verdict


def _key(kind: Kind, value: bytes) -> bytes:
    """This request's counter for ``value``: on its route, peppered with the secret key."""
    pepper = current_app.config["SECRET_KEY"].encode()
    return counter_key(pepper, kind, request.endpoint or request.path, value)


def _check(kind: Kind, value: bytes, limit: int) -> None:
    verdict = tally(kind, value, limit)
    if verdict is not None and not verdict.allowed:
        log.info("rate limit reached: %s on %s", kind.value, request.endpoint)
        raise ApiError(
            "rate_limited",
            f"too many requests: try again in {verdict.retry_after} seconds",
            status=429,
            headers={"Retry-After": str(verdict.retry_after)},
        )


def _hit(connection: Connection, count: _Count) -> Verdict:
    return hit(
        connection,
        count.key,
        now=current_portal().clock.now(),
        window_seconds=count.window_seconds,
        limit=count.limit,
    )


def _count_alone(counts: list[_Count]) -> Verdict:
    """The counts in one transaction of their own; the last one's verdict."""
    with db.engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # A count lost to a crash costs nothing; waiting for the disk on every API
            # request would.
            connection.exec_driver_sql("SET LOCAL synchronous_commit = off")
        verdicts = [_hit(connection, count) for count in counts]
    return verdicts[-1]


def _refused_still_counts(response: Response) -> Response:
    """A refused request whose counts were in its own transaction: that transaction is
    rolled back (with anything the view wrote) and the counts written alone, but those
    of routes where a refusal is not counted (``refused_counts=False``), which go with
    the rollback."""
    counts = [count for count in g.pop("_rate_counts", []) if count.refused_counts]
    if counts and response.status_code >= 400:
        try:
            db.session.rollback()
            _count_alone(counts)
        except sa.exc.SQLAlchemyError:
            # The database went away (this answer may be its 503): a count lost to an
            # outage costs nothing, and the answer stands.
            log.warning("could not count a refused request", exc_info=True)
    return response


def limit_endpoint(endpoint: str) -> None:
    """Count a request naming this push subscription endpoint (429 past the limit), in
    the budget of whoever asks: the browser whose signed device cookie the request
    carries, or everyone without one together. Someone who knows an endpoint spends only
    their own budget, never that of the browser holding the subscription, which could
    otherwise be kept from unsubscribing by 61 requests a minute (SPEC §4: knowing an
    endpoint reveals and changes nothing)."""
    limit = current_portal().settings.rate_limit.per_endpoint
    device = device_from_cookie(request)
    who = device.bytes if device is not None else b""
    _check(Kind.ENDPOINT, endpoint_hash(endpoint) + who, limit)


def receipt_verdict(subscriber_id: uuid.UUID) -> Verdict | None:
    """Count one consent receipt for this subscriber (``RATE_LIMIT_RECEIPTS``): each is
    signed and carries proofs, so a loop on the link must not buy unbounded work."""
    return tally(
        Kind.SUBSCRIBER, subscriber_id.bytes, current_portal().settings.rate_limit.receipts
    )


def save_verdict(subscriber_id: uuid.UUID) -> Verdict | None:
    """Count one preference-centre form save for this subscriber (``RATE_LIMIT_SAVES``),
    on routes that count in the request (:func:`count_in_the_request`): the count commits
    with the save, and waits only on that person's own saves, which take turns on their
    row lock anyway. Each save may append consent events, kept for good: a loop on the
    form must not write without bound. A save refused (bad input, or this limit) is not
    counted: it wrote nothing, and the person's budget is spent only by what was saved."""
    return tally(
        Kind.SUBSCRIBER,
        subscriber_id.bytes,
        current_portal().settings.rate_limit.saves,
        refused_counts=False,
    )


@functools.lru_cache(maxsize=4)
def _count_and_lock_text(dialect: sa.Dialect) -> str:
    """The save's count and the person's lock in one statement: the count's upsert as a
    CTE (run whatever the rest finds), the lock joined to it, so the count comes back
    whether or not the person is still there."""
    upsert = str(_UPSERTS["postgresql"].compile(dialect=dialect))
    # Both parts are the project's own compiled statements: no value is in the text.
    return (
        f"WITH counted AS ({upsert}) SELECT counted.hits FROM counted"  # noqa: S608
        f" LEFT JOIN LATERAL ({subscriber_lock_text(dialect)}) AS locked ON true"
    )


def count_save_and_lock(subscriber_id: uuid.UUID) -> Verdict | None:
    """:func:`save_verdict` and :func:`portal.consent.log.lock_subscriber` for a form
    that records decisions, in one round trip on PostgreSQL: a save's statements are
    each a round trip on a machine serving many, and the count on its own cost a save
    about a tenth of its rate (bench/pages.py). Counted first, then locked, as every
    save of that form does, so two saves cannot wait on each other the other way round.
    Elsewhere (SQLite, whose lock is the write lock taken at BEGIN), the two in turn."""
    portal = current_portal()
    settings = portal.settings.rate_limit
    connection = db.session.connection()
    if settings.saves <= 0 or connection.dialect.name != "postgresql":
        lock_subscriber(db.session, subscriber_id)
        return save_verdict(subscriber_id)
    now = portal.clock.now()
    start = window_start(now, settings.window_seconds)
    hits = connection.exec_driver_sql(
        _count_and_lock_text(connection.dialect),
        {
            "key": _key(Kind.SUBSCRIBER, subscriber_id.bytes),
            "window_start": start,
            "id": subscriber_id,
        },
    ).scalar_one()
    return _verdict(
        hits, limit=settings.saves, now=now, start=start, window_seconds=settings.window_seconds
    )


def client_network(address: str | None) -> bytes:
    """What one client's requests are counted under: an IPv4 address (an IPv4-mapped
    IPv6 one included) alone, an IPv6 address by its /64, the least a home or a phone
    is given, so that the 2**64 addresses of one network are one budget, not 2**64."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return (address or "unknown").encode()
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped).encode()
        return str(ipaddress.IPv6Network((ip, 64), strict=False)).encode()
    return str(ip).encode()


def _limit_address() -> None:
    if request.endpoint is None or not request.path.startswith("/api/"):
        return
    limit = current_portal().settings.rate_limit.per_address
    _check(Kind.ADDRESS, client_network(request.remote_addr), limit)


def init_app(app: Flask) -> None:
    # Before the blueprints' own checks, so a flood is refused before any other work.
    app.before_request(_limit_address)
    app.after_request(_refused_still_counts)


def prune_job(app: Flask, progress: Progress) -> JobReport:
    """Delete the counters of ended windows, in keyset batches like every sweep."""
    portal = current_portal(app)
    report = JobReport("rate-limit-prune")
    delete_batches(
        app,
        _COUNTER,
        ended_windows(portal.clock.now(), portal.settings.rate_limit.window_seconds),
        batch_size=portal.settings.retention.batch_size,
        progress=progress,
        stop=app.extensions.get("portal.stop"),
        report=report,
    )
    return report
