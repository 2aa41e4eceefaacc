"""The service worker in Chromium: pushes delivered through the DevTools protocol, clicks
and subscription changes run in the worker itself."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, CDPSession, Page, Worker

from tests.browser.conftest import subscribe_through_page
from tests.conftest import VAPID_PUBLIC
from tests.factories import SubscriptionFactory

pytestmark = pytest.mark.browser

NOTIFICATIONS = """async () => {
  const registration = await navigator.serviceWorker.ready;
  return (await registration.getNotifications()).map(n => ({
    title: n.title, body: n.body, tag: n.tag, icon: n.icon, data: n.data,
  }));
}"""


class PushChannel:
    """A page-level DevTools session that knows the worker's registration id."""

    def __init__(self, context: BrowserContext, page: Page, origin: str) -> None:
        self.origin = origin
        self.page = page
        self.cdp: CDPSession = context.new_cdp_session(page)
        self.registrations: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []
        self.cdp.on("ServiceWorker.workerRegistrationUpdated", self._updated)
        self.cdp.on("ServiceWorker.workerVersionUpdated", self._versions)
        self.cdp.on("ServiceWorker.workerErrorReported", self._error)
        self.cdp.send("ServiceWorker.enable")

    def _error(self, event: dict[str, Any]) -> None:
        self.errors.append(event)

    def _updated(self, event: dict[str, Any]) -> None:
        for registration in event["registrations"]:
            self.registrations[registration["registrationId"]] = registration

    def _versions(self, event: dict[str, Any]) -> None:
        for version in event["versions"]:
            self.versions[version["versionId"]] = version

    def _activated(self, registration_id: str) -> bool:
        return any(
            v["registrationId"] == registration_id and v["status"] == "activated"
            for v in self.versions.values()
        )

    def registration_id(self, timeout: float = 10) -> str:
        # DevTools may report the registration before its worker version is activated;
        # a push delivered before that is dropped by the browser, not by the worker.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rid, registration in self.registrations.items():
                if (
                    registration["scopeURL"] == self.origin + "/"
                    and not registration["isDeleted"]
                    and self._activated(rid)
                ):
                    return rid
            self.page.wait_for_timeout(50)
        raise AssertionError(
            f"no activated service worker registration seen: {self.registrations} {self.versions}"
        )

    def push(self, message: dict[str, Any]) -> None:
        self.cdp.send(
            "ServiceWorker.deliverPushMessage",
            {
                "origin": self.origin,
                "registrationId": self.registration_id(),
                "data": json.dumps(message),
            },
        )


@pytest.fixture
def worker_page(context: BrowserContext, server) -> tuple[Page, PushChannel]:
    page = context.new_page()
    page.goto("/")
    scope = page.evaluate(
        """async () => {
            await navigator.serviceWorker.register('/sw.js', {scope: '/'});
            return (await navigator.serviceWorker.ready).scope;
        }"""
    )
    assert scope == server.url + "/"
    return page, PushChannel(context, page, server.url)


def notifications(page: Page) -> list[dict[str, Any]]:
    return page.evaluate(NOTIFICATIONS)


def wait_for_notifications(
    page: Page, count: int, channel: PushChannel | None = None, timeout: float = 15
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = notifications(page)
        if len(shown) >= count:
            return shown
        page.wait_for_timeout(50)
    errors = channel.errors if channel else "not collected"
    raise AssertionError(
        f"expected {count} notifications, saw {notifications(page)}; worker errors: {errors}"
    )


def receipts(server, delivery_id: str) -> list[str]:
    return [
        row.event
        for row in server.rows(
            "SELECT event FROM delivery_receipt WHERE delivery_id = :d ORDER BY id", d=delivery_id
        )
    ]


def wait_for_receipts(server, delivery_id: str, count: int, timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = receipts(server, delivery_id)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"expected {count} receipts for {delivery_id}, saw {found}")


def message(**overrides: Any) -> dict[str, Any]:
    body = {
        "deliveryId": str(uuid.uuid4()),
        "campaignId": "c-41",
        "title": "Your order has shipped",
        "body": "It arrives on Thursday.",
        "url": "/preferences?from=push",
        "icon": "/static/img/icon.svg",
        "tag": "campaign-41",
    }
    body.update(overrides)
    return body


def test_sw_js_is_served_for_scope_root_without_caching(context, server):
    response = context.request.get("/sw.js")
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/javascript")
    assert response.headers["cache-control"] == "no-cache"


def test_a_push_shows_a_notification_with_its_data_and_reports_it(worker_page, server):
    page, channel = worker_page
    sent = message()
    channel.push(sent)
    (shown,) = wait_for_notifications(page, 1, channel)
    assert shown["title"] == sent["title"]
    assert shown["body"] == sent["body"]
    assert shown["tag"] == "campaign-41"
    assert shown["icon"] == server.url + "/static/img/icon.svg"
    assert shown["data"] == {
        "url": server.url + "/preferences?from=push",
        "deliveryId": sent["deliveryId"],
        "campaignId": "c-41",
    }
    assert wait_for_receipts(server, sent["deliveryId"], 1) == ["shown"]


def test_the_same_delivery_twice_shows_once(worker_page, server):
    page, channel = worker_page
    sent = message()
    channel.push(sent)
    wait_for_notifications(page, 1, channel)
    channel.push(sent)  # the repeat a crashed sender may make
    # A later, different delivery marks the point where the repeat has been handled.
    after = message(tag="campaign-42", title="Later")
    channel.push(after)
    shown = wait_for_notifications(page, 2, channel)
    wait_for_receipts(server, after["deliveryId"], 1)
    page.wait_for_timeout(300)
    assert sorted(n["tag"] for n in notifications(page)) == ["campaign-41", "campaign-42"]
    assert [n["title"] for n in shown if n["tag"] == "campaign-41"] == [sent["title"]]
    assert receipts(server, sent["deliveryId"]) == ["shown"]


def test_a_repeat_of_a_dismissed_delivery_does_not_come_back(worker_page, server):
    page, channel = worker_page
    sent = message()
    channel.push(sent)
    wait_for_notifications(page, 1, channel)
    page.evaluate(
        "async () => (await (await navigator.serviceWorker.ready).getNotifications())"
        ".forEach(n => n.close())"
    )
    assert notifications(page) == []
    channel.push(sent)
    barrier = message(tag="campaign-43")
    channel.push(barrier)
    wait_for_notifications(page, 1, channel)
    wait_for_receipts(server, barrier["deliveryId"], 1)
    page.wait_for_timeout(300)
    assert [n["tag"] for n in notifications(page)] == ["campaign-43"]
    assert receipts(server, sent["deliveryId"]) == ["shown"]


def test_links_and_icons_off_the_site_fall_back_to_the_site(worker_page, server):
    page, channel = worker_page
    channel.push(message(url="https://phishing.example/login", icon="https://cdn.example/i.png"))
    (shown,) = wait_for_notifications(page, 1, channel)
    assert shown["data"]["url"] == server.url + "/"
    assert shown["icon"] == ""


def test_links_and_icons_on_a_site_campaigns_may_link_to_are_kept(context, server):
    server.app.extensions["portal"].settings = server.app.extensions["portal.settings"] = (
        server.app.extensions["portal.settings"].with_overrides(
            campaign_link_origins=("https://shop.example",)
        )
    )
    page = context.new_page()
    page.goto("/")
    page.evaluate(
        "async () => { await navigator.serviceWorker.register('/sw.js', {scope: '/'});"
        " await navigator.serviceWorker.ready; }"
    )
    channel = PushChannel(context, page, server.url)
    channel.push(message(url="https://shop.example/sale?id=1", icon="https://shop.example/i.png"))
    channel.push(message(tag="campaign-2", url="https://phishing.example/", icon="/x.png"))
    shown = {n["tag"]: n for n in wait_for_notifications(page, 2, channel)}
    assert shown["campaign-41"]["data"]["url"] == "https://shop.example/sale?id=1"
    assert shown["campaign-41"]["icon"] == "https://shop.example/i.png"
    assert shown["campaign-2"]["data"]["url"] == server.url + "/"  # still never elsewhere


def test_a_push_without_a_delivery_id_or_json_still_shows(worker_page):
    page, channel = worker_page
    channel.cdp.send(
        "ServiceWorker.deliverPushMessage",
        {"origin": channel.origin, "registrationId": channel.registration_id(), "data": "hello"},
    )
    (shown,) = wait_for_notifications(page, 1, channel)
    assert shown["title"] == "Notification"
    assert shown["body"] == "hello"


def worker(context: BrowserContext) -> Worker:
    """The portal's service worker, to run code in its own global scope."""
    for candidate in context.service_workers:
        if candidate.url.endswith("/sw.js"):
            return candidate
    return context.wait_for_event("serviceworker", timeout=10_000)


# A headless browser cannot click a notification, and a click is what lets a worker open or
# focus a window, so those two calls are recorded instead of made. The rest is the worker's
# own click handler on a notification it showed: its link check, the tab lookup
# (clients.matchAll), closing the notification and the "clicked" receipt.
CLICK = """async () => {
  const opened = [], focused = [];
  Clients.prototype.openWindow = async function (url) { opened.push(url); return null; };
  WindowClient.prototype.focus = async function () { focused.push(this.url); return this; };
  const [notification] = await self.registration.getNotifications();
  await notificationClicked(notification);
  const left = (await self.registration.getNotifications()).length;
  return {opened, focused, left};
}"""


def test_a_click_focuses_the_tab_already_at_the_link_and_is_reported(context, worker_page, server):
    page, channel = worker_page
    sent = message()  # its link is /preferences?from=push
    channel.push(sent)
    wait_for_notifications(page, 1, channel)
    wait_for_receipts(server, sent["deliveryId"], 1)
    tab = context.new_page()
    tab.goto("/preferences?from=push")
    clicked = worker(context).evaluate(CLICK)
    assert clicked == {
        "opened": [],
        "focused": [server.url + "/preferences?from=push"],
        "left": 0,
    }
    assert wait_for_receipts(server, sent["deliveryId"], 2) == ["shown", "clicked"]


def test_a_click_opens_the_link_when_no_tab_shows_it(context, worker_page, server):
    page, channel = worker_page
    sent = message(url="/policy/2026-01")
    channel.push(sent)
    wait_for_notifications(page, 1, channel)
    clicked = worker(context).evaluate(CLICK)
    assert clicked == {"opened": [server.url + "/policy/2026-01"], "focused": [], "left": 0}
    assert "clicked" in wait_for_receipts(server, sent["deliveryId"], 2)


def test_a_click_never_leaves_the_site(context, worker_page, server):
    page, _ = worker_page
    # A notification whose data names another site (not one a push can make: the push
    # handler already refuses such links), to show the click handler checks again.
    worker(context).evaluate(
        """() => self.registration.showNotification('Hello', {
             data: {url: 'https://phishing.example/login', deliveryId: null}})"""
    )
    wait_for_notifications(page, 1)
    clicked = worker(context).evaluate(CLICK)
    # The site's root instead, which the page that registered the worker shows already.
    assert page.url == server.url + "/"
    assert clicked == {"opened": [], "focused": [server.url + "/"], "left": 0}


def test_a_changed_subscription_is_renewed_and_moves_the_person_over(
    context, server, browser_subscription
):
    page = context.new_page()
    subscribe_through_page(page, topics=("offers",))
    renewed = SubscriptionFactory()("fcm")
    # The browser's push service is out of reach here too: the worker's
    # pushManager.subscribe() answers with a subscription the test holds.
    answer = worker(context).evaluate(
        """async ([oldEndpoint, fresh]) => {
          const asked = [];
          PushManager.prototype.subscribe = async function (options) {
            const key = new Uint8Array(options.applicationServerKey);
            asked.push({
              userVisibleOnly: options.userVisibleOnly,
              key: btoa(String.fromCharCode(...key))
                .replace(/\\+/g, '-').replace(/\\//g, '_').replace(/=+$/, ''),
            });
            return {endpoint: fresh.endpoint, toJSON: () => fresh};
          };
          const response = await resubscribe({endpoint: oldEndpoint}, null);
          return {asked, status: response.status, body: await response.json()};
        }""",
        [browser_subscription.endpoint, renewed.to_json()],
    )
    assert answer["asked"] == [{"userVisibleOnly": True, "key": VAPID_PUBLIC}]
    assert answer["status"] == 201
    assert answer["body"]["moved"] is True
    rows = {
        row.endpoint: row
        for row in server.rows(
            "SELECT endpoint, state, end_reason, subscriber_id FROM push_subscription"
        )
    }
    old, new = rows[browser_subscription.endpoint], rows[renewed.endpoint]
    assert (old.state, old.end_reason) == ("revoked", "rotated")
    assert new.state in ("pending", "active")
    assert new.subscriber_id == old.subscriber_id  # the same person, choices and all
