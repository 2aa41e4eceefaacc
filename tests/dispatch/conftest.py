"""Fixtures for the sending core: a fake push service and a VAPID signer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from portal.dispatch.vapid import VapidSigner
from tests.conftest import VAPID_PRIVATE, VAPID_PUBLIC
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
