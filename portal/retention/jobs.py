"""The lifecycle jobs (the table in portal.jobs names and schedules them)."""

from __future__ import annotations

from flask import Flask

from portal.jobreport import JobReport, Progress
from portal.retention.services import purge, sweep, tombstone
from portal.seams import current_portal


def _args(app: Flask) -> dict:
    portal = current_portal(app)
    return {
        "now": portal.clock.now(),
        "retention": portal.settings.retention,
        "stop": app.extensions.get("portal.stop"),
    }


def sweep_job(app: Flask, progress: Progress) -> JobReport:
    return sweep(app, progress=progress, **_args(app))


def tombstone_job(app: Flask, progress: Progress) -> JobReport:
    return tombstone(app, progress=progress, **_args(app))


def purge_job(app: Flask, progress: Progress) -> JobReport:
    return purge(app, progress=progress, **_args(app))
