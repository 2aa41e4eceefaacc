"""Campaign fixtures: an app that trusts the fake push service, its dispatcher, and staff
with the campaigns role signed in to either app."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from flask import Flask

from portal import create_app
from portal.campaigns.engine import Dispatcher
from portal.campaigns.jobs import dispatcher_for
from portal.config import Settings
from portal.db import db
from portal.push.transport import HttpsPushTransport
from portal.push.vapid import VapidSigner
from portal.seams import current_portal
from portal.staff import services as staff_services
from portal.staff.models import Role
from portal.staff.passwords import Passwords
from tests.conftest import VAPID_PRIVATE, VAPID_PUBLIC, make_settings
from tests.fakepush import FakePushService, fake_push_service
from tests.staff.conftest import FAST_HASHER, GENEROUS, PASSWORD, Browser

CAMPAIGNER = "campaigner@example.test"


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    # Several sign-ins per test from one test-client address.
    return make_settings(database_url, str(tmp_path / "instance"), staff=GENEROUS)


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


@pytest.fixture
def sign_in() -> Callable[..., Browser]:
    """A member of staff (the campaigns role unless told) signed in to ``application``,
    in a browser of their own (a test client keeping its cookies)."""

    def make(application: Flask, email: str = CAMPAIGNER, *roles: Role) -> Browser:
        passwords = Passwords(FAST_HASHER)
        current_portal(application).passwords = passwords
        with application.app_context(), db.begin() as session:
            staff_services.create_staff(
                session,
                email=email,
                password=PASSWORD,
                roles=roles or (Role.CAMPAIGNS,),
                actor=None,
                passwords=passwords,
                now=current_portal(application).clock.now(),
                via="test",
            )
        person = Browser(application.test_client())
        assert person.sign_in(email).status_code == 303
        return person

    return make


@pytest.fixture
def campaigner(catalogue_ready: Flask, sign_in: Callable[..., Browser]) -> Browser:
    """Signed in with the campaigns role, on an app with four topics and a policy."""
    return sign_in(catalogue_ready)


def form_data(**overrides: Any) -> dict[str, Any]:
    """The campaign form as a person fills it in: send now, in UTC."""
    data = {
        "topic": "weekly-digest",
        "title": "Monday digest",
        "body": "Five things this week",
        "url": "/news",
        "icon": "",
        "urgency": "normal",
        "ttl": "86400",
        "collapse_key": "",
        "schedule": "now",
        "send_at": "",
        "timezone": "UTC",
        "deliver_until": "",
        "campaign_id": "",
    }
    data.update(overrides)
    return data


def set_region(application: Flask, endpoint: str, region: str) -> None:
    with db.begin(application) as session:
        session.execute(
            sa.text(
                "UPDATE subscriber SET region_code = :r WHERE id = "
                "(SELECT subscriber_id FROM push_subscription WHERE endpoint = :e)"
            ),
            {"r": region, "e": endpoint},
        )
