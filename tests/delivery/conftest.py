"""Dispatch fixtures: the fake push service, a transport trusting it, an app sending
through that transport, and the app's own dispatcher. The campaign tests use them too."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import urlsplit

import pytest

from portal import create_app
from portal.delivery.engine import Dispatcher
from portal.delivery.jobs import dispatcher_for
from portal.push.transport import HttpsPushTransport
from portal.push.vapid import VapidSigner
from tests.conftest import VAPID_PRIVATE, VAPID_PUBLIC
from tests.fakepush import FakePushService, fake_push_service

__all__ = ["dispatcher", "fake_push", "push_app", "push_transport"]


@pytest.fixture
def fake_push() -> Iterator[FakePushService]:
    with fake_push_service() as service:
        yield service


@pytest.fixture
def push_transport(fake_push) -> Iterator[HttpsPushTransport]:
    # VAPID tokens are checked by the fake against real time, so the signer keeps the
    # system clock; the engine itself runs on the test's clock.
    signer = VapidSigner(VAPID_PRIVATE, "mailto:ops@example.test", public_key=VAPID_PUBLIC)
    transport = HttpsPushTransport(
        signer, ca_bundle=fake_push.ca_bundle, concurrency=8, timeout=2.0
    )
    yield transport
    transport.close()


@pytest.fixture
def push_app(settings, clock, fake_push, push_transport, catalogue_ready):
    """The portal with the fake push service allowed and its CA trusted, sending through
    ``push_transport``."""
    host = urlsplit(fake_push.origin).netloc
    app = create_app(
        settings.with_overrides(
            push_allowed_hosts=(*settings.push_allowed_hosts, host),
            push_ca_bundle=str(fake_push.ca_bundle),
        ),
        clock=clock,
        transport_factory=lambda portal: push_transport,
    )
    app.config["TESTING"] = True
    yield app
    app.extensions["portal.db"].engine.dispose()


@pytest.fixture
def dispatcher(push_app) -> Dispatcher:
    """The app's own dispatcher (the one its dispatch job runs), in smaller batches and
    without jitter."""
    engine = dispatcher_for(push_app)
    engine.settings = replace(engine.settings, batch_size=50)
    engine.rand = lambda: 0.0
    return engine
