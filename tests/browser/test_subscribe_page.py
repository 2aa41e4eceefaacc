"""The subscribe page in Chromium: every outcome, and the database behind it."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
import sqlalchemy as sa

from portal.identity import DEVICE_COOKIE, SUBSCRIBER_COOKIE
from portal.seams import current_portal
from portal.subscriptions.validation import endpoint_hash
from tests.browser.conftest import (
    DESKTOP,
    PHONE,
    active_element_id,
    calls,
    subscribe_through_page,
)
from tests.conftest import VAPID_PUBLIC

pytestmark = pytest.mark.browser

# The person's answer to the permission prompt, given when the page asks (a headless
# browser shows no prompt). Notification.permission follows the answer.
PROMPT = """
(function () {
  var state = "default";
  Object.defineProperty(Notification, "permission", {get: function () { return state; }});
  Notification.requestPermission = function (callback) {
    var log = JSON.parse(localStorage.getItem("__pushStub.log") || "[]");
    log.push({call: "requestPermission"});
    localStorage.setItem("__pushStub.log", JSON.stringify(log));
    state = "%s" === "default" ? "default" : "%s";
    if (callback) { callback("%s"); }
    return Promise.resolve("%s");
  };
})();
"""


def answering(answer: str) -> str:
    return PROMPT % (answer, answer, answer, answer)


NO_PUSH = "delete window.PushManager; delete Navigator.prototype.serviceWorker;"
# The browser's push service does not answer: pushManager.subscribe() fails after the
# permission is granted (it runs after push_stub.js, so it replaces the stub).
REFUSING_PUSH_SERVICE = """
PushManager.prototype.subscribe = function () {
  var log = JSON.parse(localStorage.getItem("__pushStub.log") || "[]");
  log.push({call: "subscribe-refused"});
  localStorage.setItem("__pushStub.log", JSON.stringify(log));
  return Promise.reject(new DOMException("Registration failed - push service error", "AbortError"));
};
"""
IPHONE_UA = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1"
)


def erase_behind_the_browser(server) -> None:
    """Erasure done elsewhere leaves a tombstone: credentials gone, revoked, deleted_at set."""
    with server.session() as session, session.begin():
        session.execute(
            sa.text(
                "UPDATE push_subscription SET state = 'revoked', end_reason = 'erased', "
                "revoked_at = CURRENT_TIMESTAMP, deleted_at = CURRENT_TIMESTAMP, "
                "endpoint = NULL, p256dh = NULL, auth_sealed = NULL, user_agent = NULL"
            )
        )


def _subscription_row(server, subscription):
    rows = server.rows(
        "SELECT id, endpoint, p256dh, auth_sealed, auth_key_version, state, subscriber_id, "
        "deleted_at FROM push_subscription WHERE endpoint_hash = :h",
        h=endpoint_hash(subscription.endpoint),
    )
    return rows[0] if rows else None


def test_the_page_explains_topics_and_the_policy_before_anything_is_asked(page):
    page.goto("/")
    assert page.locator("h1").inner_text() == "Get notifications from us"
    # Marketing topics are choices, off by default; account messages are explained only.
    for slug in ("weekly-digest", "product-news", "offers"):
        assert not page.is_checked(f"#topic-{slug}")
    assert page.locator("#topic-security-alerts").count() == 0
    assert "Security alerts" in page.locator("#subscribe-form").inner_text()
    assert "Notice version 2026-01" in page.inner_text("#subscribe-form")
    assert "only about the topics you choose" in page.inner_text(".policy__text")
    assert page.get_attribute("#subscribe-page", "data-policy-version") == "2026-01"
    assert page.get_attribute("#subscribe-page", "data-vapid-public-key") == VAPID_PUBLIC
    assert page.is_visible("#subscribe-button")
    assert calls(page, "requestPermission") == []  # nothing asked on load


def test_subscribing_stores_the_subscription_with_its_auth_secret_sealed(
    new_context, server, browser_subscription
):
    context = new_context(permission=False)
    context.add_init_script(answering("granted"))
    page = context.new_page()
    page.goto("/")
    page.check("#topic-weekly-digest")
    assert calls(page, "requestPermission") == []
    with page.expect_request("**/api/push/subscribe") as posted:
        page.click("#subscribe-button")
    page.wait_for_selector("#state-success:not([hidden])")

    # The outcome is focused and leads on to the preference centre.
    assert active_element_id(page) == "state-success"
    assert page.locator("#state-success a[href='/preferences']").is_visible()
    assert not page.is_visible("#subscribe-form")

    request = posted.value
    assert request.headers["content-type"] == "application/json"
    assert request.headers.get("x-csrftoken")
    body = request.post_data_json
    assert body["subscription"] == browser_subscription.to_json()
    assert body["topics"] == ["weekly-digest"]
    assert body["policyVersion"] == "2026-01"
    assert body["source"] == "subscribe-page"

    # The browser was asked once, after the click, with the server's key.
    assert len(calls(page, "requestPermission")) == 1
    (subscribed,) = calls(page, "subscribe")
    assert subscribed["options"] == {
        "userVisibleOnly": True,
        "applicationServerKey": VAPID_PUBLIC,
    }
    scope = page.evaluate("navigator.serviceWorker.getRegistration().then(r => r.scope)")
    assert scope == server.url + "/"

    row = _subscription_row(server, browser_subscription)
    assert row is not None
    assert row.endpoint == browser_subscription.endpoint
    assert row.p256dh == browser_subscription.p256dh
    assert row.state == "pending"
    sealed = bytes(row.auth_sealed)
    assert browser_subscription.auth not in sealed
    keys = current_portal(server.app).keys
    assert keys.open(sealed, row.auth_key_version) == browser_subscription.auth

    preferences = dict(
        server.rows(
            "SELECT t.slug, p.state FROM topic_preference p JOIN topic t ON t.id = p.topic_id "
            "WHERE p.subscriber_id = :s",
            s=row.subscriber_id,
        )
    )
    assert preferences == {
        "weekly-digest": "opt_in",
        "product-news": "opt_out",
        "offers": "opt_out",
    }
    versions = {
        r[0]
        for r in server.rows(
            "SELECT policy_version FROM topic_preference WHERE subscriber_id = :s",
            s=row.subscriber_id,
        )
    }
    assert versions == {"2026-01"}

    cookies = {c["name"]: c for c in context.cookies()}
    assert cookies[SUBSCRIBER_COOKIE]["httpOnly"]
    assert cookies[DEVICE_COOKIE]["httpOnly"]
    assert page.evaluate("document.cookie") == "" or SUBSCRIBER_COOKIE not in unquote(
        page.evaluate("document.cookie")
    )


@pytest.mark.parametrize(
    ("browser_zone", "kept"),
    [("Australia/Sydney", "Australia/Sydney"), ("America/Sao_Paulo", "America/Sao_Paulo")],
)
def test_the_page_records_the_browsers_time_zone(new_context, server, browser_zone, kept):
    """Chromium set to a zone (as the person's system is): the page sends what
    Intl.DateTimeFormat says, and it becomes the person's zone."""
    page = new_context(timezone_id=browser_zone).new_page()
    page.goto("/")
    assert page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone") == browser_zone
    with page.expect_request("**/api/push/subscribe") as posted:
        page.click("#subscribe-button")
    page.wait_for_selector("#state-success:not([hidden])")
    assert posted.value.post_data_json["timeZone"] == browser_zone
    assert server.scalar("SELECT time_zone FROM subscriber") == kept


@pytest.mark.parametrize(
    ("answer", "state", "error"),
    [("denied", "state-denied", True), ("default", "state-dismissed", False)],
)
def test_a_refused_or_dismissed_prompt_explains_and_writes_nothing(
    new_context, server, answer, state, error
):
    context = new_context(permission=False)
    context.add_init_script(answering(answer))
    page = context.new_page()
    page.goto("/")
    page.click("#subscribe-button")
    page.wait_for_selector(f"#{state}:not([hidden])")
    assert active_element_id(page) == state
    assert page.title().startswith("Error: ") is error
    if error:
        assert "site settings" in page.inner_text(f"#{state}")
    assert calls(page, "subscribe") == []
    assert page.is_visible("#subscribe-button")  # they can try again
    assert server.scalar("SELECT count(*) FROM push_subscription") == 0


def test_a_browser_without_push_is_told_so(new_context, server):
    context = new_context()
    context.add_init_script(NO_PUSH)
    page = context.new_page()
    page.goto("/")
    page.wait_for_selector("#state-unsupported:not([hidden])")
    assert not page.is_visible("#subscribe-button")
    assert page.locator("#state-unsupported a[href='/preferences']").is_visible()


def test_ios_safari_outside_the_home_screen_is_told_to_add_it(new_context):
    context = new_context(user_agent=IPHONE_UA, viewport={"width": 390, "height": 844})
    context.add_init_script("delete window.PushManager;")
    page = context.new_page()
    page.goto("/")
    page.wait_for_selector("#state-ios:not([hidden])")
    assert "Add to Home Screen" in page.inner_text("#state-ios")
    assert not page.is_visible("#subscribe-button")
    assert not page.is_visible("#state-unsupported")


# Form controls a person could operate, visible on the page.
VISIBLE_CONTROLS = """() => [...document.querySelectorAll('input, button, select, textarea')]
  .filter(el => el.type !== 'hidden' && el.getClientRects().length > 0)
  .map(el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : ''))"""


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
def test_without_javascript_the_page_offers_no_dead_controls(new_context, viewport):
    """Nothing could send a ticked box without the script: the page says what to do
    instead, lists the topics as text and leads to the preference centre."""
    context = new_context(
        java_script_enabled=False, stub=False, permission=False, viewport=viewport
    )
    page = context.new_page()
    page.goto("/")
    notice = page.locator("#no-javascript")
    assert notice.is_visible()
    assert "needs JavaScript" in notice.inner_text()
    assert notice.locator("a[href='/preferences']").is_visible()
    assert page.evaluate(VISIBLE_CONTROLS) == []
    listed = page.locator("#optional-topics-list").inner_text()
    for label in ("Weekly digest", "Product news", "Offers"):
        assert label in listed
    assert "Security alerts" in page.inner_text("#subscribe-form")  # what the account gets
    assert "Notice version 2026-01" in page.inner_text("#subscribe-form")
    # axe-core and the phone widths: the "subscribe-no-javascript" state in test_accessibility.


def test_with_javascript_the_topics_are_choices(page):
    page.goto("/")
    page.wait_for_selector("#subscribe-button")
    assert page.is_visible("#topic-offers")
    assert not page.is_visible("#optional-topics-list")


def test_an_already_subscribed_browser_sees_it_and_can_unsubscribe(
    page, server, browser_subscription
):
    subscribe_through_page(page)
    page.reload()
    page.wait_for_selector("#state-subscribed:not([hidden])")
    assert not page.is_visible("#subscribe-form")
    assert page.locator("#state-subscribed a[href='/preferences']").is_visible()

    with page.expect_request("**/api/push/unsubscribe") as posted:
        page.click("#unsubscribe-button")
    assert posted.value.post_data_json == {
        "endpoint": browser_subscription.endpoint,
        "auth": browser_subscription.auth_b64,
        "source": "subscribe-page",
    }
    page.wait_for_selector("#state-unsubscribed:not([hidden])")
    assert active_element_id(page) == "state-unsubscribed"
    assert len(calls(page, "unsubscribe")) == 1
    assert page.evaluate("window.PortalPush.currentSubscription()") is None
    assert _subscription_row(server, browser_subscription).state == "revoked"
    assert page.is_visible("#subscribe-button")  # and can turn them on again


def test_a_push_service_that_fails_is_explained_and_nothing_is_written(new_context, server):
    context = new_context()
    context.add_init_script(REFUSING_PUSH_SERVICE)
    page = context.new_page()
    page.goto("/")
    page.check("#topic-offers")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.click("#subscribe-button")
    page.wait_for_selector("#state-browser-error:not([hidden])")
    assert active_element_id(page) == "state-browser-error"
    assert page.title().startswith("Error: ")
    assert "try again" in page.inner_text("#state-browser-error")
    assert len(calls(page, "subscribe-refused")) == 1
    assert posts == []  # the server was never told of a subscription that does not exist
    assert page.evaluate("localStorage.getItem('portal.pendingSubscribe')") is None
    assert server.scalar("SELECT count(*) FROM push_subscription") == 0
    assert server.scalar("SELECT count(*) FROM topic_preference") == 0
    assert page.is_visible("#subscribe-button") and page.is_checked("#topic-offers")


def test_a_failed_unsubscribe_changes_nothing_and_can_be_retried(
    page, server, browser_subscription
):
    subscribe_through_page(page)
    page.reload()
    page.wait_for_selector("#state-subscribed:not([hidden])")
    page.route("**/api/push/unsubscribe", lambda route: route.abort("internetdisconnected"))
    page.click("#unsubscribe-button")
    page.wait_for_selector("#state-unsubscribe-failed:not([hidden])")
    assert active_element_id(page) == "state-unsubscribe-failed"
    assert page.title().startswith("Error: ")
    # Server first: it could not be told, so the browser keeps its subscription too.
    assert calls(page, "unsubscribe") == []
    assert page.evaluate("window.PortalPush.currentSubscription().then(s => !!s)") is True
    assert _subscription_row(server, browser_subscription).state == "pending"

    page.unroute("**/api/push/unsubscribe")
    page.click("#unsubscribe-retry-button")
    page.wait_for_selector("#state-unsubscribed:not([hidden])")
    assert len(calls(page, "unsubscribe")) == 1
    assert _subscription_row(server, browser_subscription).state == "revoked"


def test_a_failed_post_offers_a_retry_and_leaves_nothing_half_written(
    page, server, browser_subscription
):
    page.goto("/")
    page.route("**/api/push/subscribe", lambda route: route.abort("internetdisconnected"))
    page.click("#subscribe-button")
    page.wait_for_selector("#state-failed:not([hidden])")
    assert active_element_id(page) == "state-failed"
    assert page.title().startswith("Error: ")
    assert _subscription_row(server, browser_subscription) is None

    # Closing the page here must not leave a silent half: the next visit finds it.
    page.reload()
    page.wait_for_selector("#state-failed:not([hidden])")

    page.unroute("**/api/push/subscribe")
    page.click("#retry-button")
    page.wait_for_selector("#state-success:not([hidden])")
    assert active_element_id(page) == "state-success"
    assert _subscription_row(server, browser_subscription).state == "pending"
    assert page.evaluate("localStorage.getItem('portal.pendingSubscribe')") is None


def test_cancelling_after_a_failed_post_lets_go_of_the_browser_subscription(
    page, server, browser_subscription
):
    page.goto("/")
    page.route("**/api/push/subscribe", lambda route: route.abort("connectionrefused"))
    page.click("#subscribe-button")
    page.wait_for_selector("#state-failed:not([hidden])")
    page.click("#cancel-button")
    page.wait_for_selector("#state-cancelled:not([hidden])")
    assert len(calls(page, "unsubscribe")) == 1
    assert page.evaluate("window.PortalPush.currentSubscription()") is None
    assert _subscription_row(server, browser_subscription) is None
    page.reload()
    assert page.is_visible("#subscribe-button")
    assert not page.is_visible("#state-failed")


def test_the_page_asks_every_time_and_other_pages_check_in_at_most_hourly(page):
    subscribe_through_page(page)
    heartbeats: list[str] = []
    page.on("request", lambda r: heartbeats.append(r.url) if "/heartbeat" in r.url else None)
    with page.expect_response("**/api/push/status") as asked:
        page.reload()
    assert asked.value.json() == {"status": "receiving", "action": "none"}
    page.wait_for_selector("#state-subscribed:not([hidden])")
    page.goto("/policy/2026-01")
    page.wait_for_load_state("networkidle")
    assert heartbeats == []  # subscribing, and asking, count as the latest sign of life
    page.evaluate("localStorage.removeItem('portal.heartbeatAt')")
    with page.expect_response("**/api/push/heartbeat") as answered:
        page.goto("/policy/2026-01")
    assert answered.value.json() == {"state": "pending", "action": "none"}


def test_the_page_after_erasure_unsubscribes_the_browser(page, server, browser_subscription):
    subscribe_through_page(page)
    erase_behind_the_browser(server)
    with page.expect_response("**/api/push/status") as answered:
        page.reload()
    assert answered.value.json() == {"status": "erased", "action": "unsubscribe"}
    page.wait_for_selector("#state-erased:not([hidden])")
    assert len(calls(page, "unsubscribe")) == 1
    assert page.evaluate("window.PortalPush.currentSubscription()") is None
    assert page.is_visible("#subscribe-button")


def test_an_expired_subscription_is_renewed_when_the_page_asks(page, server, browser_subscription):
    subscribe_through_page(page)
    with server.session() as session, session.begin():
        session.execute(sa.text("UPDATE push_subscription SET state = 'expired'"))
    page.evaluate("localStorage.removeItem('portal.heartbeatAt')")
    with page.expect_response("**/api/push/subscribe") as renewed:
        page.reload()
    assert renewed.value.status == 200
    assert renewed.value.request.post_data_json["source"] == "subscribe-page"
    # The renewed grant cites the notice this page shows.
    assert renewed.value.request.post_data_json["policyVersion"] == "2026-01"
    assert (
        server.scalar(
            "SELECT policy_version FROM consent_event WHERE kind = 'permission_granted'"
            " ORDER BY seq DESC LIMIT 1"
        )
        == "2026-01"
    )
    assert [c["call"] for c in calls(page, "subscribe") + calls(page, "unsubscribe")] == [
        "subscribe",
        "subscribe",
        "unsubscribe",
    ]
    assert _subscription_row(server, browser_subscription).state == "pending"
    assert page.is_visible("#state-subscribed")


def test_a_browser_whose_cookies_were_cleared_proves_itself_with_its_auth(
    page, server, browser_subscription
):
    """Asking, unsubscribe and subscribing again all work without cookies: the page
    sends the subscription's auth secret, which only this browser has."""
    subscribe_through_page(page, topics=("offers",))
    first = _subscription_row(server, browser_subscription)
    page.context.clear_cookies()
    with page.expect_response("**/api/push/status") as answered:
        page.reload()
    assert answered.value.request.post_data_json == {
        "endpoint": browser_subscription.endpoint,
        "auth": browser_subscription.auth_b64,
    }
    assert answered.value.json() == {"status": "receiving", "action": "none"}
    page.wait_for_selector("#state-subscribed:not([hidden])")

    with page.expect_response("**/api/push/unsubscribe") as stopped:
        page.click("#unsubscribe-button")
    assert stopped.value.status == 200
    page.wait_for_selector("#state-unsubscribed:not([hidden])")
    assert _subscription_row(server, browser_subscription).state == "revoked"

    # Turning them on again: the same keys prove the same browser, which gets its row,
    # its person and its cookies back.
    with page.expect_response("**/api/push/subscribe") as again:
        page.click("#subscribe-button")
    assert again.value.status == 200
    page.wait_for_selector("#state-success:not([hidden])")
    row = _subscription_row(server, browser_subscription)
    assert (row.id, row.subscriber_id, row.state) == (first.id, first.subscriber_id, "pending")
    assert {SUBSCRIBER_COOKIE, DEVICE_COOKIE} <= {c["name"] for c in page.context.cookies()}


def test_a_subscription_the_server_cannot_tie_to_this_browser_is_let_go(
    page, server, browser_subscription
):
    """Erased behind a browser whose cookies were then cleared: nothing proves the
    tombstone is its own and no person the portal knows is behind it, so the browser
    drops the subscription instead of registering it again unasked."""
    subscribe_through_page(page)
    erase_behind_the_browser(server)
    page.context.clear_cookies()
    with page.expect_response("**/api/push/status") as answered:
        page.reload()
    assert answered.value.json() == {"status": "unknown", "action": "unsubscribe"}
    page.wait_for_selector("#state-not-subscribed:not([hidden])")
    assert len(calls(page, "unsubscribe")) == 1
    assert page.evaluate("window.PortalPush.currentSubscription()") is None
    assert len(calls(page, "subscribe")) == 1  # not subscribed again
