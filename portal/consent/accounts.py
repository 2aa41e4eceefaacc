"""Linking a browser to a host product's account, and merging its device preferences."""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.consent import log
from portal.consent.models import EventKind, PreferenceState, Source, Topic, TopicPreference
from portal.consent.preferences import (
    Decision,
    apply_decisions,
    preference_rows,
    region_for_country,
)
from portal.identity import Assertion
from portal.subscriptions.models import PushSubscription, Subscriber


def _live(session: Session, subscriber_id: uuid.UUID | None) -> Subscriber | None:
    if subscriber_id is None:
        return None
    subscriber = session.get(Subscriber, subscriber_id)
    return subscriber if subscriber is not None and subscriber.erased_at is None else None


def link_account(
    session: Session,
    assertion: Assertion,
    *,
    browser_subscriber_id: uuid.UUID | None,
    now: dt.datetime,
    context: log.Context | None = None,
) -> Subscriber:
    """The browser now belongs to the asserted account.

    An anonymous browser subscriber is merged into the account: its subscriptions move
    over, and each of its explicit decisions carries over unless the account decided
    that topic more recently. A browser already linked to another account is not
    merged (its devices are that account's); it simply switches to this one.
    """
    log.lock_subscriber(session, browser_subscriber_id)
    browser = _live(session, browser_subscriber_id)
    account = session.scalars(
        sa.select(Subscriber).where(
            Subscriber.external_user_id == assertion.external_user_id,
            Subscriber.erased_at.is_(None),
        )
    ).first()
    if account is not None:
        log.lock_subscriber(session, account.id)
    merged_from: Subscriber | None = None
    if account is None and browser is not None and browser.external_user_id is None:
        account = browser  # the anonymous browser becomes the account: nothing to merge
        account.external_user_id = assertion.external_user_id
    elif account is None:
        account = Subscriber(external_user_id=assertion.external_user_id, created_at=now)
        session.add(account)
        session.flush()
    if browser is not None and browser.id != account.id and browser.external_user_id is None:
        merged_from = browser
    if assertion.region_code:
        account.region_code = region_for_country(assertion.region_code)
    if assertion.locale:
        account.locale = assertion.locale

    if merged_from is not None:
        session.execute(
            sa.update(PushSubscription)
            .where(PushSubscription.subscriber_id == merged_from.id)
            .values(subscriber_id=account.id)
        )
        theirs = preference_rows(session, merged_from.id)
        ours = preference_rows(session, account.id)
        topics = {
            t.id: t
            for t in session.scalars(sa.select(Topic).where(Topic.id.in_(list(theirs)))).all()
        }
        for topic_id, row in sorted(theirs.items(), key=lambda item: item[1].decided_at):
            if row.state == PreferenceState.UNSET:
                continue
            mine: TopicPreference | None = ours.get(topic_id)
            if (
                mine is not None
                and mine.state != PreferenceState.UNSET
                and mine.decided_at >= row.decided_at
            ):
                continue
            apply_decisions(
                session,
                account.id,
                [Decision(topics[topic_id], PreferenceState(row.state))],
                source=Source.ACCOUNT_LINK.value,
                policy_version=row.policy_version,
                decided_at=row.decided_at,
                recorded_at=now,
                context=context,
            )
    log.append(
        session,
        kind=EventKind.ACCOUNT_LINKED,
        subscriber_id=account.id,
        source=Source.ACCOUNT_LINK.value,
        actor="subscriber",
        recorded_at=now,
        context=log.Context(
            screen=context.screen if context else None,
            client=context.client if context else None,
            extra={"merged_subscriber": str(merged_from.id)} if merged_from else None,
        ),
    )
    session.flush()
    return account


def link_manages(
    session: Session, subscriber: Subscriber | None, *, has_devices: bool | None = None
) -> bool:
    """Whether a preference link to ``subscriber`` has choices to manage: not when the
    person was erased, nor when it names an anonymous browser identity whose devices all
    moved to an account (account linking merges it; the account's own links and its
    devices manage them now), so that the old link never shows, saves or "erases" an
    identity that governs no device while the person's account and devices go on.
    ``has_devices`` is whether they have a device, when the caller read it with them."""
    if subscriber is None or subscriber.erased_at is not None:
        return False
    if subscriber.external_user_id is not None:
        return True
    if has_devices is not None:
        return has_devices
    devices = sa.exists().where(PushSubscription.subscriber_id == subscriber.id)
    return bool(session.scalar(sa.select(devices)))
