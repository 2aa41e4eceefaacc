"""``verify-log``: walk the whole consent log's hash chain and record the result.

A full walk reads every event (about a million a minute on a busy two-core machine), so the
dashboard shows the last recorded run rather than walking on every page view; the scheduler
runs it daily, and soon after a compliance officer asks for one on the dashboard.
"""

from __future__ import annotations

import sqlalchemy as sa
from flask import Flask

from portal.consent.tree import verify_chain
from portal.jobreport import JobReport, Progress


def verify_log(app: Flask, progress: Progress) -> JobReport:
    engine = app.extensions["portal.db"].engine
    with engine.connect() as connection:
        progress.start(
            connection.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one()
        )
        result = verify_chain(connection, progress=progress)
    report = JobReport("verify-log", processed=result.events)
    if result.problem is not None:
        report.problems.append(f"consent log broken at {result.problem}")
    return report
