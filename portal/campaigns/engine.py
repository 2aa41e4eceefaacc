"""The dispatch engine: claim due deliveries, re-check consent, send, apply the answers.

Any number of processes run it at once. Work is claimed in the database — ``FOR UPDATE
SKIP LOCKED`` with a lease on PostgreSQL, the write lock on SQLite — so a delivery is
sent by one process at a time. The sender renews its lease while the batch is out; a
lease that runs out (the process died mid-send) makes its deliveries claimable again,
so after a crash only the sends that were in flight can repeat, and they carry the same
delivery id for the service worker to drop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from portal.campaigns import metrics
from portal.campaigns.models import Campaign, CampaignStatus, CircuitState, Delivery, DeliveryStatus
from portal.campaigns.services import live_subscription_query, materialise_batch, payload
from portal.config import b64url_decode
from portal.consent import log as consent_log
from portal.consent.models import EventKind, Source
from portal.consent.recipients import recipient_query
from portal.db import db, is_postgres
from portal.dispatch.encryption import InvalidSubscriptionKeys
from portal.dispatch.transport import PushRequest, PushResponse, PushTransport, Urgency
from portal.subscriptions.lifecycle import (
    Lifecycle,
    Outcome,
    apply_answer,
    backoff_delay,
    may_retry,
)
from portal.subscriptions.models import (
    EndReason,
    PushService,
    PushSubscription,
    SubscriptionState,
    subscription_state_type,
)
from portal.subscriptions.sealing import KeyRing, SealBroken, UnknownKeyVersion

log = logging.getLogger("portal.dispatch")
audit = logging.getLogger("portal.audit")
_d = Delivery.__table__
_s = PushSubscription.__table__
_c = Campaign.__table__


@dataclass
class EngineSettings:
    batch_size: int = 500
    lease_seconds: float = 60.0
    materialise_batch: int = 5000
    # A push service answering 429/5xx to this share of a batch (at least `circuit_min`
    # answers) is left alone for `circuit_seconds`, while the others go on.
    circuit_ratio: float = 0.5
    circuit_min: int = 20
    circuit_seconds: float = 30.0


@dataclass
class _Claimed:
    delivery_id: int
    campaign_id: uuid.UUID
    subscription_id: uuid.UUID
    push_service: str
    attempts: int


@dataclass
class TickReport:
    claimed: int = 0
    accepted: int = 0
    failed: int = 0
    revoked: int = 0
    skipped: int = 0
    retried: int = 0
    materialised: int = 0
    by_service: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )


class Dispatcher:
    """One per process: holds the transport (its connections) and the settings."""

    def __init__(
        self,
        app: Flask,
        transport: PushTransport,
        *,
        settings: EngineSettings | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.app = app
        self.transport = transport
        self.settings = settings or EngineSettings()
        self.rand = rand
        portal = app.extensions["portal"]
        self.clock = portal.clock
        self.keys: KeyRing = portal.keys
        self.retry = portal.settings.retry
        self.failures_before_stale = portal.settings.failures_before_stale
        self._lock = threading.Lock()

    # -- campaign bookkeeping ---------------------------------------------------------

    def advance_campaigns(self) -> int:
        """Start due campaigns, materialise some of their audience, close finished ones."""
        now = self.clock.now()
        materialised = 0
        with db.begin(self.app) as session:
            session.execute(
                sa.update(_c)
                .where(_c.c.status == CampaignStatus.SCHEDULED.value, _c.c.send_at <= now)
                .values(status=CampaignStatus.SENDING.value)
            )
            expired = (
                session.execute(
                    sa.select(_c.c.id).where(
                        _c.c.status.in_(
                            [CampaignStatus.SENDING.value, CampaignStatus.PAUSED.value]
                        ),
                        _c.c.deliver_until.is_not(None),
                        _c.c.deliver_until <= now,
                    )
                )
                .scalars()
                .all()
            )
            for campaign_id in expired:
                session.execute(
                    sa.update(_d)
                    .where(
                        _d.c.campaign_id == campaign_id, _d.c.status == DeliveryStatus.QUEUED.value
                    )
                    .values(
                        status=DeliveryStatus.SKIPPED.value,
                        reason="deliver_until_passed",
                        updated_at=now,
                    )
                )
                session.execute(
                    sa.update(_c)
                    .where(_c.c.id == campaign_id)
                    .values(
                        status=CampaignStatus.EXPIRED.value,
                        finished_at=now,
                        materialised_at=sa.func.coalesce(_c.c.materialised_at, now),
                    )
                )
        with db.begin(self.app) as session:
            pending = session.scalars(
                sa.select(Campaign)
                .where(
                    Campaign.status == CampaignStatus.SENDING.value,
                    Campaign.materialised_at.is_(None),
                )
                .order_by(Campaign.send_at)
            ).all()
        for campaign in pending:
            with db.begin(self.app) as session:
                fresh = session.get(Campaign, campaign.id)
                if fresh is not None and fresh.status == CampaignStatus.SENDING.value:
                    materialised += materialise_batch(
                        session, fresh, now=now, batch=self.settings.materialise_batch
                    )
        with db.begin(self.app) as session:
            busy = (
                sa.select(_d.c.id)
                .where(
                    _d.c.campaign_id == _c.c.id,
                    _d.c.status.in_([DeliveryStatus.QUEUED.value, DeliveryStatus.SENDING.value]),
                )
                .exists()
            )
            session.execute(
                sa.update(_c)
                .where(
                    _c.c.status == CampaignStatus.SENDING.value,
                    _c.c.materialised_at.is_not(None),
                    ~busy,
                )
                .values(status=CampaignStatus.COMPLETED.value, finished_at=now)
            )
        return materialised

    # -- claiming ---------------------------------------------------------------------

    def _open_circuits(self, session: Session, now: dt.datetime) -> list[str]:
        return list(
            session.execute(
                sa.select(CircuitState.push_service).where(CircuitState.open_until > now)
            ).scalars()
        )

    def claim(self) -> list[_Claimed]:
        now = self.clock.now()
        lease = now + dt.timedelta(seconds=self.settings.lease_seconds)
        with db.begin(self.app) as session:
            blocked = self._open_circuits(session, now)
            due = sa.or_(
                sa.and_(_d.c.status == DeliveryStatus.QUEUED.value, _d.c.next_attempt_at <= now),
                # A lease that ran out: the process sending it died. Claimable again.
                sa.and_(_d.c.status == DeliveryStatus.SENDING.value, _d.c.lease_expires_at < now),
            )
            candidates = (
                sa.select(_d.c.id)
                .join(_c, _c.c.id == _d.c.campaign_id)
                .where(_c.c.status == CampaignStatus.SENDING.value, due)
                .order_by(_d.c.id)
                .limit(self.settings.batch_size)
            )
            if blocked:
                candidates = candidates.where(_d.c.push_service.not_in(blocked))
            if is_postgres(session):
                candidates = candidates.with_for_update(of=_d, skip_locked=True)
            ids = session.execute(candidates).scalars().all()
            if not ids:
                return []
            rows = session.execute(
                sa.update(_d)
                .where(_d.c.id.in_(ids))
                .values(
                    status=DeliveryStatus.SENDING.value,
                    lease_expires_at=lease,
                    attempts=_d.c.attempts + 1,
                    updated_at=now,
                )
                .returning(
                    _d.c.id,
                    _d.c.campaign_id,
                    _d.c.subscription_id,
                    _d.c.push_service,
                    _d.c.attempts,
                )
            ).all()
        return [_Claimed(*row) for row in rows]

    # -- sending ----------------------------------------------------------------------

    def tick(
        self, *, stop: threading.Event | None = None, max_batches: int | None = None
    ) -> TickReport:
        """Advance campaigns and send until nothing is due (or ``max_batches``)."""
        report = TickReport()
        report.materialised += self.advance_campaigns()
        batches = 0
        while stop is None or not stop.is_set():
            claimed = self.claim()
            if not claimed:
                # More audience may be waiting to be materialised.
                more = self.advance_campaigns()
                report.materialised += more
                if more == 0:
                    break
                continue
            self._send(claimed, report)
            batches += 1
            if max_batches is not None and batches >= max_batches:
                break
        self.advance_campaigns()
        self._update_gauges()
        return report

    def _update_gauges(self) -> None:
        with db.begin(self.app) as session:
            queued = session.execute(
                sa.select(sa.func.count())
                .select_from(_d.join(_c, _c.c.id == _d.c.campaign_id))
                .where(
                    _c.c.status.in_([CampaignStatus.SENDING.value, CampaignStatus.PAUSED.value]),
                    _d.c.status == DeliveryStatus.QUEUED.value,
                )
            ).scalar_one()
            revoked = session.execute(
                sa.select(sa.func.count()).where(
                    _s.c.state == SubscriptionState.REVOKED.value, _s.c.deleted_at.is_(None)
                )
            ).scalar_one()
        metrics.deliveries_queued.set(queued)
        metrics.tokens_pruned_current.set(revoked)

    def _send(self, claimed: list[_Claimed], report: TickReport) -> None:
        report.claimed += len(claimed)
        now = self.clock.now()
        with self._keeping_leases([c.delivery_id for c in claimed]):
            skipped, answered, subs = self._encrypt_and_send(claimed)
            self._apply(skipped, answered, subs, now, report)

    @contextlib.contextmanager
    def _keeping_leases(self, delivery_ids: list[int]) -> Iterator[None]:
        """Renew the batch's lease every third of it until its answers are recorded.

        A slow push service can hold a batch longer than one lease (each request may wait
        out the transport's time-out), and recording the answers can wait for another
        process's (they take the consent log's lock in turn); without renewal another
        process would take the batch and send it a second time meanwhile. A process that
        dies stops renewing, so its batch is claimable again one lease later.
        """
        seconds = self.settings.lease_seconds
        done = threading.Event()

        def renew() -> None:
            while not done.wait(seconds / 3):
                try:
                    with db.begin(self.app) as session:
                        mine = sa.select(_d.c.id).where(
                            _d.c.id.in_(delivery_ids),
                            _d.c.status == DeliveryStatus.SENDING.value,
                        )
                        if is_postgres(session):
                            # Rows the answers are being written to are passed over, never
                            # waited for: renewal must not deadlock with recording.
                            mine = mine.with_for_update(skip_locked=True)
                        session.execute(
                            sa.update(_d)
                            .where(_d.c.id.in_(mine), _d.c.status == DeliveryStatus.SENDING.value)
                            .values(
                                lease_expires_at=self.clock.now() + dt.timedelta(seconds=seconds)
                            )
                        )
                except sa.exc.SQLAlchemyError:
                    # Tried again at the next third; meanwhile the lease may run out, as
                    # it would for a process that died.
                    log.warning("could not renew the lease of a batch", exc_info=True)

        renewer = threading.Thread(target=renew, name="dispatch-lease", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            done.set()
            renewer.join()

    def _encrypt_and_send(
        self, claimed: list[_Claimed]
    ) -> tuple[list[tuple[int, str]], list[tuple[_Claimed, PushResponse]], dict[uuid.UUID, Any]]:
        by_subscription = {c.subscription_id: c for c in claimed}
        campaign_ids = {c.campaign_id for c in claimed}
        with db.begin(self.app) as session:
            campaigns = {
                c.id: c
                for c in session.scalars(sa.select(Campaign).where(Campaign.id.in_(campaign_ids)))
            }
            allowed: dict[uuid.UUID, Any] = {}
            for campaign in campaigns.values():
                mine = [c.subscription_id for c in claimed if c.campaign_id == campaign.id]
                if campaign.is_test:
                    # A test goes to the sender's own browser, which they chose: only its
                    # liveness is re-checked, never the topic's audience.
                    query = live_subscription_query(mine)
                else:
                    # Consent and liveness re-checked now: an opt-out after launch is honoured.
                    query = recipient_query(campaign.topic_id).where(_s.c.id.in_(mine))
                allowed.update({row.id: row for row in session.execute(query)})
            subs = {
                row.id: row
                for row in session.execute(
                    sa.select(
                        _s.c.id,
                        _s.c.endpoint,
                        _s.c.p256dh,
                        _s.c.auth_sealed,
                        _s.c.auth_key_version,
                        _s.c.state,
                        _s.c.deleted_at,
                        _s.c.consecutive_failures,
                        _s.c.last_success_at,
                        _s.c.subscriber_id,
                        _s.c.push_service,
                    ).where(_s.c.id.in_(list(by_subscription)))
                )
            }
        skipped: list[tuple[int, str]] = []
        to_send: list[tuple[_Claimed, PushRequest]] = []
        for item in claimed:
            sub = subs.get(item.subscription_id)
            if item.subscription_id not in allowed or sub is None:
                skipped.append((item.delivery_id, _skip_reason(sub)))
                continue
            campaign = campaigns[item.campaign_id]
            try:
                secret = self.keys.open(bytes(sub.auth_sealed), sub.auth_key_version)
                request = PushRequest.encrypted(
                    sub.endpoint,
                    payload(campaign, item.delivery_id),
                    p256dh=b64url_decode(sub.p256dh),
                    auth=secret,
                    ttl=campaign.ttl,
                    urgency=Urgency(campaign.urgency),
                    topic=campaign.collapse_key,
                )
            except (UnknownKeyVersion, SealBroken, InvalidSubscriptionKeys) as problem:
                log.error("delivery %s cannot be encrypted: %s", item.delivery_id, problem)
                skipped.append((item.delivery_id, "unreadable_keys"))
                continue
            to_send.append((item, request))

        started = time.perf_counter()
        responses = (
            self.transport.send_batch([request for _, request in to_send]) if to_send else []
        )
        elapsed = time.perf_counter() - started
        for (item, _), response in zip(to_send, responses, strict=True):
            metrics.observe_send(item.push_service, response, elapsed / max(len(to_send), 1))
        return skipped, list(zip([i for i, _ in to_send], responses, strict=True)), subs

    def _apply(
        self,
        skipped: list[tuple[int, str]],
        answered: list[tuple[_Claimed, PushResponse]],
        subs: dict[uuid.UUID, Any],
        now: dt.datetime,
        report: TickReport,
    ) -> None:
        pruned: list[_Claimed] = []
        try:
            with db.begin(self.app) as session:
                consent_log.lock_chain(session)  # a 410 appends to the consent log
                for delivery_id, reason in skipped:
                    session.execute(
                        sa.update(_d)
                        .where(_d.c.id == delivery_id)
                        .values(
                            status=DeliveryStatus.SKIPPED.value,
                            reason=reason,
                            lease_expires_at=None,
                            updated_at=now,
                        )
                    )
                    report.skipped += 1
                transient: defaultdict[str, int] = defaultdict(int)
                seen: defaultdict[str, int] = defaultdict(int)
                accepted = _AcceptedRun(now)
                for item, response in answered:
                    seen[item.push_service] += 1
                    report.by_service[item.push_service][
                        str(response.status or response.error)
                    ] += 1
                    outcome = self._apply_one(
                        session, item, subs[item.subscription_id], response, now, report, accepted
                    )
                    if outcome == Outcome.REVOKED:
                        pruned.append(item)
                    elif outcome == Outcome.RETRY:
                        transient[item.push_service] += 1
                accepted.flush(session)
                for service, count in transient.items():
                    ratio = count / seen[service]
                    if count >= self.settings.circuit_min and ratio >= self.settings.circuit_ratio:
                        reason = f"{count} of {seen[service]} answers were 429/5xx"
                        self._open_circuit(session, service, now, reason)
        finally:
            # Emitted even when the database write failed, so operators know (seed 003).
            for item in pruned:
                metrics.pruned(item.push_service)
                audit.warning(
                    "push_token_pruned",
                    extra={
                        "subscription": str(item.subscription_id),
                        "provider": item.push_service,
                        "reason": "410 Gone",
                        "delivery": item.delivery_id,
                    },
                )

    def _apply_one(
        self,
        session: Session,
        item: _Claimed,
        sub: Any,
        response: PushResponse,
        now: dt.datetime,
        report: TickReport,
        accepted: _AcceptedRun,
    ) -> Outcome:
        """One answer: the delivery's new status and the subscription's lifecycle.

        An acceptance joins ``accepted``, written together with the acceptances next to
        it; any other answer first writes those, so the writes keep the answers' order.
        """
        step = apply_answer(
            Lifecycle(
                SubscriptionState(sub.state),
                sub.consecutive_failures,
                sub.last_success_at is not None,
            ),
            response.answer(PushService(item.push_service)),
            failures_before_stale=self.failures_before_stale,
        )
        if step.outcome == Outcome.ACCEPTED:
            accepted.add(session, item, response.status)
            report.accepted += 1
            return step.outcome
        accepted.flush(session)
        delivery: dict[str, Any] = {
            "last_status_code": response.status,
            "lease_expires_at": None,
            "updated_at": now,
        }
        subscription = _s.c.id == item.subscription_id
        if step.outcome == Outcome.REVOKED:
            delivery |= {"status": DeliveryStatus.REVOKED.value, "reason": "gone"}
            report.revoked += 1
            self._revoke(session, item, sub, now)
        elif step.outcome == Outcome.FAILED:
            delivery |= {
                "status": DeliveryStatus.FAILED.value,
                "reason": f"{step.reason}_{response.status}",
            }
            report.failed += 1
            values: dict[str, Any] = {"last_failure_at": now, "last_status_code": response.status}
            if step.reason == "not_found":
                values["consecutive_failures"] = step.lifecycle.consecutive_failures
                if step.lifecycle.state != SubscriptionState(sub.state):
                    values |= {"state": step.lifecycle.state.value, "stale_at": now}
            session.execute(sa.update(_s).where(subscription).values(**values))
            metrics.failure(item.push_service, step.reason)
        elif may_retry(item.attempts, self.retry):
            delay = backoff_delay(
                item.attempts, self.retry, retry_after=response.retry_after, rand=self.rand
            )
            delivery |= {
                "status": DeliveryStatus.QUEUED.value,
                "reason": step.reason,
                "next_attempt_at": now + dt.timedelta(seconds=delay),
            }
            report.retried += 1
        else:
            delivery |= {"status": DeliveryStatus.FAILED.value, "reason": "max_attempts"}
            report.failed += 1
            metrics.failure(item.push_service, "max_retries_exceeded")
        session.execute(sa.update(_d).where(_d.c.id == item.delivery_id).values(**delivery))
        return step.outcome

    def _revoke(self, session: Session, item: _Claimed, sub: Any, now: dt.datetime) -> None:
        changed = session.execute(
            sa.update(_s)
            .where(_s.c.id == item.subscription_id, _s.c.state != SubscriptionState.REVOKED.value)
            .values(
                state=SubscriptionState.REVOKED.value,
                revoked_at=now,
                ended_at=now,
                end_reason=EndReason.REVOKED_BY_PUSH_SERVICE.value,
                last_status_code=410,
                last_failure_at=now,
            )
        ).rowcount
        if changed and sub.subscriber_id is not None:
            consent_log.append(
                session,
                kind=EventKind.REVOKED_BY_PUSH_SERVICE,
                subscriber_id=sub.subscriber_id,
                subscription_id=item.subscription_id,
                previous_state=sub.state,
                new_state=SubscriptionState.REVOKED.value,
                source=Source.SYSTEM.value,
                actor="system",
                recorded_at=now,
                context=consent_log.Context(
                    screen="dispatch", extra={"delivery": str(item.delivery_id)}
                ),
            )

    def _open_circuit(self, session: Session, service: str, now: dt.datetime, reason: str) -> None:
        until = now + dt.timedelta(seconds=self.settings.circuit_seconds)
        existing = session.get(CircuitState, service)
        if existing is None:
            session.add(
                CircuitState(push_service=service, open_until=until, reason=reason, opened_at=now)
            )
        else:
            existing.open_until, existing.reason, existing.opened_at = until, reason, now
        log.warning("push service %s slowed down until %s: %s", service, until.isoformat(), reason)


@dataclass
class _AcceptedRun:
    """Consecutive acceptances with one status code, written in two statements: two
    statements per delivery were most of the engine's time (docs/BENCHMARKS.md)."""

    now: dt.datetime
    status: int | None = None
    deliveries: list[int] = field(default_factory=list)
    subscriptions: list[uuid.UUID] = field(default_factory=list)

    def add(self, session: Session, item: _Claimed, status: int | None) -> None:
        if self.deliveries and status != self.status:
            self.flush(session)
        self.status = status
        self.deliveries.append(item.delivery_id)
        self.subscriptions.append(item.subscription_id)

    def flush(self, session: Session) -> None:
        if not self.deliveries:
            return
        session.execute(
            sa.update(_s)
            # A subscription can be in two campaigns of one batch: each id once.
            .where(_s.c.id.in_(sorted(set(self.subscriptions))))
            .values(
                state=sa.case(
                    (_s.c.state.in_(["revoked", "expired"]), _s.c.state),
                    else_=sa.cast(
                        sa.literal(SubscriptionState.ACTIVE.value), subscription_state_type
                    ),
                ),
                last_success_at=self.now,
                consecutive_failures=0,
                stale_at=None,
                last_status_code=self.status,
            )
        )
        session.execute(
            sa.update(_d)
            .where(_d.c.id.in_(self.deliveries))
            .values(
                status=DeliveryStatus.ACCEPTED.value,
                reason=None,
                last_status_code=self.status,
                lease_expires_at=None,
                updated_at=self.now,
            )
        )
        self.deliveries.clear()
        self.subscriptions.clear()


def _skip_reason(sub: Any) -> str:
    if sub is None:
        return "subscription_gone"
    if sub.deleted_at is not None:
        return "subscription_ended"
    if sub.state not in ("pending", "active"):
        return f"subscription_{sub.state}"
    return "consent_withdrawn"
