"""The ``dispatch`` job, and the one dispatcher each process keeps."""

from __future__ import annotations

import threading

from flask import Flask

from portal.campaigns.engine import Dispatcher, EngineSettings
from portal.jobs import JobReport, Progress, job

_lock = threading.Lock()


def dispatcher_for(app: Flask) -> Dispatcher:
    """This process's dispatcher, created on first use: it owns the connections to the
    push services and the cached VAPID tokens. Tests put their own in the extension."""
    with _lock:
        existing = app.extensions.get("portal.dispatcher")
        if existing is not None:
            return existing
        from portal.campaigns import metrics
        from portal.push.transport import HttpsPushTransport
        from portal.push.vapid import VapidSigner

        portal = app.extensions["portal"]
        # The two counters looked up once: a label lookup per message costs more than the
        # increment.
        hits, misses = metrics.vapid_cache.labels("hit"), metrics.vapid_cache.labels("miss")
        signer = VapidSigner.from_settings(
            portal.settings,
            clock=portal.clock,
            on_lookup=lambda hit: (hits if hit else misses).inc(),
        )
        dispatcher = Dispatcher(
            app,
            HttpsPushTransport.from_settings(portal.settings, signer=signer),
            settings=EngineSettings(lease_seconds=portal.settings.dispatch_lease_seconds),
        )
        app.extensions["portal.dispatcher"] = dispatcher
        return dispatcher


@job("dispatch")
def _dispatch(app: Flask, progress: Progress) -> JobReport:
    tick = dispatcher_for(app).tick(stop=app.extensions.get("portal.stop"))
    progress.start(tick.claimed)
    progress.advance(tick.claimed)
    return JobReport(
        "dispatch",
        processed=tick.claimed,
        changed=tick.accepted + tick.failed + tick.revoked + tick.skipped,
    )
