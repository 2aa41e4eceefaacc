"""Campaign fixtures: the dispatch fixtures (tests/delivery/conftest.py) and staff with
the campaigns role signed in to either app."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from portal import create_app
from portal.config import Settings
from portal.db import db
from portal.delivery.engine import Dispatcher
from portal.delivery.jobs import dispatcher_for
from portal.seams import current_portal
from portal.staff import services as staff_services
from portal.staff.models import Role
from portal.staff.passwords import Passwords
from tests.conftest import make_settings
from tests.delivery.conftest import dispatcher, fake_push, push_app, push_transport
from tests.staff.conftest import FAST_HASHER, GENEROUS, PASSWORD, Browser

# The dispatch fixtures, shared with tests/delivery.
__all__ = ["dispatcher", "fake_push", "push_app", "push_transport"]

CAMPAIGNER = "campaigner@example.test"


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    # Several sign-ins per test from one test-client address.
    return make_settings(database_url, str(tmp_path / "instance"), staff=GENEROUS)


@pytest.fixture
def sending_app(
    push_app: Flask, clock: Any, push_transport: Any
) -> Iterator[Callable[..., tuple[Flask, Dispatcher]]]:
    """``sending_app(**settings)``: an app like ``push_app`` with those settings changed
    (``frequency_caps=…``, ``quiet_hours=…``), and its dispatcher, in batches of 50 and
    without jitter."""
    made: list[Flask] = []

    def make(**overrides: Any) -> tuple[Flask, Dispatcher]:
        portal = push_app.extensions["portal"]
        app = create_app(
            portal.settings.with_overrides(**overrides),
            clock=clock,
            transport_factory=lambda portal: push_transport,
        )
        app.config["TESTING"] = True
        engine = dispatcher_for(app)
        engine.settings = replace(engine.settings, batch_size=50)
        engine.rand = lambda: 0.0
        made.append(app)
        return app, engine

    yield make
    for app in made:
        app.extensions["portal.db"].engine.dispose()


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
                must_replace_password=False,
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
