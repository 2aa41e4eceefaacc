"""Fixtures for the dispatch engine: an app that trusts the fake push service."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from portal import create_app
from portal.campaigns.engine import Dispatcher, EngineSettings
from portal.dispatch.transport import HttpsPushTransport
from portal.dispatch.vapid import VapidSigner
from tests.conftest import VAPID_PRIVATE, VAPID_PUBLIC
from tests.fakepush import FakePushService, fake_push_service


@pytest.fixture
def fake_push() -> Iterator[FakePushService]:
    with fake_push_service() as service:
        yield service


@pytest.fixture
def push_app(settings, clock, fake_push, catalogue_ready):
    """The portal with the fake push service allowed and its CA trusted."""
    host = urlsplit(fake_push.origin).netloc
    app = create_app(
        settings.with_overrides(
            push_allowed_hosts=(*settings.push_allowed_hosts, host),
            push_ca_bundle=str(fake_push.ca_bundle),
        ),
        clock=clock,
    )
    app.config["TESTING"] = True
    yield app
    app.extensions["portal.db"].engine.dispose()


@pytest.fixture
def dispatcher(push_app, fake_push) -> Iterator[Dispatcher]:
    # VAPID tokens are checked by the fake against real time, so the signer keeps the
    # system clock; the engine itself runs on the test's clock.
    signer = VapidSigner(VAPID_PRIVATE, "mailto:ops@example.test", public_key=VAPID_PUBLIC)
    transport = HttpsPushTransport(
        signer, ca_bundle=fake_push.ca_bundle, concurrency=8, timeout=2.0
    )
    engine = Dispatcher(
        push_app, transport, settings=EngineSettings(batch_size=50), rand=lambda: 0.0
    )
    push_app.extensions["portal.dispatcher"] = engine
    yield engine
    transport.close()
