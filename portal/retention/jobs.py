"""The lifecycle jobs, by name."""

from __future__ import annotations

from flask import Flask

from portal.jobs import JobReport, Progress, job
from portal.retention.services import purge, sweep, tombstone


def _args(app: Flask) -> dict:
    portal = app.extensions["portal"]
    return {
        "now": portal.clock.now(),
        "retention": portal.settings.retention,
        "stop": app.extensions.get("portal.stop"),
    }


@job("sweep")
def _sweep(app: Flask, progress: Progress) -> JobReport:
    return sweep(app, progress=progress, **_args(app))


@job("tombstone")
def _tombstone(app: Flask, progress: Progress) -> JobReport:
    return tombstone(app, progress=progress, **_args(app))


@job("purge")
def _purge(app: Flask, progress: Progress) -> JobReport:
    return purge(app, progress=progress, **_args(app))
