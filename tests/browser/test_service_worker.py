"""The service worker in Chromium: pushes delivered through the DevTools protocol, clicks
and subscription changes run in the worker itself."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import BrowserContext, CDPSession, Page, Worker

from portal.clock import SystemClock
from portal.seams import current_portal
from portal.subscriptions.models import PushSubscription
from portal.subscriptions.validation import endpoint_hash
from tests.browser.conftest import subscribe_through_api, subscribe_through_page
from tests.conftest import VAPID_PUBLIC
from tests.factories import BrowserSubscription, SubscriptionFactory
from tests.helpers import record_delivery

pytestmark = pytest.mark.browser

NOTIFICATIONS = """async () => {
  const registration = await navigator.serviceWorker.ready;
  return (await registration.getNotifications()).map(n => ({
    title: n.title, body: n.body, tag: n.tag, icon: n.icon, data: n.data,
  }));
}"""

# How a test sees what a push did. Polling getNotifications() while a notification is being
# shown is no way to watch: Chromium's getNotifications() drops from its notification
# database every entry created before the call that is not yet among the displayed ones, so
# a notification caught half-shown stays on screen but is never listed again. The probe runs
# in the worker's global scope before the first push (through the worker's own showNotification
# and waitUntil, which it only counts and passes on) and records, for each push event, how its
# waitUntil promise ended and, at that moment, how many showNotification calls were still
# under way and the tags of those done (a push must not end before its notification is on
# screen); then, once no call is under way, which notifications are open. Reading only then
# never races a display.
PUSH_PROBE = """() => {
  if (self.__pushProbe) return true;
  const probe = {showing: 0, shown: [], pushes: []};
  const show = ServiceWorkerRegistration.prototype.showNotification;
  ServiceWorkerRegistration.prototype.showNotification = function (title, options) {
    probe.showing += 1;
    return show.call(this, title, options).then(
      (value) => { probe.shown.push((options && options.tag) || ''); return value; },
    ).finally(() => { probe.showing -= 1; });
  };
  const waitUntil = ExtendableEvent.prototype.waitUntil;
  ExtendableEvent.prototype.waitUntil = function (promise) {
    if (this.type === 'push') {
      const push = {outcome: 'pending', error: null, showing: null, shown: null, open: null};
      probe.pushes.push(push);
      Promise.resolve(promise)
        .then(() => { push.outcome = 'fulfilled'; },
              (error) => { push.outcome = 'rejected'; push.error = String(error); })
        .then(async () => {
          push.showing = probe.showing;
          push.shown = [...probe.shown];
          while (probe.showing > 0) await new Promise((r) => setTimeout(r, 10));
          push.open = (await self.registration.getNotifications()).map(n => ({
            title: n.title, body: n.body, tag: n.tag, icon: n.icon, data: n.data,
          }));
        });
    }
    return waitUntil.call(this, promise);
  };
  self.__pushProbe = probe;
  return true;
}"""

PUSHES = "() => self.__pushProbe ? self.__pushProbe.pushes : null"


def worker(context: BrowserContext) -> Worker:
    """The portal's service worker, to run code in its own global scope."""
    for candidate in context.service_workers:
        if candidate.url.endswith("/sw.js"):
            return candidate
    return context.wait_for_event("serviceworker", timeout=10_000)


class PushChannel:
    """A page-level DevTools session that knows the worker's registration id, and the
    worker's push probe that says when each push ended and what it left on screen."""

    def __init__(
        self,
        context: BrowserContext,
        page: Page,
        origin: str,
        sent: Callable[..., None] | None = None,
    ) -> None:
        self.origin = origin
        self.page = page
        self.worker = worker(context)
        assert self.worker.evaluate(PUSH_PROBE)
        self.sent = sent  # records a delivery as the sender would, before it is pushed
        self.recorded: set[str] = set()
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

    def deliver(self, data: str) -> None:
        """A push whose decrypted body is ``data`` (empty: a push without a body)."""
        self.cdp.send(
            "ServiceWorker.deliverPushMessage",
            {"origin": self.origin, "registrationId": self.registration_id(), "data": data},
        )

    def push(self, message: dict[str, Any]) -> None:
        delivery_id = message.get("deliveryId")
        if self.sent and delivery_id and delivery_id not in self.recorded:
            self.sent(str(delivery_id), message.get("actions"))
            self.recorded.add(str(delivery_id))
        self.deliver(json.dumps(message))

    def ended(self, count: int, timeout: float = 15) -> list[dict[str, Any]]:
        """The first ``count`` push events once each has ended: ``outcome`` of its
        waitUntil promise, ``showing`` (showNotification calls still under way when it
        ended), ``shown`` (the tags of those done by then) and ``open`` (the notifications
        open afterwards)."""
        deadline = time.monotonic() + timeout
        pushes: list[dict[str, Any]] | None = []
        while time.monotonic() < deadline:
            pushes = self.worker.evaluate(PUSHES)
            if pushes is None:
                raise AssertionError("the service worker restarted: its push probe is gone")
            if len(pushes) >= count and all(p["open"] is not None for p in pushes[:count]):
                return pushes[:count]
            time.sleep(0.02)
        raise AssertionError(
            f"expected {count} push events to end, saw {pushes}; worker errors: {self.errors}"
        )

    def last_ended(self, count: int) -> dict[str, Any]:
        return self.ended(count)[-1]


def deliveries_to(server, subscription: BrowserSubscription) -> Callable[..., None]:
    """Records a delivery (with the push's id, of a campaign with the push's buttons) to
    the browser's subscription: only a delivery sent to the browser may be reported by
    it, and a button only when its notification had it."""

    def record(delivery_id: str, actions: list[dict[str, str]] | None = None) -> None:
        with server.session() as session, session.begin():
            held = session.execute(
                sa.select(PushSubscription.id).where(
                    PushSubscription.endpoint_hash == endpoint_hash(subscription.endpoint)
                )
            ).scalar_one()
            record_delivery(
                session,
                held,
                now=SystemClock().now(),
                delivery_id=int(delivery_id),
                actions=actions if isinstance(actions, list) else None,
            )

    return record


@pytest.fixture
def worker_page(context: BrowserContext, server, browser_subscription) -> tuple[Page, PushChannel]:
    # A subscribed browser: its device cookie is what the worker's receipts show.
    subscribe_through_api(context, browser_subscription)
    page = context.new_page()
    page.goto("/")
    scope = page.evaluate(
        """async () => {
            await navigator.serviceWorker.register('/sw.js', {scope: '/'});
            return (await navigator.serviceWorker.ready).scope;
        }"""
    )
    assert scope == server.url + "/"
    return page, PushChannel(
        context, page, server.url, sent=deliveries_to(server, browser_subscription)
    )


def notifications(page: Page) -> list[dict[str, Any]]:
    """The open notifications; read only when no push is under way (see PUSH_PROBE)."""
    return page.evaluate(NOTIFICATIONS)


def dismiss_all(page: Page, timeout: float = 10) -> None:
    """Closes every open notification, as a person dismissing them would, and returns once
    the browser lists none. ``close()`` only sends the request: Chromium removes the
    notification from its database afterwards, so a ``getNotifications()`` (the page's or
    the worker's) made at once may still list it."""
    page.evaluate(
        "async () => (await (await navigator.serviceWorker.ready).getNotifications())"
        ".forEach(n => n.close())"
    )
    deadline = time.monotonic() + timeout
    while (still := notifications(page)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert still == [], f"notifications still open after close(): {still}"


def on_screen(push: dict[str, Any]) -> list[dict[str, Any]]:
    """What a push that ended alone left on screen, after checking what every push owes:
    its promise fulfilled and no notification still on its way to the screen when it ended
    (with no other push under way, any such notification would be its own)."""
    assert push["outcome"] == "fulfilled", push["error"]
    assert push["showing"] == 0, f"the push ended before its notification was on screen: {push}"
    return push["open"]


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


_DELIVERY_IDS = itertools.count(10**12)  # the decimal ids of delivery rows, unique per run


def message(**overrides: Any) -> dict[str, Any]:
    body = {
        "deliveryId": str(next(_DELIVERY_IDS)),
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
    _, channel = worker_page
    sent = message()
    channel.push(sent)
    (shown,) = on_screen(channel.last_ended(1))
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
    (first,) = on_screen(channel.last_ended(1))
    channel.push(sent)  # the repeat a crashed sender may make
    # The repeat showed it again under its tag, which replaced it in place: the push ended
    # with it on screen, still the one notification of the delivery.
    repeat = channel.last_ended(2)
    assert on_screen(repeat) == [first]
    assert repeat["shown"] == ["campaign-41", "campaign-41"]
    wait_for_receipts(server, sent["deliveryId"], 1)
    after = message(tag="campaign-42", title="Later")
    channel.push(after)
    assert sorted(n["tag"] for n in on_screen(channel.last_ended(3))) == [
        "campaign-41",
        "campaign-42",
    ]
    wait_for_receipts(server, after["deliveryId"], 1)
    assert [n for n in notifications(page) if n["tag"] == "campaign-41"] == [first]
    assert receipts(server, sent["deliveryId"]) == ["shown"]


def test_a_repeat_arriving_while_the_first_is_being_shown_replaces_it(worker_page, server):
    # Two copies of a delivery a moment apart (a send repeated on a new connection, both
    # handed over at once): neither push may end before the delivery's notification is on
    # screen, and it ends as one notification. Each delivery has a tag of its own, so a
    # tag among those shown when a push ended is that delivery's notification.
    page, channel = worker_page
    sent = [message(tag=f"campaign-{n}") for n in range(5)]
    for index, delivery in enumerate(sent):
        channel.push(delivery)
        channel.push(delivery)
        for push in channel.ended(2 * index + 2)[-2:]:
            assert push["outcome"] == "fulfilled", push["error"]
            assert delivery["tag"] in push["shown"], (
                f"a push ended before its notification was on screen: {push}"
            )
            (shown,) = (n for n in push["open"] if n["tag"] == delivery["tag"])
            assert shown["data"]["deliveryId"] == delivery["deliveryId"]
    for delivery in sent:
        assert wait_for_receipts(server, delivery["deliveryId"], 1) == ["shown"]
    assert sorted(n["tag"] for n in notifications(page)) == [d["tag"] for d in sent]


def test_a_repeat_of_a_dismissed_delivery_does_not_come_back(worker_page, server):
    page, channel = worker_page
    sent = message()
    channel.push(sent)
    on_screen(channel.last_ended(1))
    dismiss_all(page)
    channel.push(sent)
    # The one push that ends with nothing on screen, by design (docs/subscribe-page.md).
    repeat = channel.last_ended(2)
    assert on_screen(repeat) == []
    assert repeat["shown"] == ["campaign-41"]  # not shown again
    assert notifications(page) == []
    assert receipts(server, sent["deliveryId"]) == ["shown"]


def test_a_newer_delivery_of_a_campaign_replaces_the_older_in_place(worker_page, server):
    page, channel = worker_page
    older, newer = message(), message(body="It arrives on Friday.")
    channel.push(older)
    on_screen(channel.last_ended(1))
    channel.push(newer)
    (shown,) = on_screen(channel.last_ended(2))
    assert (shown["tag"], shown["body"]) == ("campaign-41", "It arrives on Friday.")
    assert shown["data"]["deliveryId"] == newer["deliveryId"]
    assert notifications(page) == [shown]
    assert wait_for_receipts(server, newer["deliveryId"], 1) == ["shown"]


def test_links_and_icons_off_the_site_fall_back_to_the_site(worker_page, server):
    _, channel = worker_page
    channel.push(message(url="https://phishing.example/login", icon="https://cdn.example/i.png"))
    (shown,) = on_screen(channel.last_ended(1))
    assert shown["data"]["url"] == server.url + "/"
    assert shown["icon"] == ""


def test_links_and_icons_on_a_site_campaigns_may_link_to_are_kept(context, server):
    current_portal(server.app).settings = current_portal(server.app).settings.with_overrides(
        campaign_link_origins=("https://shop.example",)
    )
    page = context.new_page()
    page.goto("/")
    page.evaluate(
        "async () => { await navigator.serviceWorker.register('/sw.js', {scope: '/'});"
        " await navigator.serviceWorker.ready; }"
    )
    channel = PushChannel(context, page, server.url)
    channel.push(message(url="https://shop.example/sale?id=1", icon="https://shop.example/i.png"))
    on_screen(channel.last_ended(1))
    channel.push(message(tag="campaign-2", url="https://phishing.example/", icon="/x.png"))
    shown = {n["tag"]: n for n in on_screen(channel.last_ended(2))}
    assert shown["campaign-41"]["data"]["url"] == "https://shop.example/sale?id=1"
    assert shown["campaign-41"]["icon"] == "https://shop.example/i.png"
    assert shown["campaign-2"]["data"]["url"] == server.url + "/"  # still never elsewhere


@pytest.mark.parametrize(
    ("data", "title", "body", "tag"),
    [
        pytest.param("", "Notification", "", "", id="empty"),
        pytest.param("hello", "Notification", "hello", "", id="text"),
        pytest.param('{"title": "Hi", ', "Notification", '{"title": "Hi", ', "", id="cut-json"),
        pytest.param(
            json.dumps({"title": "Hi", "body": "there", "tag": "campaign-7"}),
            "Hi",
            "there",
            "campaign-7",
            id="json-without-delivery-id",
        ),
        pytest.param("5", "Notification", "", "", id="json-number"),
        pytest.param('"hello"', "Notification", "", "", id="json-string"),
        pytest.param("[1, 2]", "Notification", "", "", id="json-array"),
        pytest.param("null", "Notification", "", "", id="json-null"),
        pytest.param(
            json.dumps({"deliveryId": 7, "title": ["x"], "body": {}}),
            "Notification",
            "",
            "",
            id="json-of-wrong-types",
        ),
        pytest.param(
            "\x00\x01\x7f\xfe\xff", "Notification", "\x00\x01\x7f\xfe\xff", "", id="binary"
        ),
    ],
)
def test_a_push_without_a_delivery_id_or_json_still_shows(
    worker_page, server, data, title, body, tag
):
    _, channel = worker_page
    channel.deliver(data)
    (shown,) = on_screen(channel.last_ended(1))
    assert (shown["title"], shown["body"], shown["tag"]) == (title, body, tag)
    assert shown["data"] == {"url": server.url + "/", "deliveryId": None, "campaignId": None}


def test_a_push_of_bytes_that_are_not_utf8_still_shows(worker_page, server):
    # The DevTools protocol carries text, so a body that is not UTF-8 at all is given to
    # the worker's own handler as the push event's data, made from the raw bytes.
    page, channel = worker_page
    channel.worker.evaluate(
        """() => handlePush(payload(
             new PushEvent('push', {data: new Uint8Array([0xff, 0xfe, 0x00, 0x80, 0xc3])}).data))"""
    )
    (shown,) = notifications(page)
    assert (shown["title"], shown["body"]) == ("Notification", "\ufffd\ufffd\x00\ufffd\ufffd")


def test_pushes_without_an_id_or_a_tag_each_show(worker_page):
    _, channel = worker_page
    channel.deliver("one")
    on_screen(channel.last_ended(1))
    channel.deliver("two")
    assert sorted(n["body"] for n in on_screen(channel.last_ended(2))) == ["one", "two"]


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
    _, channel = worker_page
    sent = message()  # its link is /preferences?from=push
    channel.push(sent)
    on_screen(channel.last_ended(1))
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
    _, channel = worker_page
    sent = message(url="/policy/2026-01")
    channel.push(sent)
    on_screen(channel.last_ended(1))
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
    assert len(notifications(page)) == 1  # evaluate returned once it was shown
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


# The worker's resubscribe() with pushManager.subscribe() answering a subscription the test
# holds; the old subscription is given as a browser gives event.oldSubscription, its keys
# readable through toJSON() (or not at all, when `old` has only the endpoint).
RESUBSCRIBE = """async ([old, fresh]) => {
  PushManager.prototype.subscribe = async () => ({endpoint: fresh.endpoint, toJSON: () => fresh});
  const oldSubscription = old.keys ? {endpoint: old.endpoint, toJSON: () => old} : old;
  const sent = [];
  const realFetch = self.fetch;
  self.fetch = (url, options) => {
    if (options && options.method === "POST") {
      sent.push({url, credentials: options.credentials, body: JSON.parse(options.body)});
    }
    return realFetch(url, options);
  };
  try {
    const response = await resubscribe(oldSubscription, null);
    return {sent, status: response.status, body: await response.json()};
  } finally {
    self.fetch = realFetch;
  }
}"""


def _rows(server) -> dict[str, Any]:
    return {
        row.endpoint: row
        for row in server.rows(
            "SELECT endpoint, state, end_reason, subscriber_id FROM push_subscription"
        )
    }


def test_a_worker_without_cookies_proves_the_old_subscription_with_its_keys(
    context, server, browser_subscription
):
    page = context.new_page()
    subscribe_through_page(page, topics=("offers",))
    context.clear_cookies()
    renewed = SubscriptionFactory()("fcm")
    answer = worker(context).evaluate(
        RESUBSCRIBE, [browser_subscription.to_json(), renewed.to_json()]
    )
    (change,) = answer["sent"]
    assert change["url"] == "/api/push/change"
    assert change["credentials"] == "same-origin"
    assert change["body"]["oldAuth"] == browser_subscription.auth_b64
    assert (answer["status"], answer["body"]["moved"]) == (201, True)
    rows = _rows(server)
    old, new = rows[browser_subscription.endpoint], rows[renewed.endpoint]
    assert (old.state, old.end_reason) == ("revoked", "rotated")
    assert new.subscriber_id == old.subscriber_id
    # The answer gave the worker's browser its cookies back, naming the new subscription.
    assert {"portal_subscriber", "portal_device"} <= {c["name"] for c in context.cookies()}


def test_a_worker_that_cannot_prove_the_old_subscription_registers_the_new_one_alone(
    context, server, browser_subscription
):
    page = context.new_page()
    subscribe_through_page(page)
    context.clear_cookies()
    renewed = SubscriptionFactory()("fcm")
    answer = worker(context).evaluate(
        RESUBSCRIBE, [{"endpoint": browser_subscription.endpoint}, renewed.to_json()]
    )
    assert [s["url"] for s in answer["sent"]] == ["/api/push/change", "/api/push/subscribe"]
    assert answer["status"] == 201
    rows = _rows(server)
    old, new = rows[browser_subscription.endpoint], rows[renewed.endpoint]
    assert old.state == "pending"  # not moved: nobody showed it was theirs
    assert new.subscriber_id != old.subscriber_id


@pytest.mark.parametrize("old_given", [True, False])
def test_a_worker_whose_person_ended_the_subscription_lets_the_new_one_go(
    context, server, browser_subscription, old_given
):
    """The person unsubscribed (here from the API; from another device, say) while this
    browser kept its push subscription; its push service rotates it. The server refuses
    the move (410), or the registration alone when the browser gave no old subscription,
    and the worker drops the new push subscription: nobody chose it."""
    page = context.new_page()
    subscribe_through_page(page)
    ended = context.request.post(
        "/api/push/unsubscribe", data={"endpoint": browser_subscription.endpoint}
    )
    assert ended.status == 200
    renewed = SubscriptionFactory()("fcm")
    answer = worker(context).evaluate(
        """async ([old, fresh]) => {
          const dropped = [];
          const subscription = {
            endpoint: fresh.endpoint,
            toJSON: () => fresh,
            unsubscribe: async () => { dropped.push(fresh.endpoint); return true; },
          };
          PushManager.prototype.subscribe = async () => subscription;
          const sent = [];
          const realFetch = self.fetch;
          self.fetch = (url, options) => {
            if (options && options.method === "POST") sent.push(url);
            return realFetch(url, options);
          };
          try {
            const response = await resubscribe(old ? {endpoint: old} : null, null);
            return {sent, dropped, status: response.status, body: await response.json()};
          } finally {
            self.fetch = realFetch;
          }
        }""",
        [browser_subscription.endpoint if old_given else None, renewed.to_json()],
    )
    assert answer["sent"] == ["/api/push/change" if old_given else "/api/push/subscribe"]
    assert (answer["status"], answer["body"]["error"]["code"]) == (410, "subscription_ended")
    assert answer["dropped"] == [renewed.endpoint]
    assert set(_rows(server)) == {browser_subscription.endpoint}


RICH_SHOWN = """async () => (await (await navigator.serviceWorker.ready).getNotifications()).map(
  n => ({image: n.image, badge: n.badge, actions: n.actions.map(a => ({action: a.action, title: a.title})),
         requireInteraction: n.requireInteraction, silent: n.silent, data: n.data}))"""

# The worker's own notificationclick listener, given an event with a button's action (a
# script-made event cannot use waitUntil, so this one collects the promise itself).
CLICK_ACTION = """async (action) => {
  const opened = [], focused = [];
  Clients.prototype.openWindow = async function (url) { opened.push(url); return null; };
  WindowClient.prototype.focus = async function () { focused.push(this.url); return this; };
  const [notification] = await self.registration.getNotifications();
  const event = new NotificationEvent('notificationclick', {notification, action});
  const work = [];
  event.waitUntil = (promise) => work.push(promise);
  self.dispatchEvent(event);
  await Promise.all(work);
  return {opened, focused, left: (await self.registration.getNotifications()).length};
}"""


def rich_message(**overrides: Any) -> dict[str, Any]:
    return message(
        image="/static/img/icon.svg",
        badge="/static/img/icon.svg",
        actions=[
            {"action": "action-1", "title": "Track it", "url": "/track"},
            {"action": "action-2", "title": "Change delivery", "url": "/change?x=1"},
        ],
        requireInteraction=True,
        silent=True,
        **overrides,
    )


def test_a_rich_push_shows_its_image_badge_buttons_and_flags(worker_page, server):
    page, channel = worker_page
    channel.push(rich_message())
    on_screen(channel.last_ended(1))
    (shown,) = page.evaluate(RICH_SHOWN)
    assert shown["image"] == server.url + "/static/img/icon.svg"
    assert shown["badge"] == server.url + "/static/img/icon.svg"
    assert shown["actions"] == [
        {"action": "action-1", "title": "Track it"},
        {"action": "action-2", "title": "Change delivery"},
    ]
    assert shown["requireInteraction"] is True and shown["silent"] is True
    assert shown["data"]["actions"] == [
        {"action": "action-1", "title": "Track it", "url": server.url + "/track"},
        {"action": "action-2", "title": "Change delivery", "url": server.url + "/change?x=1"},
    ]


def test_a_button_opens_its_own_link_and_is_its_own_receipt(context, worker_page, server):
    _, channel = worker_page
    sent = rich_message()
    channel.push(sent)
    on_screen(channel.last_ended(1))
    wait_for_receipts(server, sent["deliveryId"], 1)
    clicked = worker(context).evaluate(CLICK_ACTION, "action-2")
    assert clicked == {"opened": [server.url + "/change?x=1"], "focused": [], "left": 0}
    assert wait_for_receipts(server, sent["deliveryId"], 2) == ["shown", "action-2"]


def test_a_click_on_the_body_of_a_rich_notification_is_a_plain_click(context, worker_page, server):
    _, channel = worker_page
    sent = rich_message()
    channel.push(sent)
    on_screen(channel.last_ended(1))
    wait_for_receipts(server, sent["deliveryId"], 1)
    clicked = worker(context).evaluate(CLICK_ACTION, "")
    assert clicked["opened"] == [server.url + "/preferences?from=push"]
    assert wait_for_receipts(server, sent["deliveryId"], 2) == ["shown", "clicked"]


def test_buttons_off_the_site_or_not_ours_are_left_out(worker_page, server):
    page, channel = worker_page
    channel.push(
        message(
            actions=[
                {"action": "action-1", "title": "Phish", "url": "https://phishing.example/"},
                {"action": "evil", "title": "Odd id", "url": "/ok"},
                {"action": "action-2", "title": "Fine", "url": "/ok"},
                {"action": "action-1", "title": "Third", "url": "/third"},
            ],
            image="https://phishing.example/x.png",
        )
    )
    on_screen(channel.last_ended(1))
    (shown,) = page.evaluate(RICH_SHOWN)
    assert shown["actions"] == [
        {"action": "action-2", "title": "Fine"},
        {"action": "action-1", "title": "Third"},
    ]
    assert shown["image"] == ""
