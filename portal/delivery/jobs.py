"""The ``dispatch`` job, and the one dispatcher each process keeps."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from flask import Flask

from portal.delivery.engine import Dispatcher, EngineSettings
from portal.jobreport import JobReport, Progress
from portal.seams import Portal, current_portal

if TYPE_CHECKING:
    from portal.push.transport import PushTransport

_lock = threading.Lock()
_dispatchers: WeakKeyDictionary[Flask, Dispatcher] = WeakKeyDictionary()


def https_transport(portal: Portal) -> PushTransport:
    """The transport production sends with: pooled HTTPS connections to the allowed push
    services and a VAPID signer caching its tokens (``create_app``'s default factory)."""
    from portal.campaigns import metrics
    from portal.push.transport import HttpsPushTransport
    from portal.push.vapid import VapidSigner

    # The two counters looked up once: a label lookup per message costs more than the
    # increment.
    hits, misses = metrics.vapid_cache.labels("hit"), metrics.vapid_cache.labels("miss")
    signer = VapidSigner.from_settings(
        portal.settings,
        clock=portal.clock,
        on_lookup=lambda hit: (hits if hit else misses).inc(),
    )
    return HttpsPushTransport.from_settings(portal.settings, signer=signer)


def dispatcher_for(app: Flask) -> Dispatcher:
    """This process's dispatcher, created on first use: it owns the connections to the
    push services (from the app's transport factory) and the cached VAPID tokens."""
    with _lock:
        existing = _dispatchers.get(app)
        if existing is not None:
            return existing
        portal = current_portal(app)
        dispatcher = Dispatcher(
            app,
            portal.transport_factory(portal),
            settings=EngineSettings(lease_seconds=portal.settings.dispatch_lease_seconds),
        )
        _dispatchers[app] = dispatcher
        return dispatcher


def close_dispatcher(app: Flask) -> None:
    """Close the connections of this process's dispatcher, when it made one."""
    with _lock:
        dispatcher = _dispatchers.pop(app, None)
    if dispatcher is not None:
        dispatcher.transport.close()


def dispatch_job(app: Flask, progress: Progress) -> JobReport:
    tick = dispatcher_for(app).tick(
        stop=app.extensions.get("portal.stop"),
        # Set by the scheduler that runs this job: a web worker's share, or all of it.
        cpu_share=app.extensions.get("portal.dispatch_cpu_share", 1.0),
    )
    progress.start(tick.claimed)
    progress.advance(tick.claimed)
    return JobReport(
        "dispatch",
        processed=tick.claimed,
        changed=tick.accepted + tick.failed + tick.revoked + tick.skipped,
    )
