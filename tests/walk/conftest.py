"""The world the walk starts from, and the people who walk it.

Five personas: a stranger (no cookies), a subscriber (the cookies of two subscribed
devices) and one member of staff per role (signed in; the campaigns one has a device
too, for test sends). The world has the test catalogue, staff to act on (one disabled),
people to look up (one erased, for its receipt link), a scheduled and a paused campaign,
and a dispatcher whose push service accepts everything, so a job run by hand never
leaves the machine. The scheduler is off: nothing writes but the walk.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from portal import create_app
from portal.campaigns import media
from portal.campaigns import services as campaign_services
from portal.campaigns.services import CampaignDraft
from portal.clock import FrozenClock
from portal.config import Settings
from portal.consent import catalogue, merkle
from portal.consent import tree as consent_tree
from portal.db import db
from portal.identity import preference_link_token, sign_assertion
from portal.jobs import job_names
from portal.push.transport import PushResponse
from portal.retention.services import erase_subscriber
from portal.retention.views import receipt_token
from portal.seams import current_portal
from portal.staff import services as staff_services
from portal.staff.models import Role, StaffUser
from portal.staff.passwords import Passwords
from portal.subscriptions.models import PushSubscription
from tests.conftest import TOPICS, make_settings, publish_test_catalogue
from tests.factories import SubscriptionFactory
from tests.helpers import sequence
from tests.staff.conftest import FAST_HASHER, GENEROUS, PASSWORD, csrf_from
from tests.support import ROOT

NOW = dt.datetime(2026, 1, 1, 9, 0, tzinfo=dt.UTC)
SECRET = "walk-host-product-secret"
STAFF_ROLES = {"admin": Role.ADMIN, "compliance": Role.COMPLIANCE, "campaigns": Role.CAMPAIGNS}
# The order of the walk: the admin, who can retire every topic, goes last.
PERSONAS = ("stranger", "subscriber", "campaigns", "compliance", "admin")

_REPORT: list[str] = []


@pytest.fixture
def walk_report() -> list[str]:
    return _REPORT


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _REPORT:
        terminalreporter.section("Page walk")
        for line in _REPORT:
            terminalreporter.write_line(line)


class AcceptingTransport:
    """A push service that accepts every message at once (the walk tests input, not
    delivery)."""

    def send(self, request: Any) -> PushResponse:
        return PushResponse(201)

    def send_batch(self, requests: Iterable[Any]) -> list[PushResponse]:
        return [PushResponse(201) for _ in requests]

    def close(self) -> None:
        pass


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        str(tmp_path / "instance"),
        # The walk posts wrong passwords for the personas' own addresses; a lockout would
        # stop a persona signing in again mid-walk (lockout has tests of its own).
        staff=dataclasses.replace(GENEROUS, lockout_attempts=1_000_000),
        identity_assertion_secrets=(SECRET,),
    )


@pytest.fixture
def walk_app(settings: Settings, clock: FrozenClock) -> Iterator[Flask]:
    app = create_app(
        settings,
        clock=clock,
        passwords=Passwords(FAST_HASHER),
        transport_factory=lambda portal: AcceptingTransport(),
    )
    app.config["TESTING"] = True
    # A view that raises must answer as in production (a 500 page), not into the test.
    app.config["PROPAGATE_EXCEPTIONS"] = False
    yield app
    app.extensions["portal.db"].engine.dispose()


@dataclass
class Persona:
    name: str
    client: FlaskClient
    subscriptions: SubscriptionFactory
    role: Role | None = None
    token: str = ""
    devices: list[uuid.UUID] = field(default_factory=list)

    @property
    def email(self) -> str:
        return f"{self.name}@example.test"

    @property
    def signed_in(self) -> bool:
        return self.client.get_cookie("portal_staff", path="/staff") is not None

    def refresh_token(self) -> None:
        page = self.client.get("/staff/password" if self.signed_in else "/staff/login")
        self.token = csrf_from(page.text)

    def sign_in(self) -> None:
        answer = self.client.post(
            "/staff/login",
            data={"csrf_token": self.token, "email": self.email, "password": PASSWORD},
        )
        assert answer.status_code == 303, f"{self.name} cannot sign in again"
        self.refresh_token()

    def subscribe(self) -> uuid.UUID:
        sub = self.subscriptions()
        answer = self.client.post(
            "/api/push/subscribe",
            json={"subscription": sub.to_json(), "topics": ["offers"], "policyVersion": "v1"},
        )
        assert answer.status_code == 201, answer.json
        self.devices.append(uuid.UUID(answer.json["id"]))
        return self.devices[-1]

    def before_request(self) -> None:
        if self.name == "stranger":  # whatever a link gave it, a stranger has no cookie
            for name in ("portal_subscriber", "portal_device"):
                self.client.delete_cookie(name, path="/")
            self.client.delete_cookie("portal_staff", path="/staff")

    def restore(self) -> bool:
        """Put back what a request took away (a sign-out, an erasure); True if it wrote."""
        if self.role is not None and not self.signed_in:
            self.refresh_token()
            self.sign_in()
            return True
        if self.name == "subscriber" and self.client.get_cookie("portal_subscriber") is None:
            self.subscribe()
            self.refresh_token()
            return True
        return False


@dataclass
class World:
    app: Flask
    personas: dict[str, Persona]
    # Values a route parameter names something with, by the parameter's name.
    parameters: dict[str, list[str]]
    # Values worth trying in a form field or a query string (good ones, for other fields).
    good_values: list[str]
    # Good values by field name, for the inputs a page leaves empty ("{n}": a fresh
    # number, so a slug or an address can be new every time).
    good_by_field: dict[str, list[str]]
    link_tokens: list[str]
    assertions: list[str]

    @property
    def engine(self) -> sa.Engine:
        return self.app.extensions["portal.db"].engine


def _staff(app: Flask, email: str, role: Role, *, disabled: bool = False) -> uuid.UUID:
    with app.app_context(), db.begin() as session:
        user: StaffUser = staff_services.create_staff(
            session,
            email=email,
            password=PASSWORD,
            roles=(role,),
            actor=None,
            passwords=current_portal(app).passwords,
            now=current_portal(app).clock.now(),
            via="test",
            must_replace_password=False,
        )
        if disabled:
            user.disabled_at = NOW
        return user.id


def _campaign(app: Flask, *, paused: bool) -> uuid.UUID:
    with app.app_context(), db.begin() as session:
        campaign = campaign_services.create_campaign(
            session,
            CampaignDraft(
                topic="weekly-digest",
                title="Monday digest",
                body="Five things this week",
                url="/news",
                send_at=NOW + dt.timedelta(days=1),
            ),
            created_by="campaigns@example.test",
            now=NOW,
        )
        if paused:
            campaign_services.control(session, campaign.id, "pause", now=NOW)
        return campaign.id


def _draft(app: Flask) -> uuid.UUID:
    """A saved draft, for its edit page."""
    from portal.campaigns import drafts

    with app.app_context(), db.begin() as session:
        fields = {"topic": "weekly-digest", "title": "Draft digest", "body": "Not yet"}
        return drafts.create(session, fields, by="campaigns@example.test", now=NOW).id


def _test_device(app: Flask, staff_id: uuid.UUID, name: str) -> tuple[int, uuid.UUID]:
    """A test device of this member of staff, and a test send that reached it."""
    from portal.campaigns import testdevices
    from portal.subscriptions.validation import HostAllowList, validate_subscription
    from tests.campaigns.conftest import form_data

    settings = current_portal(app).settings
    subscription = validate_subscription(
        SubscriptionFactory()().to_json(),
        allowed=HostAllowList(settings.push_allowed_hosts),
        max_length=settings.endpoint_max_length,
    )
    with app.app_context(), db.begin() as session:
        device = testdevices.register(
            session,
            staff_id,
            name,
            subscription,
            user_agent=None,
            keys=current_portal(app).keys,
            now=NOW,
        ).device
        sent = testdevices.TestSend(
            staff_user_id=staff_id,
            sent_at=NOW,
            fields={**form_data(), "campaign_id": "", "draft_id": "", "draft_version": ""},
            outcomes=[{"device": device.id, "name": name, "result": "sent", "detail": "Accepted"}],
        )
        session.add(sent)
        session.flush()
        return device.id, sent.id


def _assertions() -> list[str]:
    """Signed with the configured secret, so they reach the claims: good and hostile."""
    later = time.time() + 3600  # assertions are checked against the real clock
    claims: list[dict[str, Any]] = [
        {"sub": "customer-1", "exp": later, "region": "DE", "locale": "de-DE"},
        {"sub": "customer-2", "exp": later, "locale": "x\x00y", "region": "de"},
        {"sub": "customer\x00-3", "exp": later},
        {"sub": "é" * 300, "exp": later},
        {"sub": "customer-4", "exp": float("inf")},
        {"sub": "customer-5", "exp": later, "iat": 1e300},
        {"sub": ["customer-6"], "exp": later},
        {"sub": "customer-7", "exp": "tomorrow"},
    ]
    return [sign_assertion(c, SECRET) for c in claims]


def _owner(app: Flask, subscription_id: uuid.UUID) -> uuid.UUID:
    with app.app_context():
        row = db.session.get(PushSubscription, subscription_id)
        assert row is not None and row.subscriber_id is not None
        return row.subscriber_id


def build_world(app: Flask) -> World:
    publish_test_catalogue(app, NOW)
    factory = SubscriptionFactory()
    personas = {name: Persona(name, app.test_client(), factory) for name in PERSONAS}
    staff_ids = {}
    for name, role in STAFF_ROLES.items():
        personas[name].role = role
        staff_ids[name] = _staff(app, personas[name].email, role)
    victim = _staff(app, "victim@example.test", Role.CAMPAIGNS)
    # Test devices: the campaigns persona's own, and another person's.
    own_device, own_send = _test_device(app, staff_ids["campaigns"], "Walked laptop")
    victims_device, victims_send = _test_device(app, victim, "Victim's phone")
    disabled = _staff(app, "disabled@example.test", Role.COMPLIANCE, disabled=True)
    subscriber = personas["subscriber"]
    subscriber.subscribe()
    subscriber.subscribe()  # two devices: the page offers to stop the other one
    personas["campaigns"].subscribe()  # a device of their own for test sends
    # A newer notice than the one the subscriber chose under: the preference centre then
    # offers to keep their choices under it (POST /preferences/confirm-notice).
    with db.begin(app) as session:
        catalogue.publish_policy(
            session, version="v1.1", text="We send what you choose, and a summary.", now=NOW
        )
    # Someone to look up, and someone erased (for a receipt link).
    someone = Persona("someone", app.test_client(), factory)
    gone = Persona("gone", app.test_client(), factory)
    person_id, gone_id = _owner(app, someone.subscribe()), _owner(app, gone.subscribe())
    with app.app_context():
        with db.begin() as session:
            receipt = erase_subscriber(session, gone_id, now=NOW)
        token = receipt_token(receipt)
        link = preference_link_token(_owner(app, subscriber.devices[0]), app)
    # The consent log's tree and a signed head over every event so far (what the
    # sequencer does every second): heads, proofs and a leaf to ask about.
    integrated = sequence(app)
    tree_size = integrated.after
    with app.app_context():
        first_leaf = consent_tree.DatabaseNodes(db.session).node_hashes([merkle.NodeId(0, 0)])[0]

    # A picture staff uploaded, served at /media/<sha256>.<extension>.
    with db.begin(app) as session:
        picture = media.store(
            session,
            (ROOT / "tests" / "campaigns" / "pictures" / "icon-64x64.png").read_bytes(),
            uploaded_by=staff_ids["campaigns"],
            now=NOW,
        )
        picture_digest = picture.sha256

    for persona in personas.values():
        persona.refresh_token()
        if persona.role is not None:
            persona.sign_in()

    static = ROOT / "static"
    topics = [slug for slug, *_ in TOPICS]
    parameters = {
        "staff_id": [str(victim), str(disabled)],
        "subscriber_id": [str(person_id), str(gone_id)],
        "campaign_id": [str(_campaign(app, paused=False)), str(_campaign(app, paused=True))],
        "draft_id": [str(_draft(app))],
        "device_id": [str(own_device), str(victims_device)],
        "send_id": [str(own_send), str(victims_send)],
        "subscription_id": [str(d) for d in subscriber.devices],
        "slug": topics,
        "version": ["v1", "v1.1"],
        "name": job_names(),
        "token": [token],
        "filename": sorted(p.relative_to(static).as_posix() for p in static.rglob("*.*")),
        # An archived head that exists and sizes that have none.
        "size": [str(tree_size), "1", "18446744073709551615"],
        # The picture, a digest of nothing kept, and the extensions of each format.
        "sha256": [picture_digest, "0" * 64],
        "extension": ["png", "jpg", "webp"],
    }
    good = [
        "victim@example.test",
        "new.person@example.test",
        "a brand new passphrase",
        "2026-01-01",
        "2026-01-31",
        "2026-06-01T09:30",
        "v2",
        "Product news",
        "product-news",
        "News",
        "/news",
        "https://example.com/offer",
        "86400",
        "customer-1",
        str(person_id),
        *topics,
        str(tree_size),  # a tree size, and a leaf hash in it (hex and base64)
        "1",
        first_leaf.hex(),
        base64.b64encode(first_leaf).decode(),
    ]
    by_field = {
        "email": ["victim@example.test", "new.person{n}@example.test"],
        "password": ["a brand new passphrase"],
        "new_password": ["a brand new passphrase"],
        "confirm_password": ["a brand new passphrase"],
        "current_password": ["not the password"],
        "value": ["customer-1", str(person_id)],
        "reference": ["T-1"],
        "slug": ["product-news-{n}"],
        "category": ["News"],
        "label": ["Product news"],
        "description": ["New features.\r\nOnce a month."],
        "version": ["v{n}"],
        "text": ["We send less.\r\n\tThat is all."],
        "date_from": ["2026-01-01"],
        "date_to": ["2026-01-31"],
        "actor": ["admin@example.test"],
        "title": ["Monday digest"],
        "body": ["Five things\r\nthis week"],
        "url": ["/news", "https://example.com/offer"],
        "ttl": ["86400"],
        "collapse_key": ["weekly"],
        "send_at": ["2026-06-01T09:30"],
        "deliver_until": ["2026-06-02T09:30"],
        "subscriber": [str(person_id)],
        "confirm": ["y", "yes"],
    }
    return World(app, personas, parameters, good, by_field, [link], _assertions())


@pytest.fixture
def world(walk_app: Flask) -> World:
    return build_world(walk_app)
