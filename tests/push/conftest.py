"""Fixtures for the sending core: a fake push service, a VAPID signer, a transport."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from portal.config import b64url_decode
from portal.push.transport import HttpsPushTransport, PushRequest, Urgency
from portal.push.vapid import VapidSigner
from tests.conftest import VAPID_PRIVATE, VAPID_PUBLIC
from tests.factories import BrowserSubscription
from tests.fakepush import FakePushService, fake_push_service

SUBJECT = "mailto:ops@example.test"


@pytest.fixture
def fake_push() -> Iterator[FakePushService]:
    """A push service on https://127.0.0.1:<port> that decrypts what it takes."""
    with fake_push_service() as service:
        yield service


@pytest.fixture
def vapid_signer() -> VapidSigner:
    # The system clock: the fake service checks exp against real time.
    return VapidSigner(VAPID_PRIVATE, SUBJECT, public_key=VAPID_PUBLIC)


@pytest.fixture
def transport(
    fake_push: FakePushService, vapid_signer: VapidSigner
) -> Iterator[HttpsPushTransport]:
    with HttpsPushTransport(
        vapid_signer, ca_bundle=fake_push.ca_bundle, concurrency=8, timeout=2.0
    ) as sender:
        yield sender


def push_request(
    subscription: BrowserSubscription,
    plaintext: bytes = b'{"title":"hello"}',
    *,
    ttl: int = 60,
    urgency: Urgency | None = None,
    topic: str | None = None,
) -> PushRequest:
    """An encrypted request to ``subscription``, as the dispatch engine will build it."""
    return PushRequest.encrypted(
        subscription.endpoint,
        plaintext,
        p256dh=b64url_decode(subscription.p256dh),
        auth=subscription.auth,
        ttl=ttl,
        urgency=urgency,
        topic=topic,
    )
