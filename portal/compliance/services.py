"""Compliance rules: finding a person's consent history, what it shows, exports, erasure.

Look-ups by endpoint hash the endpoint at once and keep only the hash: the endpoint is
never stored, logged or written to the audit trail (a look-up records how it searched
and whom it found, never the value it searched with).
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.campaigns import unsent
from portal.campaigns.models import Campaign
from portal.compliance.export import ExportFilter, ExportPlan, plan_export
from portal.consent import catalogue
from portal.consent.jobs import integrate_in
from portal.consent.log import Context, event_leaf_hash
from portal.consent.models import ConsentEvent, DecisionWeek, EventKind, Source, Topic
from portal.consent.preferences import Reason, TopicView, topic_views
from portal.db import is_postgres
from portal.delivery.models import Delivery
from portal.inputs import text_problem
from portal.operations.models import JobRun, JobState
from portal.retention.services import (
    ErasureReceipt,
    erase_subscriber,
    erasure_by_receipt_id,
    receipt_id,
)
from portal.staff import audit
from portal.staff.models import StaffUser
from portal.subscriptions import reference
from portal.subscriptions.models import EndReason, PushSubscription, Subscriber
from portal.subscriptions.services import find_by_endpoint
from portal.useragent import family


class Action:
    LOOKED_UP = "consent.looked_up"
    HISTORY_VIEWED = "consent.history_viewed"
    EXPORTED = "consent.exported"
    ERASED = "subscriber.erased"
    LOG_VERIFICATION = "consent.log_verification_requested"


audit.register_action(Action.LOOKED_UP, "Consent look-up")
audit.register_action(Action.HISTORY_VIEWED, "Consent history viewed")
audit.register_action(Action.EXPORTED, "Consent history exported")
audit.register_action(Action.ERASED, "Subscriber erased by staff")
audit.register_action(Action.LOG_VERIFICATION, "Consent log check requested")

VERIFY_JOB = "verify-log"
HISTORY_LIMIT = 2000
DELIVERY_LIMIT = 500


class LookupKind(enum.StrEnum):
    EXTERNAL_USER_ID = "external_user_id"
    SUBSCRIBER_ID = "subscriber_id"
    ENDPOINT = "endpoint"


LOOKUP_LABELS = {
    LookupKind.EXTERNAL_USER_ID: "External user ID",
    LookupKind.SUBSCRIBER_ID: "Subscriber ID",
    LookupKind.ENDPOINT: "Push endpoint",
}


def subscriber_target(subscriber_id: uuid.UUID) -> str:
    return f"subscriber:{subscriber_id}"


def find_subscriber(
    session: Session, kind: LookupKind, value: str, *, actor: audit.Actor | None
) -> uuid.UUID | None:
    """The subscriber a value names, or None; audited either way (without the value)."""
    value = value.strip()
    found: uuid.UUID | None = None
    if kind is LookupKind.ENDPOINT:
        # However it is spelled: by its canonical form's hash (only hashes go further).
        sub = find_by_endpoint(session, value)
        del value
        found = sub.subscriber_id if sub is not None else None
    elif kind is LookupKind.EXTERNAL_USER_ID:
        found = session.execute(
            sa.select(Subscriber.id).where(Subscriber.external_user_id == value)
        ).scalar_one_or_none()
    else:
        try:
            wanted = uuid.UUID(value)
        except ValueError:
            wanted = None
        if wanted is not None and known_subscriber(session, wanted):
            found = wanted
    audit.record(
        session,
        actor,
        Action.LOOKED_UP,
        subscriber_target(found) if found else None,
        {"by": kind.value, "found": found is not None},
    )
    return found


# -- the search: by reference, account ID or its start, subscriber ID, erasure receipt ID --

PAGE_SIZE = 20
PREFIX_MINIMUM = 3  # shorter, an account ID prefix would list almost everyone
QUERY_MAXIMUM = 255  # the longest external user ID
PAGE_MAXIMUM = 999_999
# A prefix's matches counted and listed at most. A start as broad as "use" among millions
# of account IDs would otherwise be counted and sorted in full at every page; past this
# many the page says that more match and asks for more of the ID.
PREFIX_LISTED = 1_000


class SearchRefused(ValueError):
    """A search the look-up will not run, with the words for the officer and the status."""

    def __init__(self, message: str, status: int = 422, field: str = "q") -> None:
        super().__init__(message)
        self.message, self.status, self.field = message, status, field


class Match(enum.StrEnum):
    SUBSCRIBER_ID = "subscriber_id"
    REFERENCE = "reference"
    RECEIPT = "erasure_receipt"
    ACCOUNT_ID = "external_user_id"
    ACCOUNT_PREFIX = "external_user_id_prefix"


MATCH_LABELS = {
    Match.SUBSCRIBER_ID: "Subscriber ID",
    Match.REFERENCE: "Reference",
    Match.RECEIPT: "Erasure receipt ID",
    Match.ACCOUNT_ID: "Account ID",
    Match.ACCOUNT_PREFIX: "Start of the account ID",
}


@dataclass(frozen=True)
class Found:
    subscriber_id: uuid.UUID
    external_user_id: str | None
    reference: str | None  # as people read it
    created_at: dt.datetime
    erased_at: dt.datetime | None
    matched: tuple[Match, ...]

    @property
    def matched_labels(self) -> list[str]:
        return [MATCH_LABELS[m] for m in self.matched]


@dataclass(frozen=True)
class SearchPage:
    query: str
    page: int
    total: int
    results: list[Found]
    size: int = PAGE_SIZE
    # More account IDs start with the text than the PREFIX_LISTED in ``total``.
    more: bool = False

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def first(self) -> int:
        return (self.page - 1) * self.size + 1 if self.results else 0

    @property
    def last(self) -> int:
        return self.first + len(self.results) - 1 if self.results else 0

    @property
    def previous_page(self) -> int | None:
        return self.page - 1 if self.page > 1 else None

    @property
    def next_page(self) -> int | None:
        return self.page + 1 if self.page < self.pages else None


def parse_page(text: str | None) -> int:
    """The page a ``page`` parameter asks for (1 when there is none)."""
    if text is None or text == "":
        return 1
    if not text.isascii() or not text.isdigit() or len(text) > 6 or int(text) < 1:
        raise SearchRefused(
            f"The page is a whole number from 1 to {PAGE_MAXIMUM:,}", status=400, field="page"
        )
    return int(text)


def looks_like_endpoint(text: str) -> bool:
    """A URL, so perhaps a push endpoint: the search refuses it and never shows it back."""
    return "://" in text


@dataclass(frozen=True)
class _Terms:
    """What a search's text is read as."""

    text: str
    subscriber_id: uuid.UUID | None
    reference: str | None  # normalised
    erased: uuid.UUID | None  # whose erasure receipt ID it is
    by_prefix: bool

    def matched(self, row: Any) -> tuple[Match, ...]:
        found = []
        if row.id == self.subscriber_id:
            found.append(Match.SUBSCRIBER_ID)
        if self.reference is not None and row.reference == self.reference:
            found.append(Match.REFERENCE)
        if row.id == self.erased:
            found.append(Match.RECEIPT)
        if row.external_user_id == self.text:
            found.append(Match.ACCOUNT_ID)
        elif row.external_user_id is not None and row.external_user_id.startswith(self.text):
            found.append(Match.ACCOUNT_PREFIX)
        return tuple(found)


def _search_terms(session: Session, query: str, page: int) -> _Terms:
    text = query.strip()
    if not text:
        raise SearchRefused(
            "Enter a reference, an account ID or its start, a subscriber ID or an erasure "
            "receipt ID"
        )
    if len(text) > QUERY_MAXIMUM:
        raise SearchRefused(f"The search is at most {QUERY_MAXIMUM} characters")
    problem = text_problem(text)
    if problem is not None:  # a NUL byte would not even reach PostgreSQL's parser
        raise SearchRefused(f"The search {problem}")
    if looks_like_endpoint(text):
        raise SearchRefused(
            "To look up a push endpoint, use the endpoint form: it keeps the endpoint out of "
            "the address bar"
        )
    if not 1 <= page <= PAGE_MAXIMUM:
        raise SearchRefused(
            f"The page is a whole number from 1 to {PAGE_MAXIMUM:,}", status=400, field="page"
        )
    return _Terms(
        text,
        _uuid_or_none(text),
        reference.normalise(text),
        erasure_by_receipt_id(session, text),
        len(text) >= PREFIX_MINIMUM,
    )


def search_subscribers(
    session: Session, query: str, page: int = 1, *, actor: audit.Actor | None
) -> SearchPage:
    """Everyone ``query`` names, ``PAGE_SIZE`` a page in a stable order — exact matches
    first, then by account ID — each with what it matched. Audited (without the value)
    when it runs; a refused search (``SearchRefused``) writes nothing.

    What the query is read as, all at once: a subscriber ID; a short reference however
    typed; an erasure receipt ID; an account ID, exactly, and by its first characters
    (at least ``PREFIX_MINIMUM``, ``%`` and ``_`` meaning themselves, case as typed).
    A push endpoint is refused: it is looked up by ``find_subscriber``, kept out of URLs.
    """
    terms = _search_terms(session, query, page)
    text = terms.text
    s = cast(sa.Table, Subscriber.__table__)
    exact: list[sa.ColumnElement[bool]] = [s.c.external_user_id == text]
    if terms.subscriber_id is not None:
        exact.append(s.c.id == terms.subscriber_id)
    if terms.reference is not None:
        exact.append(s.c.reference == terms.reference)
    if terms.erased is not None:
        exact.append(s.c.id == terms.erased)
    columns = (s.c.id, s.c.external_user_id, s.c.reference, s.c.created_at, s.c.erased_at)
    # The exact matches are a handful at most (each one a unique key): read whole.
    exact_rows = session.execute(
        sa.select(*columns)
        .where(sa.or_(*exact))
        .order_by(sa.func.coalesce(s.c.external_user_id, ""), s.c.id)
    ).all()
    prefix: sa.ColumnElement[bool] | None = None
    listed, more = 0, False
    if terms.by_prefix:
        starts = [s.c.external_user_id.startswith(text, autoescape=True)]
        if not is_postgres(session):
            # LIKE ignores case on SQLite; a prefix keeps it, as on PostgreSQL. (Not said
            # there: the planner guesses an expression's equality matches 0.5% of rows,
            # and took a sequential scan for a start that matched thousands.)
            starts.append(sa.func.substr(s.c.external_user_id, 1, len(text)) == text)
        if exact_rows:  # each person listed once: the exact matches are listed first
            starts.append(s.c.id.not_in([row.id for row in exact_rows]))
        prefix = sa.and_(*starts)
        # Counted up to one past the cap: the index's range stops there.
        counted = int(
            session.execute(
                sa.select(sa.func.count()).select_from(
                    sa.select(s.c.id).where(prefix).limit(PREFIX_LISTED + 1).subquery()
                )
            ).scalar_one()
        )
        listed, more = min(counted, PREFIX_LISTED), counted > PREFIX_LISTED
    total = len(exact_rows) + listed
    if total == 0 and len(exact) == 1 and not terms.by_prefix:
        raise SearchRefused(
            f"No account ID is exactly “{text}”. To search by the start of an account ID, "
            f"type at least {PREFIX_MINIMUM} characters"
        )
    pages = max(1, -(-total // PAGE_SIZE))
    if page > pages:
        raise SearchRefused(
            f"There is no page {page}: this search has {pages} page{'s' if pages > 1 else ''}",
            status=404,
            field="page",
        )
    offset = (page - 1) * PAGE_SIZE
    rows = list(exact_rows[offset : offset + PAGE_SIZE])
    start = max(0, offset - len(exact_rows))
    wanted = min(PAGE_SIZE - len(rows), listed - start)
    if prefix is not None and wanted > 0:
        rows += session.execute(
            sa.select(*columns)
            .where(prefix)
            .order_by(_in_byte_order(session, s.c.external_user_id))
            .limit(wanted)
            .offset(start)
        ).all()
    results = [
        Found(
            subscriber_id=row.id,
            external_user_id=row.external_user_id,
            reference=reference.display(row.reference) if row.reference else None,
            created_at=row.created_at,
            erased_at=row.erased_at,
            matched=terms.matched(row),
        )
        for row in rows
    ]
    audit.record(
        session,
        actor,
        Action.LOOKED_UP,
        subscriber_target(results[0].subscriber_id) if total == 1 else None,
        {"by": "search", "found": total, "page": page} | ({"more": True} if more else {}),
    )
    return SearchPage(text, page, total, results, more=more)


def _in_byte_order(session: Session, column: sa.Column[Any]) -> sa.ColumnElement[Any]:
    """``column`` ascending, byte by byte, read in that order from its index.

    On PostgreSQL the account ID's prefix index (0035) uses ``text_pattern_ops``, whose
    order is ``~<~``: a plain ORDER BY follows the database's collation, which that index
    does not hold, so every match was read and sorted. SQLite's default collation is
    already byte order. Account IDs are unique: no tie to break."""
    if is_postgres(session):
        return sa.literal_column(f"{column.name} USING ~<~")
    return column


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def known_subscriber(session: Session, subscriber_id: uuid.UUID) -> bool:
    """A subscriber row, or at least consent events under that id."""
    if session.get(Subscriber, subscriber_id) is not None:
        return True
    return (
        session.execute(
            sa.select(ConsentEvent.seq).where(ConsentEvent.subscriber_id == subscriber_id).limit(1)
        ).first()
        is not None
    )


# -- one person's history -------------------------------------------------------------------

KIND_LABELS = {
    EventKind.PREFERENCE_CHANGED: "Preference changed",
    EventKind.PERMISSION_GRANTED: "Notification permission granted",
    EventKind.SUBSCRIBED: "Subscribed",
    EventKind.ENDPOINT_ROTATED: "Endpoint rotated",
    EventKind.REVOKED_BY_PUSH_SERVICE: "Revoked by the push service",
    EventKind.REVOKED_BY_FEEDBACK: "Revoked by delivery feedback",
    EventKind.EXPIRED: "Expired",
    EventKind.UNSUBSCRIBED: "Unsubscribed",
    EventKind.ACCOUNT_LINKED: "Account linked",
    EventKind.ERASED: "Erased",
    EventKind.FREQUENCY_CHOSEN: "How often chosen (frequency cap)",
    EventKind.QUIET_HOURS_CHOSEN: "Quiet hours chosen",
    EventKind.GAP: "Gap closed by the sequencer (a rolled-back sequence number)",
}

# The reason a topic is on or off, in the words a compliance officer uses.
REASON_LABELS = {
    Reason.EXPLICIT_OPT_IN: "Explicit opt-in",
    Reason.EXPLICIT_OPT_OUT: "Explicit opt-out",
    Reason.TRANSACTIONAL_GRANT: "Transactional: covered by the notification permission grant",
    Reason.DEFAULT_BY_REGION: "Default on in the person's region",
    Reason.DEFAULT_OFF: "Default off: no decision made",
    Reason.REGION_BLOCKS_DEFAULT: "No decision: the topic's default does not apply in this region",
}


@dataclass(frozen=True)
class TimelineEvent:
    seq: int
    kind: str
    topic: Topic | None
    previous_state: str | None
    new_state: str | None
    source: str
    policy_version: str | None
    decided_at: dt.datetime
    recorded_at: dt.datetime
    actor: str
    screen: str | None
    client: str | None
    extra: dict[str, str]
    hash: str
    subscription_id: uuid.UUID | None
    deliveries: int = 0

    @property
    def label(self) -> str:
        try:
            return KIND_LABELS[EventKind(self.kind)]
        except ValueError:
            return self.kind


@dataclass(frozen=True)
class DeliveryRow:
    id: int
    campaign_id: uuid.UUID
    campaign_title: str
    topic_slug: str
    subscription_id: uuid.UUID
    status: str
    consent_reason: str
    consent_event_seq: int | None
    attempts: int
    updated_at: dt.datetime


@dataclass(frozen=True)
class SubscriptionRow:
    subscription: PushSubscription
    client: str

    @property
    def tombstone(self) -> bool:
        return self.subscription.deleted_at is not None


@dataclass
class History:
    subscriber_id: uuid.UUID
    subscriber: Subscriber | None
    events: list[TimelineEvent] = field(default_factory=list)
    truncated: bool = False
    topics: list[TopicView] = field(default_factory=list)
    subscriptions: list[SubscriptionRow] = field(default_factory=list)
    deliveries: list[DeliveryRow] = field(default_factory=list)

    @property
    def erased(self) -> bool:
        return self.subscriber is not None and self.subscriber.erased_at is not None

    @property
    def reference(self) -> str | None:
        """The person's short reference as they read it, once they were given one."""
        if self.subscriber is None or self.subscriber.reference is None:
            return None
        return reference.display(self.subscriber.reference)

    @property
    def erasure_receipt_id(self) -> str | None:
        """The ID on the receipt of this person's erasure (their latest, if several)."""
        for event in reversed(self.events):
            if event.kind == EventKind.ERASED.value:
                return receipt_id(event.seq, event.hash)
        return None


def _context(raw: str) -> dict[str, str]:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"raw": raw}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def actor_names(session: Session, actors: set[str]) -> dict[str, str]:
    """``staff:<id>`` actors as the staff member's email; people and the system in words."""
    names = {"subscriber": "The person", "system": "System"}
    staff_ids = []
    for actor in actors:
        if actor.startswith("staff:"):
            try:
                staff_ids.append(uuid.UUID(actor.removeprefix("staff:")))
            except ValueError:
                continue
    if staff_ids:
        for staff_id, email in session.execute(
            sa.select(StaffUser.id, StaffUser.email).where(StaffUser.id.in_(staff_ids))
        ):
            names[f"staff:{staff_id}"] = f"Staff: {email}"
    return {actor: names.get(actor, actor) for actor in actors}


def history(
    session: Session,
    subscriber_id: uuid.UUID,
    *,
    actor: audit.Actor | None,
    limit: int | None = None,
) -> History:
    """Everything the consent record says about one subscriber; audited as a viewing."""
    limit = limit or HISTORY_LIMIT
    subscriber = session.get(Subscriber, subscriber_id)
    result = History(subscriber_id, subscriber)
    rows = session.scalars(
        sa.select(ConsentEvent)
        .where(ConsentEvent.subscriber_id == subscriber_id)
        .order_by(ConsentEvent.seq)
        .limit(limit + 1)
    ).all()
    result.truncated = len(rows) > limit
    rows = rows[:limit]
    topics = {t.id: t for t in catalogue.all_topics(session)}
    result.subscriptions = [
        SubscriptionRow(sub, family(sub.user_agent) if sub.user_agent else "")
        for sub in session.scalars(
            sa.select(PushSubscription)
            .where(PushSubscription.subscriber_id == subscriber_id)
            .order_by(PushSubscription.created_at, PushSubscription.id)
        )
    ]
    result.deliveries = _deliveries(
        session, subscriber_id, [row.subscription.id for row in result.subscriptions]
    )
    allowed = Counter(d.consent_event_seq for d in result.deliveries if d.consent_event_seq)
    for row in rows:
        context = _context(row.context)
        result.events.append(
            TimelineEvent(
                seq=row.seq,
                kind=row.kind,
                topic=topics.get(row.topic_id) if row.topic_id is not None else None,
                previous_state=row.previous_state,
                new_state=row.new_state,
                source=row.source,
                policy_version=row.policy_version,
                decided_at=row.decided_at,
                recorded_at=row.recorded_at,
                actor=row.actor,
                screen=context.pop("screen", None),
                client=context.pop("client", None),
                extra=context,
                hash=event_leaf_hash(row).hex(),
                subscription_id=row.subscription_id,
                deliveries=allowed.get(row.seq, 0),
            )
        )
    if subscriber is not None and subscriber.erased_at is None:
        result.topics = topic_views(session, subscriber, catalogue.all_topics(session))
    audit.record(session, actor, Action.HISTORY_VIEWED, subscriber_target(subscriber_id))
    return result


def _deliveries(
    session: Session, subscriber_id: uuid.UUID, subscription_ids: Sequence[uuid.UUID]
) -> list[DeliveryRow]:
    """Deliveries the person's consent allowed: those whose consent event is theirs (the
    proof stays after a subscription is purged), and those to their subscriptions that a
    regional default allowed (no event to point to)."""
    d, c = Delivery.__table__, Campaign.__table__
    t = Topic.__table__
    own_events = sa.select(ConsentEvent.seq).where(ConsentEvent.subscriber_id == subscriber_id)
    # One branch per reason, each read from its own index (ix_delivery_consent_event_seq,
    # ix_delivery_subscription_id) and bounded by the person's deliveries. As one OR
    # of the two, no index could serve it: PostgreSQL walked the whole table's primary
    # key from its end, testing every delivery of every campaign kept.
    branches = [sa.select(d.c.id, d.c.campaign_id).where(d.c.consent_event_seq.in_(own_events))]
    if subscription_ids:
        branches.append(
            sa.select(d.c.id, d.c.campaign_id).where(
                d.c.subscription_id.in_(list(subscription_ids))
            )
        )
    theirs = sa.union(*branches).subquery("theirs")
    rows = session.execute(
        sa.select(
            d.c.id,
            d.c.campaign_id,
            c.c.title.label("campaign_title"),
            t.c.slug.label("topic_slug"),
            d.c.subscription_id,
            # Still queued in a campaign that ended: never sent (portal/campaigns/unsent.py).
            unsent.shown_status(c.c.status, d.c.status).label("status"),
            d.c.consent_reason,
            d.c.consent_event_seq,
            d.c.attempts,
            d.c.updated_at,
        )
        .select_from(
            theirs.join(d, sa.and_(d.c.id == theirs.c.id, d.c.campaign_id == theirs.c.campaign_id))
            .join(c, c.c.id == d.c.campaign_id)
            .join(t, t.c.id == c.c.topic_id)
        )
        .order_by(d.c.id.desc())
        .limit(DELIVERY_LIMIT)
    ).all()
    return [DeliveryRow(**row._mapping) for row in rows]


# -- erasure by staff -----------------------------------------------------------------------


def erase(
    session: Session,
    subscriber_id: uuid.UUID,
    *,
    actor: audit.Actor,
    now: dt.datetime,
    reference: str | None = None,
) -> ErasureReceipt:
    """Erase on a person's request made to staff (by email, phone …): the same erasure as
    the preference centre's, logged as done by this member of staff, and audited."""
    receipt = erase_subscriber(
        session,
        subscriber_id,
        now=now,
        actor=f"staff:{actor.id}",
        source=Source.STAFF.value,
        context=Context(screen="staff-console:erase"),
    )
    detail: dict[str, Any] = {
        "event_seq": receipt.event_seq,
        "subscriptions_ended": receipt.subscriptions,
    }
    if reference:
        detail["reference"] = reference
    audit.record(session, actor, Action.ERASED, subscriber_target(subscriber_id), detail, at=now)
    return receipt


# -- exports --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportPeriod:
    """The period the export form starts with: the whole history, from the UTC day of the
    first recorded event to today (today alone when nothing is recorded yet)."""

    start: dt.date
    end: dt.date
    first_event: dt.date | None  # None: the log is empty


def whole_history(session: Session, today: dt.date) -> ExportPeriod:
    first = session.execute(sa.select(sa.func.min(ConsentEvent.recorded_at))).scalar_one()
    if first is None:
        return ExportPeriod(today, today, None)
    day = first.astimezone(dt.UTC).date()
    return ExportPeriod(min(day, today), today, day)


def start_export(
    session: Session,
    filters: ExportFilter,
    *,
    data_format: str,
    actor: audit.AnyActor,
    via: str,
) -> ExportPlan:
    """Fix the export's snapshot and audit it before any row leaves: who, the filters and
    the exact number of events (the caller commits, then streams). The snapshot is the
    consent log's tree, brought up to every committed event first (as the sequencer would
    within a second), and the export carries its signed head."""
    integrate_in(session)
    plan = plan_export(session.connection(), filters)
    audit.record(
        session,
        actor,
        Action.EXPORTED,
        subscriber_target(filters.subscriber_id) if filters.subscriber_id else "consent-log",
        {
            "via": via,
            "format": data_format,
            "filters": {
                "from": filters.start.isoformat(),
                "to": filters.end.isoformat(),
                "topic": filters.topic,
                "subscriber": str(filters.subscriber_id) if filters.subscriber_id else None,
            },
            "rows": plan.rows,
            "log_head_seq": plan.head_seq,
        },
    )
    return plan


# -- the dashboard --------------------------------------------------------------------------

WEEKS = 12


@dataclass(frozen=True)
class WeekCount:
    week: dt.date  # the Monday
    opt_in: int
    opt_out: int


@dataclass(frozen=True)
class TopicWeeks:
    topic: Topic
    weeks: list[WeekCount]

    @property
    def peak(self) -> int:
        return max([w.opt_in for w in self.weeks] + [w.opt_out for w in self.weeks] + [0])

    @property
    def totals(self) -> tuple[int, int]:
        return sum(w.opt_in for w in self.weeks), sum(w.opt_out for w in self.weeks)


def week_start(day: dt.date) -> dt.date:
    return day - dt.timedelta(days=day.weekday())


# A week's counts are final once no event recorded in it can still commit: an event's
# recorded_at is its request's time, and its transaction ends with the request.
WEEK_SETTLES_AFTER = dt.timedelta(hours=1)


def first_week(now: dt.datetime, weeks: int = WEEKS) -> dt.date:
    """The Monday of the oldest of the chart's ``weeks`` weeks (the current one last)."""
    return week_start(now.astimezone(dt.UTC).date()) - dt.timedelta(weeks=weeks - 1)


def _day(value: Any) -> dt.date:
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))


def _count_weeks(
    session: Session, first: dt.date, end: dt.date
) -> Counter[tuple[dt.date, int, str]]:
    """Opt-ins and opt-outs per (week's Monday, topic, state) recorded from the Monday
    ``first`` up to the Monday ``end``, counted from the consent log."""
    e = ConsentEvent.__table__
    week: sa.ColumnElement[Any]
    if is_postgres(session):
        week = sa.cast(
            sa.func.date_trunc("week", sa.func.timezone("UTC", e.c.recorded_at)), sa.Date
        )
    else:
        week = sa.func.date(e.c.recorded_at, "weekday 0", "-6 days")
    rows = session.execute(
        sa.select(week.label("week"), e.c.topic_id, e.c.new_state, sa.func.count())
        .where(
            e.c.kind == EventKind.PREFERENCE_CHANGED.value,
            e.c.recorded_at >= dt.datetime.combine(first, dt.time(), tzinfo=dt.UTC),
            e.c.recorded_at < dt.datetime.combine(end, dt.time(), tzinfo=dt.UTC),
            e.c.new_state.in_(["opt_in", "opt_out"]),
            e.c.topic_id.is_not(None),
        )
        .group_by(week, e.c.topic_id, e.c.new_state)
    ).all()
    counts: Counter[tuple[dt.date, int, str]] = Counter()
    for day, topic_id, state, count in rows:
        counts[(_day(day), topic_id, state)] += int(count)
    return counts


def _past_weeks(
    session: Session, mondays: Sequence[dt.date], now: dt.datetime
) -> Counter[tuple[dt.date, int, str]]:
    """The weeks' counts, each counted once and kept (``DecisionWeek``): those not kept
    yet are counted now, in one statement, and kept in the caller's transaction (a view
    that counted a week at the same moment keeps its own, the same)."""
    counts: Counter[tuple[dt.date, int, str]] = Counter()
    kept = session.scalars(sa.select(DecisionWeek).where(DecisionWeek.week.in_(mondays))).all()
    for row in kept:
        for key, n in row.counts.items():
            topic, state = key.split(":")
            counts[(row.week, int(topic), state)] += int(n)
    missing = sorted(set(mondays) - {row.week for row in kept})
    if not missing:
        return counts
    counted = _count_weeks(session, missing[0], missing[-1] + dt.timedelta(weeks=1))
    insert = (postgresql.insert if is_postgres(session) else sqlite.insert)(DecisionWeek)
    session.execute(
        insert.values(
            [
                {
                    "week": monday,
                    "counts": {
                        f"{topic_id}:{state}": n
                        for (week, topic_id, state), n in sorted(counted.items())
                        if week == monday
                    },
                    "counted_at": now,
                }
                for monday in missing
            ]
        ).on_conflict_do_nothing(index_elements=[DecisionWeek.week])
    )
    for (week, topic_id, state), n in counted.items():
        if week in missing:
            counts[(week, topic_id, state)] += n
    return counts


def weekly_decisions(session: Session, now: dt.datetime, weeks: int = WEEKS) -> list[TopicWeeks]:
    """Opt-ins and opt-outs per topic per ISO week (Monday, UTC) over the last ``weeks``
    weeks, the current one included, from the consent log's preference changes. A past
    week is counted once and kept (:func:`_past_weeks`); only the weeks still open (the
    current one, and the last for an hour after it ends) are counted at each call. The
    caller commits what was kept."""
    first = first_week(now, weeks)
    mondays = [first + dt.timedelta(weeks=i) for i in range(weeks)]

    def settled(monday: dt.date) -> bool:
        end = dt.datetime.combine(monday + dt.timedelta(weeks=1), dt.time(), tzinfo=dt.UTC)
        return end + WEEK_SETTLES_AFTER <= now

    past = [monday for monday in mondays if settled(monday)]
    open_weeks = [monday for monday in mondays if not settled(monday)]
    counts = _past_weeks(session, past, now) if past else Counter()
    if open_weeks:
        counts += _count_weeks(session, open_weeks[0], open_weeks[-1] + dt.timedelta(weeks=1))
    return [
        TopicWeeks(
            topic,
            [
                WeekCount(
                    monday,
                    counts[(monday, topic.id, "opt_in")],
                    counts[(monday, topic.id, "opt_out")],
                )
                for monday in mondays
            ],
        )
        for topic in catalogue.all_topics(session)
    ]


# A run with no result after this long died with its process: it no longer counts.
STUCK_AFTER = dt.timedelta(hours=1)


@dataclass(frozen=True)
class ChainStatus:
    last_result: JobRun | None  # the latest finished check
    current: JobRun | None  # a check running now
    events: int
    queued: bool = False  # asked for, and no scheduler has started it yet

    @property
    def running(self) -> bool:
        return self.current is not None

    @property
    def unverified(self) -> int:
        """Events written since the latest finished check read the log (all of them when
        there was none): the check's verdict says nothing about them yet."""
        return self.events - (self.last_result.processed if self.last_result else 0)

    @property
    def intact(self) -> bool | None:
        """The latest finished check's verdict; None when there is none."""
        return None if self.last_result is None else self.last_result.error is None


def chain_status(session: Session, now: dt.datetime) -> ChainStatus:
    runs = sa.select(JobRun).where(JobRun.name == VERIFY_JOB)
    newest_first = (JobRun.started_at.desc(), JobRun.id.desc())
    finished = session.scalars(
        runs.where(JobRun.seconds.is_not(None)).order_by(*newest_first).limit(1)
    ).first()
    current = session.scalars(
        runs.where(JobRun.seconds.is_(None), JobRun.started_at > now - STUCK_AFTER)
        .order_by(*newest_first)
        .limit(1)
    ).first()
    # The log's highest number, read from the primary key's end: counting the rows read
    # the whole log, millions of them, at every view. Numbers are handed out in order
    # and each becomes an event or a gap event (portal.consent.tree), so it counts them,
    # a number still in flight (for a moment) included.
    events = session.execute(sa.select(sa.func.max(ConsentEvent.seq))).scalar_one() or 0
    state = session.get(JobState, VERIFY_JOB)
    queued = state is not None and state.next_run_at <= now and current is None
    return ChainStatus(finished, current, int(events), queued)


def request_verification(session: Session, *, actor: audit.Actor, now: dt.datetime) -> bool:
    """Make the ``verify-log`` job due now; False when a check is running or queued already.

    The next scheduler tick, in whichever process takes the job's lock, runs it: a walk of
    the whole log can outlast a request, and work is coordinated through the database
    rather than by threads of one web process.
    """
    status = chain_status(session, now)
    if status.running or status.queued:
        return False
    state = session.get(JobState, VERIFY_JOB)
    if state is None:
        session.add(JobState(name=VERIFY_JOB, next_run_at=now))
    else:
        state.next_run_at = now
    audit.record(session, actor, Action.LOG_VERIFICATION, "consent-log", at=now)
    session.flush()
    return True


@dataclass(frozen=True)
class PendingErasures:
    # Erased people's devices not yet told to drop their subscription: each is told at
    # its next heartbeat (a visit to the site), and only then is the erasure complete on
    # the device.
    devices_not_told: int
    # Erased people's subscriptions not tombstoned: erasure does both in one
    # transaction, so anything but zero means something went wrong.
    not_tombstoned: int


def pending_erasures(session: Session) -> PendingErasures:
    erased = (
        sa.select(sa.func.count())
        .select_from(PushSubscription)
        .join(Subscriber, Subscriber.id == PushSubscription.subscriber_id)
        .where(Subscriber.erased_at.is_not(None))
    )
    not_told = erased.where(
        PushSubscription.deleted_at.is_not(None),
        PushSubscription.end_reason == EndReason.ERASED.value,
        PushSubscription.browser_told_at.is_(None),
    )
    return PendingErasures(
        devices_not_told=int(session.execute(not_told).scalar_one()),
        not_tombstoned=int(
            session.execute(erased.where(PushSubscription.deleted_at.is_(None))).scalar_one()
        ),
    )
