"""Every POST of a page answers a successful submission with a redirect (303), so that
reloading the answer never submits it again — or is on the allow-list below, with the
reason it is safe to repeat.

Each POST rule of the URL map outside the JSON API (/api/, out of scope: no browser
reloads it) must be in ``SUBMISSIONS`` (a valid submission, which must answer 303) or in
``IDEMPOTENT`` (why answering with a page is safe): a new POST route fails
``test_every_post_route_is_covered`` until it is in one of them. Steps before the final
submission (a review, a preview) may answer with a page, and must then change no row.
The world is the page walk's (tests/walk/conftest.py): a persona per role, with devices,
campaigns and staff to act on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask
from werkzeug.test import TestResponse

from tests.api.guard import TableDigest
from tests.campaigns.conftest import form_data
from tests.factories import SubscriptionFactory
from tests.staff.conftest import PASSWORD
from tests.staff.conftest import csrf_from as csrf_token
from tests.walk import walk
from tests.walk.conftest import World, build_world

Target = tuple[str, str]

# POST routes that may answer a valid submission with a page, and why repeating it is safe.
IDEMPOTENT: dict[Target, str] = {
    # Being made a GET search with pagination; a POST that finds someone already answers
    # 303 to their page, one that finds nobody re-shows the form (404, nothing changed).
    ("/staff/compliance/lookup", "POST"): "a search: being made a GET (see its view)",
    # A download: the answer is the file, the browser stays on the form's page, and a
    # second download of the same period is the same bundle (audited as a second export).
    ("/staff/compliance/export", "POST"): "a download of a file: a read",
}


@dataclass
class Flow:
    """Posts a form's steps as its personas: ``step`` for one that may answer with a page
    but must change nothing, ``post`` for the one that does the work."""

    world: World
    digest: TableDigest

    def post(self, persona: str, path: str, data: dict[str, Any]) -> TestResponse:
        who = self.world.personas[persona]
        return who.client.post(path, data={"csrf_token": who.token, **data})

    def step(self, persona: str, path: str, data: dict[str, Any]) -> TestResponse:
        before = self.digest.take()
        answer = self.post(persona, path, data)
        assert answer.status_code == 200, f"a step of {path} answered {answer.status_code}"
        assert self.digest.take() == before, f"a step of {path} changed rows: it must redirect"
        return answer

    def client(self, email: str) -> Any:
        """A browser of its own, signed in as ``email`` (a walk persona's address)."""
        client = self.world.app.test_client()
        page = client.get("/staff/login")
        signed_in = client.post(
            "/staff/login",
            data={"csrf_token": csrf_token(page.text), "email": email, "password": PASSWORD},
        )
        assert signed_in.status_code == 303
        return client


def _staff_id(flow: Flow, *, disabled: bool = False) -> str:
    """The walk's other members of staff: a colleague, and one who is disabled."""
    return flow.world.parameters["staff_id"][1 if disabled else 0]


def _campaign(flow: Flow, paused: bool) -> str:
    return flow.world.parameters["campaign_id"][1 if paused else 0]


def _own_form(client: Any, page_path: str) -> str:
    return csrf_token(client.get(page_path).text)


def _login(flow: Flow) -> TestResponse:
    client = flow.world.app.test_client()
    return client.post(
        "/staff/login",
        data={
            "csrf_token": _own_form(client, "/staff/login"),
            "email": "compliance@example.test",
            "password": PASSWORD,
        },
    )


def _logout(flow: Flow) -> TestResponse:
    client = flow.client("compliance@example.test")
    return client.post("/staff/logout", data={"csrf_token": _own_form(client, "/staff/")})


def _password(flow: Flow) -> TestResponse:
    client = flow.client("compliance@example.test")
    return client.post(
        "/staff/password",
        data={
            "csrf_token": _own_form(client, "/staff/password"),
            "current_password": PASSWORD,
            "new_password": "a brand new passphrase",
            "confirm_password": "a brand new passphrase",
        },
    )


def _campaign_new(flow: Flow) -> TestResponse:
    path = "/staff/campaigns/new"
    saved = flow.post("campaigns", path, {**form_data(), "action": "save_draft"})
    assert saved.status_code == 303, "saving a draft answers with a redirect"
    flow.step("campaigns", path, {**form_data(), "action": "preview"})
    review = flow.step("campaigns", path, {**form_data(), "action": "review"})
    campaign_id = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review.text)
    assert campaign_id
    return flow.post(
        "campaigns", path, {**form_data(campaign_id=campaign_id.group(1)), "action": "launch"}
    )


def _test_send(flow: Flow) -> TestResponse:
    review = flow.step("campaigns", "/staff/campaigns/new", {**form_data(), "action": "review"})
    chosen = re.search(r'name="subscription" value="([0-9a-f-]{36})" checked', review.text)
    assert chosen, "the campaigns persona's own device is offered"
    return flow.post(
        "campaigns", "/staff/campaigns/test-send", {**form_data(), "subscription": chosen[1]}
    )


def _own_test_device(flow: Flow) -> str:
    """The campaigns persona's own test device (tests/walk/conftest.py)."""
    return flow.world.parameters["device_id"][0]


def _register_test_device(flow: Flow) -> TestResponse:
    subscription = json.dumps(SubscriptionFactory()().to_json())
    return flow.post(
        "campaigns",
        "/staff/campaigns/test-devices",
        {"name": "Walked phone", "subscription": subscription},
    )


def _device_test(flow: Flow) -> TestResponse:
    review = flow.step("campaigns", "/staff/campaigns/new", {**form_data(), "action": "review"})
    assert f'name="device" value="{_own_test_device(flow)}"' in review.text
    return flow.post(
        "campaigns",
        "/staff/campaigns/device-test",
        {**form_data(), "device": _own_test_device(flow)},
    )


def _policy_new(flow: Flow) -> TestResponse:
    path = "/staff/admin/policies/new"
    text = "We send what you choose.\r\nNow monthly."
    preview = flow.step("admin", path, {"version": "v2", "text": text, "action": "preview"})
    digest = re.search(r'name="previewed" value="([0-9a-f]{64})"', preview.text)
    assert digest
    return flow.post(
        "admin", path, {"version": "v2", "text": text, "previewed": digest[1], "action": "publish"}
    )


def _topic_new(flow: Flow) -> TestResponse:
    """The form's review (a page that writes nothing), then the create."""
    path = "/staff/admin/topics/new"
    fields = {
        "slug": "product-news",
        "category": "News",
        "new_category": "",
        "label": "Product news",
        "description": "",
        "topic_class": "marketing",
        "default_state": "opt_out",
    }
    flow.step("admin", path, fields)
    return flow.post("admin", path, {**fields, "action": "create"})


def _account_link(flow: Flow) -> TestResponse:
    client = flow.world.app.test_client()
    opened = client.get(f"/preferences?assertion={flow.world.assertions[0]}")
    assert opened.headers["Location"].endswith("/preferences/link")
    return client.post(
        "/preferences/link",
        data={"csrf_token": _own_form(client, "/preferences/link"), "action": "link"},
    )


def _stop_other_device(flow: Flow) -> TestResponse:
    other = flow.world.personas["subscriber"].devices[0]
    return flow.post("subscriber", f"/preferences/devices/{other}/stop", {})


def _erase_person(flow: Flow) -> TestResponse:
    person = flow.world.parameters["subscriber_id"][0]
    return flow.post(
        "compliance", f"/staff/compliance/subscribers/{person}/erase", {"confirm": "y"}
    )


def _enable(flow: Flow) -> TestResponse:
    disabled = _staff_id(flow, disabled=True)
    return flow.post("admin", f"/staff/admin/staff/{disabled}/enable", {})


def _simple(persona: str, path: str, data: dict[str, Any] | None = None) -> Callable[..., Any]:
    def submit(flow: Flow) -> TestResponse:
        filled = path.replace("<victim>", _staff_id(flow)) if "<victim>" in path else path
        for name, paused in (("<scheduled>", False), ("<paused>", True)):
            filled = filled.replace(name, _campaign(flow, paused))
        return flow.post(persona, filled, data or {})

    return submit


PREFERENCES = {"policy_version": "v1.1", "ack_required": "1", "policy_ack": "1"}
SUBMISSIONS: dict[Target, Callable[[Flow], TestResponse]] = {
    ("/preferences", "POST"): _simple(
        "subscriber",
        "/preferences",
        {**PREFERENCES, "visible": ["offers", "weekly-digest"], "topics": "weekly-digest"},
    ),
    ("/preferences/confirm-notice", "POST"): _simple(
        "subscriber", "/preferences/confirm-notice", {"policy_version": "v1.1"}
    ),
    ("/preferences/marketing-off", "POST"): _simple("subscriber", "/preferences/marketing-off"),
    ("/preferences/frequency", "POST"): _simple(
        "subscriber", "/preferences/frequency", {"how_often": "one-a-day"}
    ),
    ("/preferences/quiet-hours", "POST"): _simple(
        "subscriber",
        "/preferences/quiet-hours",
        {"action": "save", "quiet_from": "22:00", "quiet_until": "07:00"},
    ),
    ("/preferences/stop-device", "POST"): _simple("subscriber", "/preferences/stop-device"),
    ("/preferences/devices/<uuid:subscription_id>/stop", "POST"): _stop_other_device,
    ("/preferences/link", "POST"): _account_link,
    ("/preferences/erase", "POST"): _simple("subscriber", "/preferences/erase", {"confirm": "yes"}),
    ("/staff/login", "POST"): _login,
    ("/staff/logout", "POST"): _logout,
    ("/staff/password", "POST"): _password,
    ("/staff/admin/staff", "POST"): _simple(
        "admin",
        "/staff/admin/staff",
        {"email": "new.person@example.test", "password": PASSWORD, "roles": "campaigns"},
    ),
    ("/staff/admin/staff/<uuid:staff_id>/roles", "POST"): _simple(
        "admin", "/staff/admin/staff/<victim>/roles", {"roles": ["campaigns", "compliance"]}
    ),
    ("/staff/admin/staff/<uuid:staff_id>/disable", "POST"): _simple(
        "admin", "/staff/admin/staff/<victim>/disable"
    ),
    ("/staff/admin/staff/<uuid:staff_id>/enable", "POST"): _enable,
    ("/staff/ops/feedback/test", "POST"): _simple("admin", "/staff/ops/feedback/test"),
    ("/staff/ops/jobs/<name>/run", "POST"): _simple("admin", "/staff/ops/jobs/sweep/run"),
    ("/staff/admin/topics/new", "POST"): _topic_new,
    ("/staff/admin/topics/<slug>/edit", "POST"): _simple(
        "admin", "/staff/admin/topics/offers/edit", {"label": "Deals", "description": "Less."}
    ),
    ("/staff/admin/topics/<slug>/retire", "POST"): _simple(
        "admin", "/staff/admin/topics/offers/retire"
    ),
    ("/staff/admin/policies/new", "POST"): _policy_new,
    ("/staff/compliance/subscribers/<uuid:subscriber_id>/erase", "POST"): _erase_person,
    ("/staff/compliance/verify-log", "POST"): _simple("compliance", "/staff/compliance/verify-log"),
    ("/staff/campaigns/new", "POST"): _campaign_new,
    ("/staff/campaigns/test-send", "POST"): _test_send,
    ("/staff/campaigns/test-devices", "POST"): _register_test_device,
    ("/staff/campaigns/test-devices/<int:device_id>/rename", "POST"): lambda flow: flow.post(
        "campaigns",
        f"/staff/campaigns/test-devices/{_own_test_device(flow)}/rename",
        {"name": "Renamed laptop"},
    ),
    ("/staff/campaigns/test-devices/<int:device_id>/remove", "POST"): lambda flow: flow.post(
        "campaigns", f"/staff/campaigns/test-devices/{_own_test_device(flow)}/remove", {}
    ),
    ("/staff/campaigns/device-test", "POST"): _device_test,
    ("/staff/campaigns/<uuid:campaign_id>/clone", "POST"): _simple(
        "campaigns", "/staff/campaigns/<scheduled>/clone"
    ),
    ("/staff/campaigns/<uuid:campaign_id>/pause", "POST"): _simple(
        "campaigns", "/staff/campaigns/<scheduled>/pause"
    ),
    ("/staff/campaigns/<uuid:campaign_id>/resume", "POST"): _simple(
        "campaigns", "/staff/campaigns/<paused>/resume"
    ),
    ("/staff/campaigns/<uuid:campaign_id>/cancel", "POST"): _simple(
        "campaigns", "/staff/campaigns/<scheduled>/cancel", {"confirm": "y"}
    ),
}


def page_posts(app: Flask) -> set[Target]:
    return {
        target
        for target in walk.targets(app)
        if target[1] == "POST" and not walk.is_json_api(target[0])
    }


def test_every_post_route_is_covered(walk_app: Flask) -> None:
    """A POST route that is neither submitted below nor allow-listed fails here."""
    uncovered = page_posts(walk_app) - SUBMISSIONS.keys() - IDEMPOTENT.keys()
    assert not uncovered, (
        f"POST routes with no valid submission in SUBMISSIONS and no reason in IDEMPOTENT: "
        f"{sorted(uncovered)}"
    )
    assert not SUBMISSIONS.keys() & IDEMPOTENT.keys()


def test_a_new_post_route_that_answers_with_a_page_is_caught(walk_app: Flask) -> None:
    walk_app.add_url_rule("/feedback-form", "pages.feedback_form", lambda: "", methods=["POST"])
    assert ("/feedback-form", "POST") in page_posts(walk_app) - SUBMISSIONS.keys()


@pytest.fixture
def flow(walk_app: Flask) -> Flow:
    world = build_world(walk_app)
    return Flow(world, TableDigest(world.engine))


@pytest.mark.parametrize("target", sorted(SUBMISSIONS), ids=lambda t: f"{t[1]} {t[0]}")
def test_a_valid_submission_answers_with_a_redirect(flow: Flow, target: Target) -> None:
    before = flow.digest.take()
    answer = SUBMISSIONS[target](flow)
    assert answer.status_code == 303, (
        f"{target[1]} {target[0]} answered {answer.status_code} to a valid submission: "
        "do the work, then redirect (303) to a page that shows the outcome"
    )
    assert flow.digest.take() != before, "the submission did nothing: it is not a valid one"
