"""Tri-state preferences: effective state at read time, and applying decisions.

Defaults are never written: an unset preference resolves at read time from the topic's
default, its class (transactional or not) and the subscriber's region. The same rule is
mirrored in SQL by :mod:`portal.consent.recipients`.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from portal.clock import day_in
from portal.consent import catalogue, log
from portal.consent.catalogue import active_topics
from portal.consent.models import EventKind, PreferenceState, Source, Topic, TopicPreference
from portal.db import is_postgres
from portal.errors import Conflict, ValidationError
from portal.subscriptions.models import PushSubscription, Subscriber

# Marketing defaults never apply here. An unknown region is treated the same way: we
# only presume agreement where we know the law allows it.
RESTRICTED_REGIONS = frozenset({"EU", "UK", "CA"})


class Reason(enum.StrEnum):
    EXPLICIT_OPT_IN = "explicit_opt_in"
    EXPLICIT_OPT_OUT = "explicit_opt_out"
    TRANSACTIONAL_GRANT = "transactional_grant"
    DEFAULT_BY_REGION = "default_by_region"
    DEFAULT_OFF = "default_off"
    REGION_BLOCKS_DEFAULT = "region_blocks_default"


@dataclass(frozen=True)
class Effective:
    on: bool
    reason: Reason
    state: str  # the stored tri-state value

    @property
    def explicit(self) -> bool:
        return self.reason in (Reason.EXPLICIT_OPT_IN, Reason.EXPLICIT_OPT_OUT)


def marketing_defaults_apply(region_code: str | None) -> bool:
    return region_code is not None and region_code not in RESTRICTED_REGIONS


def effective_state(state: str | None, topic: Topic, region_code: str | None) -> Effective:
    """The one rule: explicit decisions win; an unset one falls back to the default,
    which for marketing topics applies only outside the restricted regions, and for
    transactional topics rests on the browser's permission grant."""
    stored = state or PreferenceState.UNSET.value
    if stored == PreferenceState.OPT_IN:
        return Effective(True, Reason.EXPLICIT_OPT_IN, stored)
    if stored == PreferenceState.OPT_OUT:
        return Effective(False, Reason.EXPLICIT_OPT_OUT, stored)
    if topic.default_state != PreferenceState.OPT_IN:
        return Effective(False, Reason.DEFAULT_OFF, stored)
    if topic.is_transactional:
        return Effective(True, Reason.TRANSACTIONAL_GRANT, stored)
    if marketing_defaults_apply(region_code):
        return Effective(True, Reason.DEFAULT_BY_REGION, stored)
    return Effective(False, Reason.REGION_BLOCKS_DEFAULT, stored)


def explain(
    effective: Effective,
    *,
    decided_at: dt.datetime | None = None,
    source: str | None = None,
    policy_version: str | None = None,
    time_zone: str | None = None,
) -> str:
    """The one wording rule for a topic's state, on the preference centre and the
    compliance view: never chosen (a default, on or off), or chosen on or off, with the
    date and the notice version the choice was made under.

    A topic left unticked on the subscribe page was never touched: it is off because the
    person did not choose it, and the sentence must not say they turned it off. Any other
    opt_out is a "no" the person gave: unticked here, "turn off all marketing", or kept
    when confirming their choices under a new notice.
    """
    when = f" on {day_in(decided_at, time_zone)}" if decided_at else ""
    notice = f", under notice version {policy_version}" if policy_version else ""
    match effective.reason:
        case Reason.EXPLICIT_OPT_IN:
            return f"On: you chose this{when}{notice}."
        case Reason.EXPLICIT_OPT_OUT if source == Source.SUBSCRIBE_PAGE:
            return f"Off: you left this unticked when you subscribed{when}{notice}."
        case Reason.EXPLICIT_OPT_OUT:
            return f"Off: you said no to this{when}{notice}."
        case Reason.TRANSACTIONAL_GRANT:
            return "On by default for account messages, because you allowed notifications."
        case Reason.DEFAULT_BY_REGION:
            return "On by default where you live. Turn it off if you do not want it."
        case Reason.REGION_BLOCKS_DEFAULT:
            return "Off until you turn it on: we only send these with your agreement."
        case _:
            return "Off until you turn it on."


@dataclass(frozen=True)
class TopicView:
    topic: Topic
    effective: Effective
    decided_at: dt.datetime | None
    source: str | None
    policy_version: str | None
    time_zone: str | None = None  # the person's, for the day they decided

    @property
    def explanation(self) -> str:
        if not self.effective.explicit:
            return explain(self.effective)
        return explain(
            self.effective,
            decided_at=self.decided_at,
            source=self.source,
            policy_version=self.policy_version,
            time_zone=self.time_zone,
        )


# Built once, not per call: these run on every page view and save, and building a
# statement and computing its cache key took about a tenth of a save's CPU (py-spy).
_PREFERENCE_ROWS = sa.select(TopicPreference).where(
    TopicPreference.subscriber_id == sa.bindparam("subscriber_id")
)
_FRESH_PREFERENCE_ROWS = _PREFERENCE_ROWS.execution_options(populate_existing=True)


def _subscriber_with_preferences(has_devices: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """The subscriber joined with their preferences, each row carrying ``has_devices``."""
    return (
        sa.select(Subscriber, TopicPreference, has_devices)
        .outerjoin(TopicPreference, TopicPreference.subscriber_id == Subscriber.id)
        .where(Subscriber.id == sa.bindparam("subscriber_id"))
    )


_SUBSCRIBER_WITH_PREFERENCES = _subscriber_with_preferences(sa.null())
# The same with whether they have a device (a preference link's visit asks it).
_SUBSCRIBER_WITH_PREFERENCES_AND_DEVICES = _subscriber_with_preferences(
    sa.exists().where(PushSubscription.subscriber_id == Subscriber.id).label("has_devices")
)
# Each, by whether the rows the session holds already are overwritten with what was read.
_SUBSCRIBER_READS = {
    (devices, fresh): query.execution_options(populate_existing=True) if fresh else query
    for devices, query in (
        (False, _SUBSCRIBER_WITH_PREFERENCES),
        (True, _SUBSCRIBER_WITH_PREFERENCES_AND_DEVICES),
    )
    for fresh in (False, True)
}


def preference_rows(
    session: Session, subscriber_id: uuid.UUID, *, fresh: bool = False
) -> dict[int, TopicPreference]:
    """The subscriber's stored preferences by topic id; ``fresh`` overwrites what the
    session holds already with what the database has now."""
    query = _FRESH_PREFERENCE_ROWS if fresh else _PREFERENCE_ROWS
    rows = session.scalars(query, {"subscriber_id": subscriber_id}).all()
    return {row.topic_id: row for row in rows}


def subscriber_with_preferences(
    session: Session, subscriber_id: uuid.UUID, *, devices: bool = False, fresh: bool = False
) -> tuple[Subscriber | None, dict[int, TopicPreference], bool | None]:
    """The subscriber and their stored preferences (by topic id), in one statement; with
    ``devices``, whether they have a device too (what
    :func:`portal.consent.accounts.link_manages` asks; None without); ``fresh``
    overwrites what the session holds already with what the database has now."""
    query = _SUBSCRIBER_READS[devices, fresh]
    found = session.execute(query, {"subscriber_id": subscriber_id}).all()
    if not found:
        return None, {}, None
    rows = {row.topic_id: row for _, row, _ in found if row is not None}
    has_devices = found[0][2]
    return found[0][0], rows, None if has_devices is None else bool(has_devices)


def topic_views(
    session: Session,
    subscriber: Subscriber,
    topics: Sequence[Topic] | None = None,
    rows: dict[int, TopicPreference] | None = None,
) -> list[TopicView]:
    """Each topic as the subscriber has it; ``rows`` are their stored preferences when
    the caller has read them already."""
    if rows is None:
        rows = preference_rows(session, subscriber.id)
    views = []
    for topic in topics if topics is not None else active_topics(session):
        row = rows.get(topic.id)
        views.append(
            TopicView(
                topic=topic,
                effective=effective_state(
                    row.state if row else None, topic, subscriber.region_code
                ),
                decided_at=row.decided_at if row else None,
                source=row.source if row else None,
                policy_version=row.policy_version if row else None,
                time_zone=subscriber.time_zone,
            )
        )
    return views


@dataclass(frozen=True)
class Decision:
    topic: Topic
    state: PreferenceState


@dataclass(frozen=True)
class Choice:
    """A topic a request names, and the request field it came from (for the error)."""

    slug: str
    field: str


def chosen_topics(
    session: Session,
    *,
    policy_version: str,
    choices: Sequence[Choice],
    repeat_field: str | None = None,
) -> dict[str, Topic]:
    """The one rule for a choice of topics, whichever route it arrives by (the subscribe
    call's ``topics``, the preferences call's ``decisions``): the notice version the person
    was shown is published, and each topic named is active and named once. Answers every
    active topic by slug, chosen or not; raises the refusal otherwise. A repeated topic is
    reported at ``repeat_field`` when given (the subscribe call names its whole list).

    The topics are read in the caller's transaction, as committed now, and held until it
    ends (:func:`portal.consent.catalogue.topics_for_write`): a topic retired by another
    process a moment ago is refused, however old the pages' copy of the catalogue is, and
    the caller must write its decisions in this same transaction."""
    require_published(session, policy_version)
    topics = catalogue.topics_for_write(session)
    seen: set[str] = set()
    for choice in choices:
        if choice.slug in seen:
            raise ValidationError(
                "duplicate_topic", f"{choice.slug!r} appears twice", repeat_field or choice.field
            )
        seen.add(choice.slug)
        if choice.slug not in topics:
            raise ValidationError("unknown_topic", f"no active topic {choice.slug!r}", choice.field)
    return topics


def require_published(session: Session, policy_version: str) -> None:
    """The notice version a request says the person was shown is one we published."""
    if catalogue.policy(session, policy_version) is None:
        raise ValidationError(
            "unknown_policy_version", f"no policy version {policy_version!r}", "policyVersion"
        )


def require_not_superseded(session: Session, policy_version: str, decided_at: dt.datetime) -> None:
    """A decision is not made under a notice that a newer one had replaced by the time it
    was made (409): the preference centre's form refuses such a save and shows the new
    notice, and the JSON door refuses it too. A decision queued offline before the new
    notice was published stays valid; one dated before its own notice was published
    (the browser's clock behind the server's, within the allowed skew) is taken."""
    claimed = catalogue.policy(session, policy_version)
    in_force = catalogue.policy_in_force(session, decided_at)
    if (
        claimed is not None
        and in_force is not None
        and (in_force.published_at, in_force.version) > (claimed.published_at, claimed.version)
    ):
        raise Conflict(
            "policy_superseded",
            f"notice {claimed.version!r} had been replaced by {in_force.version!r} when this "
            "decision was made: show the person the notice in force and ask again",
            "policyVersion",
        )


@dataclass(frozen=True)
class Change:
    topic: Topic
    previous: str
    new: str
    event_seq: int


def apply_decisions(
    session: Session,
    subscriber_id: uuid.UUID,
    decisions: Iterable[Decision],
    *,
    source: str,
    policy_version: str | None,
    decided_at: dt.datetime,
    recorded_at: dt.datetime,
    actor: str = "subscriber",
    context: log.Context | None = None,
    subscription_id: uuid.UUID | None = None,
    reconfirm: bool = False,
    read_under_lock: dict[int, TopicPreference] | None = None,
) -> list[Change]:
    """Apply a set of decisions in the caller's transaction.

    Only real transitions write: a decision equal to the stored state changes nothing
    and logs nothing. A withdrawal is an opt_out row, never a deletion. With
    ``reconfirm`` (the person confirming their choices under a newer notice), a decision
    equal to a stored choice made under another notice version is recorded too: the
    same state, now under ``policy_version``.

    The transitions start from the person's stored preferences as read under their row
    lock (:func:`portal.consent.log.lock_subscriber`). ``read_under_lock`` are those,
    when the caller took the lock in this transaction and then read them fresh
    (:func:`subscriber_with_preferences` with ``fresh``), as the preference centre's
    forms do; otherwise the lock is taken and they are read here.
    """
    if read_under_lock is not None:
        rows = read_under_lock
    else:
        log.lock_subscriber(session, subscriber_id)
        # Read under the person's row lock, over whatever this session read before it:
        # another save may have committed in between.
        rows = preference_rows(session, subscriber_id, fresh=True)
    # Each topic's state and notice version as the decisions so far leave it: a topic
    # decided twice in one call is two steps of one chain, never two events that both
    # start from the stored state.
    current = {topic_id: (row.state, row.policy_version) for topic_id, row in rows.items()}
    transitions: list[tuple[Decision, str, str]] = []
    for decision in decisions:
        previous, version = current.get(decision.topic.id, (PreferenceState.UNSET.value, None))
        new = decision.state.value
        renewed = reconfirm and decision.topic.id in current and version != policy_version
        if previous != new or renewed:
            transitions.append((decision, previous, new))
            current[decision.topic.id] = (new, policy_version)
    # One read of the chain's head and one INSERT for the whole form.
    sequence = log.append_many(
        session,
        [
            log.NewEvent(
                kind=EventKind.PREFERENCE_CHANGED,
                subscriber_id=subscriber_id,
                subscription_id=subscription_id,
                topic_id=decision.topic.id,
                previous_state=previous,
                new_state=new,
                source=source,
                policy_version=policy_version,
                decided_at=decided_at,
                recorded_at=recorded_at,
                actor=actor,
                context=context,
            )
            for decision, previous, new in transitions
        ],
    )
    changes: list[Change] = []
    written: dict[int, dict[str, object]] = {}
    for (decision, previous, new), seq in zip(transitions, sequence, strict=True):
        # A topic decided twice in one call keeps its last step.
        written[decision.topic.id] = {
            "subscriber_id": subscriber_id,
            "topic_id": decision.topic.id,
            "state": new,
            "source": source,
            "policy_version": policy_version,
            "decided_at": decided_at,
            "recorded_at": recorded_at,
            "event_seq": seq,
        }
        changes.append(Change(decision.topic, previous, new, seq))
    if written:
        # In topic order, as the unit of work ordered its UPDATEs: rows are locked in one
        # order by every writer.
        _write_preferences(session, [written[topic_id] for topic_id in sorted(written)])
        # The rows this session holds already show what was written, as a flush would
        # have left them (set as committed values: nothing for a later flush to do).
        for topic_id, values in written.items():
            if (row := rows.get(topic_id)) is not None:
                for column in _WRITTEN_COLUMNS:
                    set_committed_value(row, column, values[column])
    session.flush()  # anything else the caller has pending, as before
    return changes


_WRITTEN_COLUMNS = ("state", "source", "policy_version", "decided_at", "recorded_at", "event_seq")


def _upsert(insert: postgresql.Insert | sqlite.Insert) -> sa.Executable:
    return insert.on_conflict_do_update(
        index_elements=[insert.table.c.subscriber_id, insert.table.c.topic_id],
        set_={column: insert.excluded[column] for column in _WRITTEN_COLUMNS},
    ).returning(insert.table.c.topic_id)


# Built once: run by every save that changes something, with a parameter set per changed
# row. RETURNING makes SQLAlchemy send them as one multi-row statement; without it psycopg
# sent a batch in pipeline mode, polling for its answers on a socket that is always
# writable, at about a twentieth of a save's CPU.
_preferences = cast(sa.Table, TopicPreference.__table__)
_WRITE_PREFERENCES = {
    "postgresql": _upsert(postgresql.insert(_preferences)),
    "sqlite": _upsert(sqlite.insert(_preferences)),
}


def _write_preferences(session: Session, values: list[dict[str, object]]) -> None:
    """Every changed topic of one save written by one upsert: a row inserted, or the stored
    one updated (the person's row lock is held, so no other save races it). In place of the
    unit of work's flush, whose bookkeeping cost a save more CPU than its SQL."""
    session.execute(
        _WRITE_PREFERENCES["postgresql" if is_postgres(session) else "sqlite"], values
    ).all()


def choices_to_reconfirm(views: Sequence[TopicView], current_version: str) -> list[Decision]:
    """The person's own choices made under a notice other than ``current_version``, as
    decisions to record again under it (defaults are nobody's choice: never included)."""
    return [
        Decision(view.topic, PreferenceState(view.effective.state))
        for view in views
        if view.effective.explicit and view.policy_version != current_version
    ]


def last_agreed_version(views: Sequence[TopicView], current_version: str) -> str | None:
    """The notice version of the person's latest choice that was not made under
    ``current_version``: the text to compare the current one with. None when every
    choice was made under the current notice, or there are none."""
    older = [
        view
        for view in views
        if view.effective.explicit
        and view.policy_version is not None
        and view.policy_version != current_version
        and view.decided_at is not None
    ]
    if not older:
        return None
    latest = max(older, key=lambda view: view.decided_at or dt.datetime.min.replace(tzinfo=dt.UTC))
    return latest.policy_version


def form_decisions(views: Sequence[TopicView], checked: set[str]) -> list[Decision]:
    """Decisions from the preference centre's checkboxes (the whole visible set).

    A topic left where its default put it stays unset: a box that was ticked by default
    and saved untouched is not an opt-in the person made, and must not be recorded as one.
    """
    decisions = []
    for view in views:
        wanted_on = view.topic.slug in checked
        if not view.effective.explicit and wanted_on == view.effective.on:
            continue
        state = PreferenceState.OPT_IN if wanted_on else PreferenceState.OPT_OUT
        decisions.append(Decision(view.topic, state))
    return decisions


def marketing_off_decisions(views: Sequence[TopicView]) -> list[Decision]:
    """ "Turn off all marketing": opt_out for every non-transactional topic that is on or unset."""
    return [
        Decision(view.topic, PreferenceState.OPT_OUT)
        for view in views
        if not view.topic.is_transactional and view.effective.state != PreferenceState.OPT_OUT
    ]


# EU member states and the rest of the EEA, where GDPR applies: region "EU".
_EEA = frozenset(
    {
        "AT",
        "BE",
        "BG",
        "HR",
        "CY",
        "CZ",
        "DK",
        "EE",
        "FI",
        "FR",
        "DE",
        "GR",
        "HU",
        "IE",
        "IT",
        "LV",
        "LT",
        "LU",
        "MT",
        "NL",
        "PL",
        "PT",
        "RO",
        "SK",
        "SI",
        "ES",
        "SE",
        "IS",
        "LI",
        "NO",
    }
)


def region_for_country(code: str | None) -> str | None:
    """Map an ISO 3166 country code (or a region code) to the region the rules speak of."""
    if not code:
        return None
    code = code.strip().upper()
    if code in _EEA or code == "EU":
        return "EU"
    if code in ("GB", "UK"):
        return "UK"
    if len(code) == 2 and code.isalpha():
        return code
    return None
