"""Retention of the tables that would otherwise grow for ever: feedback digests and
markers, staff sessions, display receipts (and, in ``portal.ratelimit``, the rate-limit
counters). Each has a rule, a setting with a default (docs/configuration.md), and is
deleted in keyset batches by the ``table-retention`` job, through the same loop as every
sweep (``portal.batches``). None of them changes a figure a page shows:

- **feedback_digest** rows older than ``FEEDBACK_DIGEST_RETENTION_DAYS`` go, but never
  the newest ``RECENT`` (what the delivery-feedback page lists), so that page is the same.
- **feedback_applied** markers older than ``FEEDBACK_MARKER_RETENTION_DAYS`` go: a marker
  makes a sender's retry of an event harmless, and a signed digest is refused after
  ``FEEDBACK_MAX_AGE_SECONDS``, so a marker is needed only as long as the sender retries.
  No page counts them.
- **staff_session** rows that ended (past their lifetime or idle deadline) more than
  ``STAFF_SESSION_RETENTION_DAYS`` ago go: nobody can sign in with them any more.
- **delivery** rows of a campaign that finished more than ``DELIVERY_RETENTION_MONTHS``
  ago (at least the consent log's audit window: a delivery is the proof of consent for
  its send) are folded into the campaign's counters and deleted with their receipts, a
  keyset batch per transaction (``portal.campaigns.tally``): every page counts the
  counters with the rows, so it shows the same figures.
- **delivery_receipt** rows live as long as the delivery they report on: they go with it
  when it is folded; one whose delivery row is gone otherwise (a receipt for an id that
  was never a delivery is refused when reported) goes once it is older than
  ``RECEIPT_RETENTION_MONTHS`` (the consent log's audit window by default).
- **job_run** rows started more than ``JOB_RUN_RETENTION_DAYS`` ago go (the consent log's
  sequencer alone records a run every second: 86,400 a day), but never each job's newest
  run and newest finished run (what the jobs page's table of jobs and the compliance
  page's last log check show) nor the newest ``RECENT_RUNS_LISTED`` runs (the jobs
  page's list of recent runs), so those pages are the same.
- **decision_week** rows (the compliance dashboard's past weeks of decisions, counted
  once) of weeks older than the dashboard's chart shows go: one a week is kept at most
  for each week the chart shows.
- A finished campaign's counts by status are kept on it once its last delivery has come
  back (``portal.campaigns.settled``), so the campaign list stops counting its rows; the
  dispatcher keeps a completed campaign's itself, this job those of cancelled and expired
  campaigns and of campaigns finished before counts were kept.
- **campaign_picture** rows uploaded more than ``PICTURE_UNUSED_RETENTION_DAYS`` ago that
  no campaign and no draft names (as icon, image, badge or a variant's image, in any
  spelling of its ``/media/`` address) go: an upload tried in a preview and never used.
  A picture a campaign names stays as long as the campaign: its notifications fetch it.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from portal import batches
from portal.batches import delete_batches, keyset_batches, replication_throttle
from portal.campaigns import settled, tally
from portal.campaigns.media_models import Picture
from portal.campaigns.models import Campaign, Draft
from portal.compliance.services import first_week
from portal.config import Settings
from portal.consent.models import DecisionWeek
from portal.db import db, held_transaction_lock, is_postgres
from portal.delivery import partitions
from portal.delivery.models import Delivery, DeliveryReceipt
from portal.feedback.models import FeedbackApplied, FeedbackDigest
from portal.jobreport import JobReport, Progress
from portal.operations.models import RECENT_RUNS_LISTED, JobRun
from portal.retention.services import months_before
from portal.seams import current_portal
from portal.staff.models import StaffSession

log = logging.getLogger(__name__)

# The delivery-feedback page lists this many of the newest digests (portal/feedback/ops.py).
RECENT_DIGESTS_KEPT = 50

_digest = cast(sa.Table, FeedbackDigest.__table__)
_applied = cast(sa.Table, FeedbackApplied.__table__)
_session = cast(sa.Table, StaffSession.__table__)
_decision_week = cast(sa.Table, DecisionWeek.__table__)
_receipt = cast(sa.Table, DeliveryReceipt.__table__)
_delivery = cast(sa.Table, Delivery.__table__)
_run = cast(sa.Table, JobRun.__table__)
_picture = cast(sa.Table, Picture.__table__)
_campaign = cast(sa.Table, Campaign.__table__)
_draft = cast(sa.Table, Draft.__table__)


def old_digests(app: Flask, now: dt.datetime, settings: Settings) -> sa.ColumnElement[bool]:
    cutoff = now - dt.timedelta(days=settings.retention.feedback_digest_days)
    with db.begin(app) as session:
        newest_kept = session.execute(
            sa.select(_digest.c.received_at)
            .order_by(_digest.c.received_at.desc())
            .offset(RECENT_DIGESTS_KEPT - 1)
            .limit(1)
        ).scalar_one_or_none()
    if newest_kept is None:
        return sa.false()  # fewer digests than the page lists: keep them all
    return _digest.c.received_at < min(cutoff, newest_kept)


def old_markers(now: dt.datetime, settings: Settings) -> sa.ColumnElement[bool]:
    return _applied.c.applied_at < now - dt.timedelta(days=settings.retention.feedback_marker_days)


def chart_weeks_past(now: dt.datetime) -> sa.ColumnElement[bool]:
    """Kept weeks of decisions older than the compliance dashboard's chart shows."""
    return _decision_week.c.week < first_week(now)


def ended_sessions(now: dt.datetime, settings: Settings) -> sa.ColumnElement[bool]:
    before = now - dt.timedelta(days=settings.retention.staff_session_days)
    idle = dt.timedelta(minutes=settings.staff.session_idle_minutes)
    return (_session.c.expires_at < before) | (_session.c.last_seen_at < before - idle)


def orphaned_receipts(now: dt.datetime, settings: Settings) -> sa.ColumnElement[bool]:
    """Receipts older than the window whose delivery is gone (receipts are recorded only
    for our deliveries' ids, digits within BIGINT: the cast finds the delivery by its
    primary key)."""
    cutoff = months_before(now, settings.retention.receipt_months)
    delivery_left = sa.exists().where(
        _delivery.c.id == sa.cast(_receipt.c.delivery_id, sa.BigInteger)
    )
    return (_receipt.c.at < cutoff) & ~delivery_left


def old_job_runs(app: Flask, now: dt.datetime, settings: Settings) -> sa.ColumnElement[bool]:
    """Runs past the window, bar the ones a page shows (read once, before the walk: a
    few ids, so each batch's query stays a range on the primary key)."""
    cutoff = now - dt.timedelta(days=settings.retention.job_run_days)
    newest_first = (_run.c.started_at.desc(), _run.c.id.desc())  # as the pages read them
    with db.begin(app) as session:
        kept: set[int] = set()
        for name in session.execute(sa.select(_run.c.name).distinct()).scalars():
            for which in (sa.true(), _run.c.seconds.is_not(None)):
                kept.update(
                    session.execute(
                        sa.select(_run.c.id)
                        .where(_run.c.name == name, which)
                        .order_by(*newest_first)
                        .limit(1)
                    ).scalars()
                )
        kept.update(
            session.execute(
                sa.select(_run.c.id).order_by(_run.c.id.desc()).limit(RECENT_RUNS_LISTED)
            ).scalars()
        )
    return (_run.c.started_at < cutoff) & _run.c.id.not_in(sorted(kept))


def unused_pictures(now: dt.datetime, settings: Settings) -> sa.ColumnElement[bool]:
    """Pictures past the window that no campaign or draft names: the address's
    ``/media/<sha256>.`` found in a campaign's icon, image, badge or variants, or in a
    draft's fields (a handful of uploads, each looked for once)."""
    cutoff = now - dt.timedelta(days=settings.retention.picture_unused_days)
    named = sa.literal("%/media/") + _picture.c.sha256 + sa.literal(".%")
    in_campaign = sa.exists().where(
        sa.or_(
            _campaign.c.icon.like(named),
            _campaign.c.image.like(named),
            _campaign.c.badge.like(named),
            sa.cast(_campaign.c.variants, sa.Text).like(named),
        )
    )
    in_draft = sa.exists().where(sa.cast(_draft.c.fields, sa.Text).like(named))
    return (_picture.c.uploaded_at < cutoff) & ~in_campaign & ~in_draft


def _folding(campaign_id: uuid.UUID) -> Callable[[Session, Sequence[sa.Row[Any]]], int]:
    def fold(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        return tally.fold(session, campaign_id, [row.key for row in rows])

    return fold


def fold_deliveries(
    app: Flask, now: dt.datetime, settings: Settings, progress: Progress, report: JobReport
) -> None:
    """Each campaign finished before the window: its deliveries folded a keyset batch at
    a time (several processes share a campaign's batches), then its counters compacted.
    The id range bounds each batch's walk of the primary key to the campaign's rows.
    Between batches it pauses ``DELIVERY_FOLD_PAUSE_MS``, and stops (a problem in the
    report; the next run goes on) when a replica is further behind than
    ``BACKFILL_MAX_REPLICATION_LAG_SECONDS``: a million rows write about 760 MiB of WAL."""
    stop = app.extensions.get("portal.stop")
    cutoff = months_before(now, settings.retention.delivery_months)
    pause = replication_throttle(
        app,
        report,
        pause_seconds=settings.retention.fold_pause_seconds,
        max_lag_seconds=settings.backfill_max_replication_lag_seconds,
        lag=batches.replication_lag_seconds,  # looked up now: tests replace it
    )
    with db.begin(app) as session:
        spared = [
            (partitions.bound(m.start), partitions.bound(m.end))
            for m in partitions.spared(session, now, cutoff)
        ]
        campaigns = tally.campaigns_to_fold(session, cutoff, spared)
    for campaign_id in campaigns:
        with db.begin(app) as session:
            low, high = session.execute(
                sa.select(sa.func.min(_delivery.c.id), sa.func.max(_delivery.c.id)).where(
                    _delivery.c.campaign_id == campaign_id
                )
            ).one()
        if low is None:
            continue  # another process folded it meanwhile

        keyset_batches(
            app,
            _delivery,
            (_delivery.c.campaign_id == campaign_id) & _delivery.c.id.between(low, high),
            batch_size=settings.retention.batch_size,
            progress=progress,
            handle=_folding(campaign_id),
            stop=stop,
            report=report,
            between=pause,
        )
        if (stop is not None and stop.is_set()) or report.problems:
            return  # stopping, or a replica fell behind: the next run goes on
        with db.begin(app) as session:
            tally.compact(session, campaign_id)


def delivery_partitions(
    app: Flask, now: dt.datetime, settings: Settings, report: JobReport
) -> None:
    """On PostgreSQL: the coming months' partitions of ``delivery`` made, then each past
    month whose every campaign finished before the window folded into its campaigns'
    counters and dropped, a month per transaction (portal/delivery/partitions.py). A
    month whose lock could not be had in ``DELIVERY_PARTITION_LOCK_TIMEOUT_MS`` is a
    problem of the run; the next run tries again."""
    engine: sa.Engine = app.extensions["portal.db"].engine
    if not is_postgres(engine):
        return
    # Every process runs this job; one at a time does this step, the rest pass it by.
    with held_transaction_lock(engine, partitions.MAINTENANCE_LOCK, wait=False) as mine:
        if mine:
            _maintain_partitions(app, now, settings, report)


def _maintain_partitions(
    app: Flask, now: dt.datetime, settings: Settings, report: JobReport
) -> None:
    cutoff = months_before(now, settings.retention.delivery_months)
    wait = settings.retention.partition_lock_timeout_ms
    try:
        with db.begin(app) as session:
            made = partitions.create_ahead(session, now, lock_timeout_ms=wait)
        for month in made:
            log.info("made the delivery partition %s", month.name)
        with db.begin(app) as session:
            months = partitions.droppable(session, now, cutoff)
    except sa.exc.OperationalError as error:
        report.problems.append(f"delivery partitions: {type(error.orig).__name__}")
        return
    for month in months:
        try:
            with db.begin(app) as session:
                dropped = partitions.drop(session, month, lock_timeout_ms=wait)
        except sa.exc.OperationalError as error:
            report.problems.append(f"{month.name} not dropped: {type(error.orig).__name__}")
            return
        log.info("dropped the delivery partition %s (%d deliveries)", month.name, dropped)
        report.processed += dropped
        report.changed += dropped


# Finished campaigns looked for at a time by settle_campaigns.
SETTLE_BATCH = 50


def settle_campaigns(app: Flask) -> int:
    """Keep the counts of each finished campaign not kept yet whose last delivery has come
    back (``portal.campaigns.settled``: a cancelled or expired one, or one finished before
    counts were kept), one campaign per transaction: each is one count of its rows. How
    many it kept."""
    stop = app.extensions.get("portal.stop")
    passed: set[uuid.UUID] = set()
    kept = 0
    while not (stop is not None and stop.is_set()):
        with db.begin(app) as session:
            found = [c for c in settled.to_settle(session, SETTLE_BATCH) if c not in passed]
        if not found:
            break
        for campaign_id in found:
            with db.begin(app) as session:
                kept += len(settled.settle(session, [campaign_id]))
            # Settled here or meanwhile elsewhere: either way not looked for again.
            passed.add(campaign_id)
            if stop is not None and stop.is_set():
                break
    if kept:
        log.info("kept the counts of %d finished campaigns", kept)
    return kept


def table_retention_job(app: Flask, progress: Progress) -> JobReport:
    portal = current_portal(app)
    settings, now = portal.settings, portal.clock.now()
    report = JobReport("table-retention")
    settle_campaigns(app)
    delivery_partitions(app, now, settings, report)
    fold_deliveries(app, now, settings, progress, report)
    for table, candidates in (
        (_digest, old_digests(app, now, settings)),
        (_applied, old_markers(now, settings)),
        (_session, ended_sessions(now, settings)),
        (_receipt, orphaned_receipts(now, settings)),
        (_run, old_job_runs(app, now, settings)),
        (_picture, unused_pictures(now, settings)),
        (_decision_week, chart_weeks_past(now)),
    ):
        delete_batches(
            app,
            table,
            candidates,
            batch_size=settings.retention.batch_size,
            progress=progress,
            stop=app.extensions.get("portal.stop"),
            report=report,
        )
    return report
