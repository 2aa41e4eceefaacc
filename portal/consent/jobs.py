"""The consent log's sequencer as a scheduled job (``consent-log-sequencer``)."""

from __future__ import annotations

import logging

from flask import Flask
from sqlalchemy.orm import Session

from portal.consent import tree
from portal.db import db
from portal.jobreport import JobReport, Progress
from portal.seams import current_portal

logger = logging.getLogger(__name__)


def integrate_in(session: Session, app: Flask | None = None) -> tree.Integrated:
    """One integration in the caller's transaction (the caller commits): what the
    sequencer does, done now by a reader that needs the tree to hold every committed
    event (an export)."""
    portal = current_portal(app)
    settings = portal.settings
    return tree.integrate(
        session,
        tree.signing_key(settings.consent_log_signing_key),
        now=portal.clock.now(),
        gap_grace_seconds=settings.consent_log_gap_grace_seconds,
    )


def sequence_once(app: Flask) -> tree.Integrated:
    """One integration, in its own transaction (committed when it returns)."""
    with db.begin(app) as session:
        return integrate_in(session, app)


def sequencer_job(app: Flask, progress: Progress) -> JobReport:
    result = sequence_once(app)
    report = JobReport("consent-log-sequencer", processed=result.leaves, changed=result.leaves)
    for seq in result.gaps_closed:
        logger.info("consent log: sequence number %s closed with a gap event", seq)
    return report
