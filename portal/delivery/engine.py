"""The dispatch engine: claim due deliveries, re-check consent, send, apply the answers.

Any number of processes run it at once. Work is claimed in the database — ``FOR UPDATE
SKIP LOCKED`` with a lease on PostgreSQL, the write lock on SQLite — so a delivery is
sent by one process at a time. The sender renews its lease while the batch is out; a
lease that runs out (the process died mid-send) makes its deliveries claimable again,
so after a crash only the sends that were in flight can repeat, and they carry the same
delivery id for the service worker to drop.
"""

from __future__ import annotations

import binascii
import datetime as dt
import logging
import random
import threading
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from portal.campaigns import metrics, settled, unsent, variants
from portal.campaigns.models import Campaign, CampaignStatus, CircuitState
from portal.campaigns.services import (
    MaterialisingElsewhere,
    PayloadTemplate,
    live_subscription_query,
    materialise_batch,
)
from portal.config import b64url_decode
from portal.consent import log as consent_log
from portal.consent.models import EventKind
from portal.consent.recipients import recipient_query
from portal.db import among, db, is_postgres
from portal.delivery import caps, partitions, quiet
from portal.delivery.models import DUE_SQL, Delivery, DeliveryStatus, Unsendable
from portal.push.encryption import InvalidSubscriptionKeys, PayloadTooLarge
from portal.push.transport import (
    BatchInterrupted,
    InvalidEndpoint,
    InvalidPushRequest,
    PushRequest,
    PushResponse,
    PushTransport,
    Urgency,
)
from portal.seams import current_portal
from portal.subscriptions.lifecycle import (
    Lifecycle,
    Outcome,
    Transition,
    apply_answer,
    backoff_delay,
    may_retry,
)
from portal.subscriptions.models import (
    LIVE_STATES,
    EndReason,
    PushService,
    PushSubscription,
    SubscriptionState,
    subscription_state_type,
)
from portal.subscriptions.sealing import KeyRing, SealBroken, UnknownKeyVersion
from portal.subscriptions.services import Ending, end_subscriptions

log = logging.getLogger("portal.dispatch")
audit = logging.getLogger("portal.audit")
_d = cast(sa.Table, Delivery.__table__)
_s = cast(sa.Table, PushSubscription.__table__)
_c = cast(sa.Table, Campaign.__table__)
# ix_delivery_due's predicate as SQLite's claim repeats it, qualified by the table.
_DUE = sa.text(f"{_d.name}.{DUE_SQL}")


# How often a sender waiting for another process's batch of deliveries claims again.
MATERIALISE_POLL_SECONDS = 0.1


@dataclass
class EngineSettings:
    batch_size: int = 500
    lease_seconds: float = 60.0
    materialise_batch: int = 5000
    # How long a sender with nothing to claim waits for another process writing a
    # campaign's next batch before its tick ends (seconds).
    materialise_wait: float = 10.0
    # A push service answering 429/5xx to this share of a batch (at least `circuit_min`
    # answers) is left alone for `circuit_seconds`, while the others go on.
    circuit_ratio: float = 0.5
    circuit_min: int = 20
    circuit_seconds: float = 30.0
    # While nothing sends, the gauges are refreshed at most this often (seconds).
    gauge_seconds: float = 60.0
    # What an ended campaign left queued is marked skipped this many rows a transaction,
    # for at most this long a tick (seconds; portal/campaigns/unsent.py).
    unsent_chunk: int = 5000
    unsent_seconds: float = 2.0


@dataclass
class Pace:
    """Holds a sender to a share of one CPU: after each batch it rests until the CPU its
    batch cost (the sending thread's, and the recorder thread's for the batch written
    meanwhile) is at most ``share`` of the time since the batch began. Beside the pages
    (the embedded scheduler in a web worker) this leaves the worker's request threads
    the rest of the process's time and of the interpreter's lock (SPEC §7)."""

    share: float
    cpu_clock: Callable[[], float] = time.thread_time  # this thread's CPU seconds
    wall_clock: Callable[[], float] = time.monotonic
    began: float = 0.0  # wall_clock() at the batch's start
    cpu: float = 0.0  # cpu_clock() at the batch's start

    def start(self) -> None:
        self.began, self.cpu = self.wall_clock(), self.cpu_clock()

    def due_rest(self, written_cpu: float) -> float:
        """Seconds to rest after the batch, ``written_cpu`` being the CPU another thread
        spent writing answers meanwhile."""
        if self.share >= 1.0:
            return 0.0
        used = self.cpu_clock() - self.cpu + written_cpu
        return max(0.0, used / self.share - (self.wall_clock() - self.began))

    def rest(self, written_cpu: float, stop: threading.Event | None) -> float:
        """Rest as long as the batch's CPU asks (less if ``stop`` is set); the seconds."""
        wait = self.due_rest(written_cpu)
        if wait > 0:
            metrics.sender_rested.inc(wait)
            _pause(wait, stop)
        return wait


def _pause(seconds: float, stop: threading.Event | None) -> None:
    """Sleep, or less if ``stop`` is set meanwhile."""
    if stop is not None:
        stop.wait(seconds)
    else:
        time.sleep(seconds)


@dataclass
class _Claimed:
    delivery_id: int
    campaign_id: uuid.UUID
    subscription_id: uuid.UUID
    push_service: str
    attempts: int
    variant: int | None = None  # the A/B variant (portal/campaigns/variants.py)


# A claimed delivery still out: what every write about a batch (its answers, its lease)
# requires. A delivery already answered (a second process sent it after this one's lease
# ran out, and wrote first) keeps its answer: no answer changes a delivery that is not
# ``sending``, so once none of a finished campaign's deliveries is out its counts never
# change again (portal/campaigns/settled.py).
_STILL_OUT = _d.c.status == DeliveryStatus.SENDING.value


def _one(item: _Claimed) -> sa.ColumnElement[bool]:
    """The claimed delivery's row, while it is still out (``_STILL_OUT``). With its
    campaign, which partitions ``delivery`` on PostgreSQL (migration 0031), so the write
    reads one partition's primary key."""
    return sa.and_(_d.c.id == item.delivery_id, _d.c.campaign_id == item.campaign_id, _STILL_OUT)


@dataclass
class TickReport:
    claimed: int = 0
    accepted: int = 0
    failed: int = 0
    revoked: int = 0
    skipped: int = 0
    retried: int = 0
    deferred: int = 0  # back in the queue until quiet hours end (portal/delivery/quiet.py)
    materialised: int = 0
    rested: float = 0.0  # seconds paused to keep to the CPU share (Pace)
    by_service: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )


def _winner_is_due(campaign: Campaign, now: dt.datetime) -> bool:
    """Whether an A/B test's winner is due; a campaign whose winner time cannot be worked
    out (off the calendar) is said in the log and left, not let stop the others."""
    try:
        return (variants.winner_due(campaign) or now) <= now
    except OverflowError:
        log.error("campaign %s: its winner's time is off the calendar", campaign.id)
        return False


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
        portal = current_portal(app)
        self.clock = portal.clock
        self.keys: KeyRing = portal.keys
        self.retry = portal.settings.retry
        self.failures_before_stale = portal.settings.failures_before_stale
        self.frequency_caps = portal.settings.frequency_caps
        self.quiet_hours = portal.settings.quiet_hours.window
        self._lock = threading.Lock()
        self._gauges_at = -float("inf")  # time.monotonic() of the last gauge refresh
        # Per ended campaign, the place in its queue the last chunk marked skipped up to.
        self._unsent_after: dict[uuid.UUID, unsent.Key] = {}

    # -- campaign bookkeeping ---------------------------------------------------------

    def advance_campaigns(self) -> int:
        """Start due campaigns, materialise some of their audience, close finished ones."""
        return self._advance()[0]

    def _advance(self) -> tuple[int, set[uuid.UUID]]:
        """``advance_campaigns``: the deliveries materialised, and the campaigns whose next
        batch another process was writing meanwhile (their rows are on their way)."""
        now = self.clock.now()
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
                # The campaign row first, locked as a cancel locks it: it waits for a batch
                # being materialised, claimed or recorded (each holds a lock on that row).
                # The row alone, as a cancel: what the campaign left queued is marked
                # skipped afterwards, a chunk at a time (skip_unsent).
                session.execute(sa.select(_c.c.id).where(_c.c.id == campaign_id).with_for_update())
                session.execute(
                    sa.update(_c)
                    .where(_c.c.id == campaign_id)
                    .values(
                        status=CampaignStatus.EXPIRED.value,
                        finished_at=now,
                        materialised_at=sa.func.coalesce(_c.c.materialised_at, now),
                    )
                )
        self._send_winners(now)
        materialised, elsewhere = self._materialise(now)
        with db.begin(self.app) as session:
            completed = list(
                session.execute(
                    sa.update(_c)
                    .where(
                        _c.c.status == CampaignStatus.SENDING.value,
                        _c.c.materialised_at.is_not(None),
                        settled.none_out(_c.c.id),
                    )
                    .values(status=CampaignStatus.COMPLETED.value, finished_at=now)
                    .returning(_c.c.id)
                ).scalars()
            )
            # Nothing of them is queued or out: their counts are final, kept for the
            # campaign list in the same transaction.
            settled.settle(session, completed)
        return materialised, elsewhere

    def _materialise(
        self, now: dt.datetime, only: Collection[uuid.UUID] = ()
    ) -> tuple[int, set[uuid.UUID]]:
        """The next batch of each sending campaign's audience still to be written (of
        ``only`` those campaigns, if given): the deliveries written, and the campaigns
        whose batch another process was writing meanwhile."""
        materialised, elsewhere = 0, set()
        if only:
            pending = list(only)
        else:
            with db.begin(self.app) as session:
                pending = list(
                    session.scalars(
                        sa.select(Campaign.id)
                        .where(
                            Campaign.status == CampaignStatus.SENDING.value,
                            Campaign.materialised_at.is_(None),
                        )
                        .order_by(Campaign.send_at, Campaign.id)  # ids are in creation order
                    )
                )
        for campaign_id in pending:
            # One campaign that cannot be materialised (a bug, a time off the calendar in
            # a row from before its rule) fails alone, said in the log each run; the
            # others go on (SPEC §7: no input stalls the engine).
            try:
                with db.begin(self.app) as session:
                    fresh = session.get(Campaign, campaign_id)
                    if fresh is not None and fresh.status == CampaignStatus.SENDING.value:
                        materialised += materialise_batch(
                            session, fresh, now=now, batch=self.settings.materialise_batch
                        )
            except MaterialisingElsewhere:
                elsewhere.add(campaign_id)
            except (ArithmeticError, ValueError, LookupError):
                log.exception("campaign %s: its audience could not be materialised", campaign_id)
        return materialised, elsewhere

    def _send_winners(self, now: dt.datetime) -> None:
        """A/B tests whose test time is over: the winner to the held deliveries
        (portal/campaigns/variants.py)."""
        with db.begin(self.app) as session:
            testing = session.scalars(
                sa.select(Campaign).where(
                    Campaign.status.in_([_SENDING, CampaignStatus.PAUSED.value]),
                    Campaign.winner_after.is_not(None),
                    Campaign.winner.is_(None),
                    Campaign.materialised_at.is_not(None),
                )
            ).all()
            due = [c.id for c in testing if _winner_is_due(c, now)]
        for campaign_id in due:
            try:
                with db.begin(self.app) as session:
                    variants.send_winner(session, campaign_id, now=now)
            except (ArithmeticError, ValueError, LookupError):
                log.exception("campaign %s: its winner could not be sent", campaign_id)

    # -- claiming ---------------------------------------------------------------------

    def _open_circuits(self, session: Session, now: dt.datetime) -> list[str]:
        return list(
            session.execute(
                sa.select(CircuitState.push_service).where(CircuitState.open_until > now)
            ).scalars()
        )

    def claim(self, *, also_blocked: dict[str, dt.datetime] | None = None) -> list[_Claimed]:
        """Take up to a batch of due deliveries. ``also_blocked``: circuits a batch whose
        answers are still being written has opened (push service → open until)."""
        now = self.clock.now()
        lease = now + dt.timedelta(seconds=self.settings.lease_seconds)
        with db.begin(self.app) as session:
            blocked = self._open_circuits(session, now)
            blocked += [
                service
                for service, until in (also_blocked or {}).items()
                if until > now and service not in blocked
            ]
            # A row out under a lease was due when it was claimed, so the range on
            # next_attempt_at holds it too.
            due: sa.ColumnElement[bool] = sa.and_(
                _d.c.next_attempt_at <= now,
                sa.or_(
                    _d.c.status == DeliveryStatus.QUEUED.value,
                    # A lease that ran out: the process sending it died. Claimable again.
                    sa.and_(
                        _d.c.status == DeliveryStatus.SENDING.value,
                        _d.c.lease_expires_at < now,
                    ),
                ),
            )
            if not is_postgres(session):
                # PostgreSQL proves from the OR that ix_delivery_due's predicate holds;
                # SQLite only sees it when the query repeats it word for word. (Repeated
                # on PostgreSQL it would be counted twice in the row estimates.)
                due = sa.and_(_DUE, due)
            if blocked:
                due = sa.and_(due, _d.c.push_service.not_in(blocked))
            # The sending campaigns. On PostgreSQL their rows are held (shared) until the
            # claim commits: a pause or cancel (which locks the row for update) waits for
            # the claim, then sees what it took; a claim never takes a delivery of a
            # campaign whose pause or cancel is being written (SKIP LOCKED passes it by).
            # On SQLite the write lock the transaction began with serialises the two.
            sending = session.scalars(
                sa.select(_c.c.id)
                .where(_c.c.status == CampaignStatus.SENDING.value)
                .order_by(_c.c.send_at, _c.c.id)
                .with_for_update(key_share=True, read=True, skip_locked=True)
            ).all()
            # Each campaign's next deliveries in due order, the campaigns in the order
            # they were to start, until the batch is full. Each statement reads, locks
            # and takes only the rows it leases, from one campaign's part of
            # ix_delivery_due (campaign, due time, id) in one partition: whatever was
            # sent, waits for later, or belongs to a campaign paused with its deliveries
            # due (walking the due rows of every campaign in time order read all of those
            # first) or to the other campaigns. One select over all the sending campaigns
            # was tried: it locked a batch of each (a second claimer found nothing), and
            # its per-campaign parts, planned for runtime partition pruning, sorted all
            # of a campaign's due rows to find its first.
            rows: list[Any] = []
            for campaign_id in sending:
                wanted = self.settings.batch_size - len(rows)
                if wanted <= 0:
                    break
                rows += self._lease(session, campaign_id, due, wanted, now=now, lease=lease)
        return sorted((_Claimed(*row) for row in rows), key=lambda c: c.delivery_id)

    def _lease(
        self,
        session: Session,
        campaign_id: uuid.UUID,
        due: sa.ColumnElement[bool],
        wanted: int,
        *,
        now: dt.datetime,
        lease: dt.datetime,
    ) -> list[Any]:
        """Up to ``wanted`` of one campaign's due deliveries, in due order, leased: one
        statement chooses, locks and leases them in one round trip."""
        chosen_rows = (
            sa.select(_d.c.id)
            .where(_d.c.campaign_id == campaign_id, due)
            .order_by(_d.c.next_attempt_at, _d.c.id)
            .limit(wanted)
        )
        # One statement: choose, lock and lease (partitions.picked).
        chosen = partitions.picked(session, chosen_rows, campaign_id)
        return list(
            session.execute(
                sa.update(_d)
                .where(chosen)
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
                    _d.c.variant,
                )
            ).all()
        )

    # -- sending ----------------------------------------------------------------------

    def tick(
        self,
        *,
        stop: threading.Event | None = None,
        max_batches: int | None = None,
        cpu_share: float = 1.0,
    ) -> TickReport:
        """Advance campaigns and send until nothing is due (or ``max_batches``).

        On PostgreSQL one batch's answers are written while the next batch is claimed,
        encrypted and sent: the writes wait on the database, the sending on the push
        services, and each used to idle while the other ran. The next batch is planned
        with what the previous batch's answers decided (circuits opened, subscriptions
        revoked or gone stale), so it behaves as if those answers were already written.
        SQLite has one writer at a time, so there the answers are written in turn.

        ``cpu_share`` (at most 1) holds the sending to that share of one CPU (``Pace``).
        """
        report = TickReport()
        if not self._anything_to_do():
            # Idle: one cheap query a tick, however many processes tick (SPEC §7).
            self._update_gauges(idle=True)
            return report
        report.materialised += self.advance_campaigns()
        report.skipped += self.skip_unsent(stop)
        batches = 0
        waiting = _Waiting(self.settings.materialise_wait)
        overlap = self._overlap()
        recorder = ThreadPoolExecutor(1, thread_name_prefix="dispatch-record") if overlap else None
        recording: _Recording | None = None  # the previous batch's answers, being written
        pace = Pace(cpu_share)
        try:
            while stop is None or not stop.is_set():
                pace.start()
                claimed = self.claim(also_blocked=recording.plan.circuits if recording else {})
                if not claimed:
                    # Everything written before materialising more or closing campaigns.
                    done, recording = recording, None
                    _finish(done)
                    if self._more_to_claim(report, waiting, stop):
                        continue
                    break
                waiting.reset()
                report.claimed += len(claimed)
                plan, lease = self._send_leased(claimed, report, recording)
                previous, recording = recording, _Recording(plan, lease)
                try:
                    _finish(previous)
                finally:
                    recording.start(recorder, self._write)
                self._materialise_ahead(claimed, report, stop)
                report.rested += pace.rest(previous.cpu if previous else 0.0, stop)
                batches += 1
                if max_batches is not None and batches >= max_batches:
                    break
        except BaseException:
            try:
                _finish(recording)
            except Exception:
                # The first failure is the one raised; this one is only logged.
                log.exception("could not record a batch's answers")
            raise
        finally:
            if recorder is not None:
                recorder.shutdown(wait=True)
        _finish(recording)
        self.advance_campaigns()
        self._update_gauges()
        return report

    def skip_unsent(self, stop: threading.Event | None = None) -> int:
        """Mark skipped what cancelled and expired campaigns left queued
        (portal/campaigns/unsent.py), ``unsent_chunk`` rows a transaction, for at most
        ``unsent_seconds`` a tick; a campaign marked to its end has its counts kept
        (portal/campaigns/settled.py). The deliveries marked.

        Each campaign's chunks follow on from the last one this process marked. Once one
        comes back short, the next looks from the campaign's start (a row may have been
        queued behind the place meanwhile: an answer's retry); when that finds none, the
        campaign's deliveries whose sender stopped before writing their answer are ended
        (``unsent.end_lost``) and the campaign is done."""
        deadline = time.monotonic() + self.settings.unsent_seconds
        marked = 0
        with db.begin(self.app) as session:
            campaigns = unsent.to_skip(session, self.clock.now())
        # Places in campaigns another process has marked to the end are not needed.
        for done in set(self._unsent_after) - {campaign_id for campaign_id, _ in campaigns}:
            del self._unsent_after[done]
        for campaign_id, reason in campaigns:
            while True:
                if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                    return marked
                after = self._unsent_after.pop(campaign_id, None)
                with db.begin(self.app) as session:
                    count, last = unsent.skip_chunk(
                        session,
                        campaign_id,
                        reason,
                        now=self.clock.now(),
                        after=after,
                        limit=self.settings.unsent_chunk,
                    )
                    if last is None and after is None:
                        lost = unsent.end_lost(session, campaign_id, now=self.clock.now())
                        if lost:
                            log.warning(
                                "campaign %s ended with %d deliveries out whose sending "
                                "process stopped before writing the answer: failed, no "
                                "answer recorded",
                                campaign_id,
                                lost,
                            )
                        settled.settle(session, [campaign_id])
                marked += count
                if last is not None and count == self.settings.unsent_chunk:
                    self._unsent_after[campaign_id] = last  # the next chunk goes on from here
                elif after is None and last is None:
                    break  # none left from the start: done
                # else a short chunk reached the end: the next looks from the start
        return marked

    def _more_to_claim(
        self, report: TickReport, waiting: _Waiting, stop: threading.Event | None
    ) -> bool:
        """With nothing to claim: campaigns advanced (more of an audience written, finished
        ones closed); whether there may now be something to claim."""
        if waiting.campaigns:
            # Waiting already: only whether those batches are written yet, not every step
            # of advancing campaigns again (nor a campaign that fails to materialise
            # tried, and said in the log, again) at each look.
            more, elsewhere = self._materialise(self.clock.now(), only=waiting.campaigns)
        else:
            more, elsewhere = self._advance()
        report.materialised += more
        if more:
            waiting.reset()
            return True
        # Another process writing a campaign's next batch: its rows are claimable once it
        # commits. Ending the tick here left this process idle until its next tick
        # (seconds), at every batch of every campaign.
        waiting.campaigns = elsewhere
        return bool(elsewhere) and waiting.wait(stop)

    def _materialise_ahead(
        self, claimed: list[_Claimed], report: TickReport, stop: threading.Event | None
    ) -> None:
        """After a short claim (the queue running dry), the next batch of any audience
        still being written: now, while that batch's answers are recorded and the other
        senders still hold theirs, rather than once every sender finds the queue empty
        and all wait for one of them to write it. Not once the tick is being stopped."""
        if len(claimed) < self.settings.batch_size and not (stop and stop.is_set()):
            report.materialised += self._materialise(self.clock.now())[0]

    def _send_leased(
        self, claimed: list[_Claimed], report: TickReport, recording: _Recording | None
    ) -> tuple[_Plan, _LeaseKeeper]:
        """Send a claimed batch under a lease kept while it is out; planned with what the
        batch being written (``recording``) decided."""
        lease = _LeaseKeeper(self, [c.delivery_id for c in claimed]).start()
        try:
            plan = self._send(claimed, report, recording.plan if recording else None)
        except BaseException:
            lease.stop()
            raise
        return plan, lease

    def _anything_to_do(self) -> bool:
        """Whether a campaign is sending, due to start, paused past its end, or ended with
        deliveries still to mark skipped: only then has a tick anything to advance, claim,
        mark or close. One query on a small table."""
        now = self.clock.now()
        with db.begin(self.app) as session:
            return bool(
                session.execute(
                    sa.select(
                        sa.exists().where(
                            sa.or_(
                                _c.c.status == CampaignStatus.SENDING.value,
                                sa.and_(
                                    _c.c.status == CampaignStatus.SCHEDULED.value,
                                    _c.c.send_at <= now,
                                ),
                                sa.and_(
                                    _c.c.status == CampaignStatus.PAUSED.value,
                                    _c.c.deliver_until.is_not(None),
                                    _c.c.deliver_until <= now,
                                ),
                                unsent.waiting(now),
                            )
                        )
                    )
                ).scalar_one()
            )

    def _overlap(self) -> bool:
        with db.begin(self.app) as session:
            return is_postgres(session)

    def _update_gauges(self, *, idle: bool = False) -> None:
        """The queued and revoked gauges; an idle tick refreshes them at most once every
        ``gauge_seconds`` (a paused campaign's queue or the revocations may change while
        nothing sends)."""
        started = time.monotonic()
        with self._lock:
            if idle and started - self._gauges_at < self.settings.gauge_seconds:
                return
            self._gauges_at = started
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

    def _send(self, claimed: list[_Claimed], report: TickReport, previous: _Plan | None) -> _Plan:
        now = self.clock.now()
        carried = previous.lifecycles if previous is not None else {}
        skipped, unsent, answered, subs, held, deferred = self._encrypt_and_send(claimed, carried)
        plan = self._plan(skipped, unsent, answered, subs, carried, now, report)
        plan.held = held
        plan.deferred = deferred
        report.deferred += len(deferred)
        return plan

    def _encrypt_and_send(
        self, claimed: list[_Claimed], carried: dict[uuid.UUID, Lifecycle]
    ) -> tuple[
        list[tuple[_Claimed, str]],
        list[tuple[_Claimed, Unsendable]],
        list[tuple[_Claimed, PushResponse]],
        dict[uuid.UUID, Any],
        list[_Claimed],
        list[tuple[_Claimed, dt.datetime]],
    ]:
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
                    query = recipient_query(campaign.topic_id).where(among(session, _s.c.id, mine))
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
                    ).where(among(session, _s.c.id, by_subscription))
                )
            }
            # Claimed just before a pause, cancel or expiry committed: not sent. The
            # recording puts them back in the queue, or ends them as the campaign now says.
            held = [c for c in claimed if campaigns[c.campaign_id].status != _SENDING]
            claimed = [c for c in claimed if campaigns[c.campaign_id].status == _SENDING]
            claimed, deferred, over_cap = self._hold_back(
                session, claimed, allowed, subs, campaigns
            )
        skipped: list[tuple[_Claimed, str]] = []
        unsent: list[tuple[_Claimed, Unsendable]] = []  # could not be built or sent
        sent: list[_Claimed] = []
        # Per campaign and variant, read once: the message template and the request options.
        messages = {
            (c.id, variant): (
                PayloadTemplate(c, variant),
                c.ttl,
                Urgency(c.urgency),
                c.collapse_key,
            )
            for c in campaigns.values()
            for variant in (None, *range(len(c.variants or ())))
        }

        def requests() -> Iterator[PushRequest]:
            # Encrypted one at a time as the transport takes them, so encryption runs
            # while the earlier messages are on the wire and at the push service.
            for item in claimed:
                sub = subs.get(item.subscription_id)
                if item.subscription_id not in allowed or sub is None:
                    skipped.append((item, _skip_reason(sub)))
                    continue
                if item.delivery_id in over_cap:
                    skipped.append((item, caps.FREQUENCY_CAP))
                    continue
                known = carried.get(item.subscription_id)
                if known is not None and known.state not in LIVE_STATES:
                    # Revoked or gone stale by the previous batch's answers, not yet written.
                    skipped.append((item, f"subscription_{known.state.value}"))
                    continue
                template, ttl, urgency, topic = messages[item.campaign_id, item.variant]
                try:
                    secret = self.keys.open(bytes(sub.auth_sealed), sub.auth_key_version)
                    request = PushRequest.encrypted(
                        sub.endpoint,
                        template.render(item.delivery_id),
                        p256dh=b64url_decode(sub.p256dh),
                        auth=secret,
                        ttl=ttl,
                        urgency=urgency,
                        topic=topic,
                    )
                except Exception as error:
                    # Whatever this one delivery raises ends this one delivery, with its
                    # reason; the rest of the batch goes on (SPEC §7).
                    reason = unsendable_reason(error)
                    log.error(
                        "delivery %s cannot be sent (%s): %s",
                        item.delivery_id,
                        reason,
                        _describe(error, reason),
                    )
                    if reason is Unsendable.UNREADABLE_KEYS:
                        skipped.append((item, reason))
                    else:
                        unsent.append((item, reason))
                    continue
                sent.append(item)
                yield request

        started = time.perf_counter()
        responses = self._send_all(requests(), sent, unsent)
        elapsed = time.perf_counter() - started
        answered = list(zip(sent, responses, strict=True))
        metrics.observe_sends(
            [(item.push_service, response) for item, response in answered],
            elapsed / max(len(sent), 1),
        )
        return skipped, unsent, answered, subs, held, deferred

    def _hold_back(
        self,
        session: Session,
        claimed: list[_Claimed],
        allowed: dict[uuid.UUID, Any],
        subs: dict[uuid.UUID, Any],
        campaigns: dict[uuid.UUID, Campaign],
    ) -> tuple[list[_Claimed], list[tuple[_Claimed, dt.datetime]], set[int]]:
        """Of the deliveries the person still agrees to get: the marketing ones whose
        turn came in quiet hours where the person is (back in the queue until they end),
        and of the rest the ones over a frequency cap (skipped). Returns the claimed
        without the first, the first with when they are due, and the second's ids."""
        marketing = caps.marketing_campaigns(session, campaigns.values())
        deferred = self._quiet(claimed, allowed, campaigns, marketing)
        waiting = {c.delivery_id for c, _ in deferred}
        claimed = [c for c in claimed if c.delivery_id not in waiting]
        over_cap = caps.over_cap(
            session,
            [
                caps.Candidate(
                    c.delivery_id,
                    c.campaign_id,
                    c.subscription_id,
                    subs[c.subscription_id].subscriber_id,
                )
                for c in claimed
                if c.subscription_id in allowed and c.subscription_id in subs
            ],
            marketing,
            now=self.clock.now(),
            caps=self.frequency_caps,
        )
        return claimed, deferred, over_cap

    def _quiet(
        self,
        claimed: list[_Claimed],
        allowed: dict[uuid.UUID, Any],
        campaigns: dict[uuid.UUID, Campaign],
        marketing: set[uuid.UUID],
    ) -> list[tuple[_Claimed, dt.datetime]]:
        """The claimed marketing deliveries inside the portal's or the person's quiet
        hours, each with when those end (portal/delivery/quiet.py)."""
        now = self.clock.now()
        found: list[tuple[_Claimed, dt.datetime]] = []
        for item in claimed:
            row = allowed.get(item.subscription_id)
            if row is None or item.campaign_id not in marketing:
                continue  # not sent anyway, or never held (transactional, a test)
            windows = [
                w for w in (self.quiet_hours, quiet.window(row.quiet_from, row.quiet_until)) if w
            ]
            if not windows:
                continue
            campaign = campaigns[item.campaign_id]
            zone = row.time_zone or campaign.fallback_zone or campaign.time_zone or "UTC"
            until = quiet.quiet_until(now, zone, windows)
            if until is not None:
                found.append((item, until))
        return found

    def _send_all(
        self,
        requests: Iterator[PushRequest],
        sent: list[_Claimed],
        unsent: list[tuple[_Claimed, Unsendable]],
    ) -> list[PushResponse]:
        """Send what ``requests`` yields (``sent`` names their deliveries, in order); a
        request the transport cannot prepare moves from ``sent`` to ``unsent`` with its
        reason, and the rest are sent."""
        responses: list[PushResponse] = []
        while True:
            try:
                responses += self.transport.send_batch(requests)
                return responses
            except BatchInterrupted as interrupted:
                # The transport took one more request than it answered and raised on it.
                responses += interrupted.responses
                cause = interrupted.__cause__
                if len(sent) <= len(responses) or not isinstance(cause, Exception):
                    raise  # not one request's fault: the batch's generator itself broke
                item = sent.pop(len(responses))
                reason = unsendable_reason(cause)
                log.error(
                    "delivery %s cannot be sent (%s): %s",
                    item.delivery_id,
                    reason,
                    _describe(cause, reason),
                )
                unsent.append((item, reason))

    def _plan(
        self,
        skipped: list[tuple[_Claimed, str]],
        unsent: list[tuple[_Claimed, Unsendable]],
        answered: list[tuple[_Claimed, PushResponse]],
        subs: dict[uuid.UUID, Any],
        carried: dict[uuid.UUID, Lifecycle],
        now: dt.datetime,
        report: TickReport,
    ) -> _Plan:
        """Decide what every answer does (no database work): the writes, in the answers'
        order, the circuits to open and the lifecycles the next batch must see."""
        plan = _Plan(now, skipped, [(item, str(reason)) for item, reason in unsent])
        report.skipped += len(skipped)
        report.failed += len(unsent)
        for item, why in unsent:
            metrics.failure(item.push_service, why)
        transient: defaultdict[str, int] = defaultdict(int)
        seen: defaultdict[str, int] = defaultdict(int)
        for item, response in answered:
            seen[item.push_service] += 1
            report.by_service[item.push_service][str(response.status or response.error)] += 1
            sub = subs[item.subscription_id]
            current = carried.get(item.subscription_id) or Lifecycle(
                SubscriptionState(sub.state),
                sub.consecutive_failures,
                sub.last_success_at is not None,
            )
            step = apply_answer(
                current,
                response.answer(PushService(item.push_service)),
                failures_before_stale=self.failures_before_stale,
            )
            plan.answers.append(_Answer(item, sub, response, step, current.state))
            if step.outcome == Outcome.ACCEPTED:
                report.accepted += 1
                plan.lifecycles[item.subscription_id] = step.lifecycle
            elif step.outcome == Outcome.REVOKED:
                report.revoked += 1
                plan.lifecycles[item.subscription_id] = Lifecycle(
                    SubscriptionState.REVOKED, current.consecutive_failures, current.has_succeeded
                )
            elif step.outcome == Outcome.FAILED:
                report.failed += 1
                if step.reason == "not_found":
                    plan.lifecycles[item.subscription_id] = step.lifecycle
                metrics.failure(item.push_service, step.reason)
            elif may_retry(item.attempts, self.retry):
                transient[item.push_service] += 1
                report.retried += 1
            else:
                transient[item.push_service] += 1
                report.failed += 1
                metrics.failure(item.push_service, "max_retries_exceeded")
        for service, count in transient.items():
            ratio = count / seen[service]
            if count >= self.settings.circuit_min and ratio >= self.settings.circuit_ratio:
                until = now + dt.timedelta(seconds=self.settings.circuit_seconds)
                reason = f"{count} of {seen[service]} answers were 429/5xx"
                plan.circuits[service] = until
                plan.circuit_reasons[service] = reason
        return plan

    def _write(self, plan: _Plan) -> None:
        """Record a planned batch: every delivery's new status and every subscription's
        lifecycle, in the answers' order; under the consent log's lock only when the batch
        appends to it (a 410), so a batch of acceptances never waits for a preference
        save (SPEC §7)."""
        pruned: list[_Claimed] = []
        try:
            with db.begin(self.app) as session:
                closed = _ended_campaigns(session, plan.campaign_ids())
                for item in plan.held:
                    reason = closed.get(item.campaign_id)
                    values: dict[str, Any] = (
                        {"status": DeliveryStatus.SKIPPED.value, "reason": reason}
                        if reason
                        # Back in the queue as it was: this claim is not an attempt.
                        else {"status": DeliveryStatus.QUEUED.value, "attempts": _d.c.attempts - 1}
                    )
                    session.execute(
                        sa.update(_d)
                        .where(_one(item))
                        .values(lease_expires_at=None, updated_at=plan.now, **values)
                    )
                for item, until in plan.deferred:
                    reason = closed.get(item.campaign_id)
                    values = (
                        {"status": DeliveryStatus.SKIPPED.value, "reason": reason}
                        if reason
                        # Due again when the quiet hours end; waiting is not an attempt.
                        else {
                            "status": DeliveryStatus.QUEUED.value,
                            "reason": quiet.QUIET_HOURS,
                            "next_attempt_at": until,
                            "attempts": _d.c.attempts - 1,
                        }
                    )
                    session.execute(
                        sa.update(_d)
                        .where(_one(item))
                        .values(lease_expires_at=None, updated_at=plan.now, **values)
                    )
                for status, ended in (
                    (DeliveryStatus.SKIPPED, plan.skipped),
                    (DeliveryStatus.FAILED, plan.unsent),
                ):
                    for item, reason in ended:
                        session.execute(
                            sa.update(_d)
                            .where(_one(item))
                            .values(
                                status=status.value,
                                reason=reason,
                                lease_expires_at=None,
                                updated_at=plan.now,
                            )
                        )
                accepted = _AcceptedRun(plan.now)
                for answer in plan.answers:
                    if answer.step.outcome == Outcome.REVOKED:
                        pruned.append(answer.item)
                    self._write_one(
                        session, answer, plan.now, accepted, closed.get(answer.item.campaign_id)
                    )
                accepted.flush(session)
                for service, until in plan.circuits.items():
                    self._open_circuit(
                        session, service, plan.now, until, plan.circuit_reasons[service]
                    )
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

    def _write_one(
        self,
        session: Session,
        answer: _Answer,
        now: dt.datetime,
        accepted: _AcceptedRun,
        ended: str | None = None,
    ) -> None:
        """One answer: the delivery's new status and the subscription's lifecycle.

        An acceptance joins ``accepted``, written together with the acceptances next to
        it; any other answer first writes those, so the writes keep the answers' order.
        ``ended``: the skip reason when the delivery's campaign was cancelled or expired
        while it was out, so an answer to try again ends it instead of queueing it.
        """
        item, response, step = answer.item, answer.response, answer.step
        if step.outcome == Outcome.ACCEPTED:
            accepted.add(session, item, response.status)
            return
        accepted.flush(session)
        delivery: dict[str, Any] = {
            "last_status_code": response.status,
            "lease_expires_at": None,
            "updated_at": now,
        }
        subscription = _s.c.id == item.subscription_id
        if step.outcome == Outcome.REVOKED:
            delivery |= {"status": DeliveryStatus.REVOKED.value, "reason": "gone"}
            self._revoke(session, item, answer.sub, answer.state_before, now)
        elif step.outcome == Outcome.FAILED:
            delivery |= {
                "status": DeliveryStatus.FAILED.value,
                "reason": f"{step.reason}_{response.status}",
            }
            values: dict[str, Any] = {"last_failure_at": now, "last_status_code": response.status}
            if step.reason == "not_found":
                values["consecutive_failures"] = step.lifecycle.consecutive_failures
                if step.lifecycle.state != answer.state_before:
                    values |= {"state": step.lifecycle.state.value, "stale_at": now}
            session.execute(sa.update(_s).where(subscription).values(**values))
        elif ended is not None:
            delivery |= {"status": DeliveryStatus.SKIPPED.value, "reason": ended}
        elif may_retry(item.attempts, self.retry):
            delay = backoff_delay(
                item.attempts, self.retry, retry_after=response.retry_after, rand=self.rand
            )
            delivery |= {
                "status": DeliveryStatus.QUEUED.value,
                "reason": step.reason,
                "next_attempt_at": now + dt.timedelta(seconds=delay),
            }
        else:
            delivery |= {"status": DeliveryStatus.FAILED.value, "reason": "max_attempts"}
        session.execute(sa.update(_d).where(_one(item)).values(**delivery))

    def _revoke(
        self,
        session: Session,
        item: _Claimed,
        sub: Any,
        state_before: SubscriptionState,
        now: dt.datetime,
    ) -> None:
        end_subscriptions(
            session,
            [Ending(item.subscription_id, sub.subscriber_id, state_before.value)],
            state=SubscriptionState.REVOKED,
            reason=EndReason.REVOKED_BY_PUSH_SERVICE,
            from_states=[s for s in SubscriptionState if s is not SubscriptionState.REVOKED],
            now=now,
            event=EventKind.REVOKED_BY_PUSH_SERVICE,
            context=consent_log.Context(
                screen="dispatch", extra={"delivery": str(item.delivery_id)}
            ),
            values={"last_status_code": 410, "last_failure_at": now},
        )

    def _open_circuit(
        self, session: Session, service: str, now: dt.datetime, until: dt.datetime, reason: str
    ) -> None:
        existing = session.get(CircuitState, service)
        if existing is None:
            session.add(
                CircuitState(push_service=service, open_until=until, reason=reason, opened_at=now)
            )
        else:
            existing.open_until, existing.reason, existing.opened_at = until, reason, now
        log.warning("push service %s slowed down until %s: %s", service, until.isoformat(), reason)


_SENDING = CampaignStatus.SENDING.value


def _ended_campaigns(session: Session, campaign_ids: set[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Which of these campaigns were cancelled or expired (campaign → skip reason), their
    rows held until the recording commits: a cancel or expiry (which locks the row for
    update) waits, and the deliveries put back in the queue meanwhile are left to
    ``skip_unsent``, as the rest of its queue; one that committed first is seen here, and
    they end instead."""
    if not campaign_ids:
        return {}
    query = sa.select(_c.c.id, _c.c.status).where(among(session, _c.c.id, sorted(campaign_ids)))
    if is_postgres(session):
        query = query.order_by(_c.c.id).with_for_update(key_share=True, read=True)
    return {
        campaign_id: unsent.ENDED_REASONS[status]
        for campaign_id, status in session.execute(query)
        if status in unsent.ENDED_REASONS
    }


@dataclass
class _Answer:
    item: _Claimed
    sub: Any
    response: PushResponse
    step: Transition
    state_before: SubscriptionState


@dataclass
class _Plan:
    """A sent batch's answers, decided and waiting to be written."""

    now: dt.datetime
    skipped: list[tuple[_Claimed, str]]
    unsent: list[tuple[_Claimed, str]]  # failed before an answer: could not be built or sent
    answers: list[_Answer] = field(default_factory=list)
    circuits: dict[str, dt.datetime] = field(default_factory=dict)
    circuit_reasons: dict[str, str] = field(default_factory=dict)
    # Subscriptions whose lifecycle these answers change: the next batch, planned before
    # this one is written, starts from these rather than from the rows it reads.
    lifecycles: dict[uuid.UUID, Lifecycle] = field(default_factory=dict)
    # Claimed but not sent: their campaign was paused, cancelled or expired meanwhile.
    held: list[_Claimed] = field(default_factory=list)
    # Claimed but not sent: quiet hours where the person is, until the time given.
    deferred: list[tuple[_Claimed, dt.datetime]] = field(default_factory=list)

    def campaign_ids(self) -> set[uuid.UUID]:
        """The campaigns whose deliveries this plan may put back in the queue."""
        return (
            {c.campaign_id for c in self.held}
            | {c.campaign_id for c, _ in self.deferred}
            | {a.item.campaign_id for a in self.answers if a.step.outcome == Outcome.RETRY}
        )


class _LeaseKeeper:
    """Renews a batch's lease every third of it until its answers are recorded.

    A slow push service can hold a batch longer than one lease (each request may wait
    out the transport's time-out), and recording the answers can wait for another
    process's (they take the consent log's lock in turn); without renewal another
    process would take the batch and send it a second time meanwhile. A process that
    dies stops renewing, so its batch is claimable again one lease later.
    """

    def __init__(self, dispatcher: Dispatcher, delivery_ids: list[int]) -> None:
        self.dispatcher = dispatcher
        self.delivery_ids = delivery_ids
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="dispatch-lease", daemon=True)

    def start(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _renew(self) -> None:
        dispatcher = self.dispatcher
        seconds = dispatcher.settings.lease_seconds
        while not self._done.wait(seconds / 3):
            try:
                with db.begin(dispatcher.app) as session:
                    # By id alone, though delivery is partitioned by campaign (migration
                    # 0031): with the campaigns named too, the planner may read the
                    # campaign's rows being sent by (campaign, status) instead of the batch
                    # by primary key, and under load a renewal then took up to 3 s of a 3 s
                    # lease (tests/campaigns/test_multiprocess.py sent batches twice).
                    mine = sa.select(_d.c.id).where(
                        among(session, _d.c.id, self.delivery_ids), _STILL_OUT
                    )
                    if is_postgres(session):
                        # Rows the answers are being written to are passed over, never
                        # waited for: renewal must not deadlock with recording.
                        mine = mine.with_for_update(skip_locked=True)
                    session.execute(
                        sa.update(_d)
                        .where(_d.c.id.in_(mine), _STILL_OUT)
                        .values(
                            lease_expires_at=dispatcher.clock.now() + dt.timedelta(seconds=seconds)
                        )
                    )
            except sa.exc.SQLAlchemyError:
                # Tried again at the next third; meanwhile the lease may run out, as
                # it would for a process that died.
                log.warning("could not renew the lease of a batch", exc_info=True)


class _Recording:
    """A planned batch being written (in the recorder thread, or already inline); its
    lease is kept until the write ends, successful or not."""

    def __init__(self, plan: _Plan, lease: _LeaseKeeper) -> None:
        self.plan = plan
        self.lease = lease
        self.future: Future[None] = Future()
        # The writing thread's CPU seconds when written in the recorder's thread (written
        # inline, the sending thread's own pace counts it).
        self.cpu = 0.0

    def _run(self, write: Callable[[_Plan], None]) -> None:
        try:
            write(self.plan)
        finally:
            self.lease.stop()

    def _run_timed(self, write: Callable[[_Plan], None]) -> None:
        started = time.thread_time()
        try:
            self._run(write)
        finally:
            self.cpu = time.thread_time() - started

    def start(self, executor: ThreadPoolExecutor | None, write: Callable[[_Plan], None]) -> None:
        """Write in ``executor``'s thread, or now when there is none."""
        if executor is not None:
            try:
                self.future = executor.submit(self._run_timed, write)
            except BaseException:
                self.lease.stop()
                raise
            return
        try:
            self._run(write)
        except BaseException as error:
            self.future.set_exception(error)
        else:
            self.future.set_result(None)


@dataclass
class _Waiting:
    """A sender waiting for another process's batch of deliveries, for at most ``limit``
    seconds in a row."""

    limit: float
    since: float | None = None  # time.monotonic() when the wait began
    campaigns: set[uuid.UUID] = field(default_factory=set)  # whose batches it waits for

    def reset(self) -> None:
        self.since, self.campaigns = None, set()

    def wait(self, stop: threading.Event | None) -> bool:
        """Wait a moment; False once the wait has lasted ``limit`` (the tick ends)."""
        now = time.monotonic()
        self.since = self.since if self.since is not None else now
        if now - self.since >= self.limit:
            return False
        _pause(MATERIALISE_POLL_SECONDS, stop)
        return True


def _finish(recording: _Recording | None) -> None:
    """Wait for a batch's answers to be written; raise what the write raised."""
    if recording is not None:
        recording.future.result()


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
            .where(among(session, _s.c.id, sorted(set(self.subscriptions))))
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
            # By id alone (as the lease's renewal, for the same reason), while still out.
            .where(among(session, _d.c.id, self.deliveries), _STILL_OUT)
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


def unsendable_reason(error: Exception) -> Unsendable:
    """The reason a delivery whose request raised ``error`` is ended with."""
    if isinstance(error, UnknownKeyVersion | SealBroken | InvalidSubscriptionKeys):
        return Unsendable.UNREADABLE_KEYS
    if isinstance(error, binascii.Error):  # the stored p256dh is no base64url
        return Unsendable.UNREADABLE_KEYS
    if isinstance(error, InvalidEndpoint):
        return Unsendable.INVALID_ENDPOINT
    if isinstance(error, PayloadTooLarge):
        return Unsendable.PAYLOAD_TOO_LARGE
    if isinstance(error, InvalidPushRequest):
        return Unsendable.INVALID_REQUEST
    return Unsendable.SEND_ERROR


def _describe(error: Exception, reason: Unsendable) -> str:
    """What a log line says of ``error``: its message when it is one of the refusals
    that never name an endpoint or a key; otherwise its type and where it was raised
    (the frames, not the message, which might hold either)."""
    if reason is not Unsendable.SEND_ERROR:
        return str(error) if isinstance(error, _OWN_WORDS) else type(error).__name__
    return f"{type(error).__name__}, raised at\n" + "".join(
        traceback.format_tb(error.__traceback__)
    )


_OWN_WORDS = (
    InvalidPushRequest,
    PayloadTooLarge,
    UnknownKeyVersion,
    SealBroken,
    InvalidSubscriptionKeys,
)


def _skip_reason(sub: Any) -> str:
    if sub is None:
        return "subscription_gone"
    if sub.deleted_at is not None:
        return "subscription_ended"
    if sub.state not in LIVE_STATES:
        return f"subscription_{sub.state}"
    return "consent_withdrawn"
