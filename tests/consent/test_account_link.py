"""Linking a browser to a host product's account needs the person's own confirmation.

A sign-in link (``/preferences?assertion=…``) is a bearer token: whoever sends it chooses
the account. Opened, it only asks; the browser joins the account when the person confirms
on a page that names it, by a POST carrying the page's CSRF token.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from portal.identity import sign_assertion
from portal.seams import current_portal
from tests.helpers import confirm_account_link, csrf_token

SECRET = "host-product-secret"


@pytest.fixture
def linking(app, catalogue_ready):
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        identity_assertion_secrets=(SECRET,)
    )
    return app


def _assertion(subject: str, **claims) -> str:
    return sign_assertion({"sub": subject, "exp": time.time() + 60, **claims}, SECRET)


def _subscribe(client, subscriptions):
    sub = subscriptions()
    answer = client.post(
        "/api/push/subscribe",
        json={"subscription": sub.to_json(), "topics": ["offers"], "policyVersion": "v1"},
    )
    assert answer.status_code == 201
    return sub


def _snapshot(engine) -> dict[str, object]:
    """Everything linking could change: who owns each device, the accounts, the log."""
    with engine.connect() as conn:
        return {
            "owners": sorted(
                (str(e), str(s))
                for e, s in conn.execute(
                    sa.text("SELECT endpoint, subscriber_id FROM push_subscription")
                )
            ),
            "subscribers": sorted(
                (str(i), str(x))
                for i, x in conn.execute(sa.text("SELECT id, external_user_id FROM subscriber"))
            ),
            "preferences": conn.execute(
                sa.text("SELECT count(*) FROM topic_preference")
            ).scalar_one(),
            "events": conn.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one(),
            "linked": conn.execute(
                sa.text("SELECT count(*) FROM consent_event WHERE kind = 'account_linked'")
            ).scalar_one(),
        }


def test_opening_a_sign_in_link_writes_nothing_and_asks(linking, client, engine, subscriptions):
    _subscribe(client, subscriptions)
    before = _snapshot(engine)
    assertion = _assertion("user-42")
    opened = client.get(f"/preferences?assertion={assertion}")
    # The token leaves the address bar at once: the page that asks lives at a clean URL.
    assert opened.status_code == 303
    assert opened.headers["Location"] == "/preferences/link"
    assert _snapshot(engine) == before
    page = client.get("/preferences/link")
    assert page.status_code == 200
    assert assertion not in page.text
    assert assertion.partition(".")[0] not in page.text  # not even its payload
    assert "<title>Link this browser to your account – Push consent portal</title>" in page.text
    assert "user-42" in page.text  # it names the account
    assert "1 device" in page.text  # and says what joins it
    assert 'name="csrf_token"' in page.text
    assert page.headers["Cache-Control"] == "no-store"
    assert _snapshot(engine) == before  # showing the page writes nothing either
    assert client.get_cookie("portal_subscriber") is not None  # still the anonymous one


def test_confirming_links_exactly_as_before(linking, client, engine, subscriptions):
    _subscribe(client, subscriptions)
    page = client.get("/preferences")
    client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(page.text),
            "policy_version": "v1",
            "visible": ["offers"],
            "topics": ["offers"],
        },
    )
    laptop = linking.test_client()
    linked = confirm_account_link(laptop, _assertion("user-42", region="DE"))
    assert linked.status_code == 303
    linked = confirm_account_link(client, _assertion("user-42"))
    assert linked.status_code == 303
    assert linked.headers["Location"] == "/preferences"
    after = client.get("/preferences")
    assert "This browser is now linked to your account." in after.text
    with engine.connect() as conn:
        account = conn.execute(
            sa.text("SELECT id, region_code FROM subscriber WHERE external_user_id = 'user-42'")
        ).one()
        owners = set(conn.execute(sa.text("SELECT subscriber_id FROM push_subscription")).scalars())
        merged = conn.execute(
            sa.text(
                "SELECT p.state, p.source FROM topic_preference p JOIN topic t ON t.id = p.topic_id"
                " WHERE t.slug = 'offers' AND p.subscriber_id = :a"
            ),
            {"a": account.id},
        ).one()
    assert account.region_code == "EU"
    assert owners == {account.id}
    assert tuple(merged) == ("opt_in", "account-link")
    assert _snapshot(engine)["linked"] == 2
    assert "On: you chose this on" in laptop.get("/preferences").text
    # The confirmation is used up: posting it again links nothing more.
    again = client.post(
        "/preferences/link", data={"csrf_token": csrf_token(after.text), "action": "link"}
    )
    assert again.status_code == 303
    assert _snapshot(engine)["linked"] == 2


def test_the_confirmation_without_csrf_is_refused(linking, client, engine, subscriptions):
    _subscribe(client, subscriptions)
    client.get(f"/preferences?assertion={_assertion('user-42')}")
    before = _snapshot(engine)
    refused = client.post("/preferences/link", data={"action": "link"})
    assert refused.status_code == 400
    forged = client.post("/preferences/link", data={"action": "link", "csrf_token": "x" * 40})
    assert forged.status_code == 400
    assert _snapshot(engine) == before


def test_cancelling_links_nothing(linking, client, engine, subscriptions):
    _subscribe(client, subscriptions)
    client.get(f"/preferences?assertion={_assertion('user-42')}")
    page = client.get("/preferences/link")
    before = _snapshot(engine)
    cancelled = client.post(
        "/preferences/link", data={"csrf_token": csrf_token(page.text), "action": "cancel"}
    )
    assert cancelled.status_code == 303
    assert "Nothing was linked." in client.get("/preferences").text
    assert _snapshot(engine) == before
    # The pending link is gone: confirming after cancelling links nothing.
    late = client.post("/preferences/link", data={"csrf_token": csrf_token(page.text)})
    assert late.status_code == 303
    assert _snapshot(engine) == before
    assert client.get("/preferences/link").status_code == 303  # nothing left to confirm


def test_an_attackers_link_in_a_victims_browser_links_nothing_without_their_click(
    linking, client, engine, subscriptions
):
    victim_device = _subscribe(client, subscriptions)
    attacker = linking.test_client()
    assert confirm_account_link(attacker, _assertion("attacker-account")).status_code == 303
    before = _snapshot(engine)
    # The attacker's own, valid link, sent to the victim (an e-mail, a page that navigates).
    opened = client.get(f"/preferences?assertion={_assertion('attacker-account')}")
    assert opened.status_code == 303
    page = client.get("/preferences/link")
    assert "attacker-account" in page.text  # the victim is shown whose account it is
    # A cross-site form cannot carry the victim's CSRF token.
    assert client.post("/preferences/link", data={"action": "link"}).status_code == 400
    assert _snapshot(engine) == before
    with engine.connect() as conn:
        owner = conn.execute(
            sa.text(
                "SELECT s.external_user_id FROM push_subscription p "
                "JOIN subscriber s ON s.id = p.subscriber_id WHERE p.endpoint = :e"
            ),
            {"e": victim_device.endpoint},
        ).scalar_one()
    assert owner is None  # the victim's device still belongs to the victim alone
    with engine.connect() as conn:
        collected = conn.execute(
            sa.text(
                "SELECT count(*) FROM push_subscription p JOIN subscriber s"
                " ON s.id = p.subscriber_id WHERE s.external_user_id = 'attacker-account'"
            )
        ).scalar_one()
    assert collected == 0


def test_an_invalid_link_asks_nothing_and_writes_nothing(linking, client, engine, subscriptions):
    _subscribe(client, subscriptions)
    before = _snapshot(engine)
    forged = sign_assertion({"sub": "user-42", "exp": time.time() + 60}, "wrong-secret")
    refused = client.get(f"/preferences?assertion={forged}")
    assert refused.status_code == 400
    assert "not valid" in refused.text
    expired = sign_assertion({"sub": "user-42", "exp": time.time() - 1}, SECRET)
    assert client.get(f"/preferences?assertion={expired}").status_code == 400
    assert client.get("/preferences/link").status_code == 303  # nothing pending
    assert _snapshot(engine) == before


def test_a_link_to_the_account_already_here_asks_nothing(linking, client, engine, subscriptions):
    _subscribe(client, subscriptions)
    assert confirm_account_link(client, _assertion("user-42")).status_code == 303
    before = _snapshot(engine)
    opened = client.get(f"/preferences?assertion={_assertion('user-42')}")
    assert opened.status_code == 303
    assert opened.headers["Location"] == "/preferences"
    assert _snapshot(engine) == before


def test_a_pending_link_expires(linking, client, engine, subscriptions, monkeypatch):
    _subscribe(client, subscriptions)
    client.get(f"/preferences?assertion={_assertion('user-42')}")
    page = client.get("/preferences/link")
    before = _snapshot(engine)
    later = time.time() + 11 * 60
    monkeypatch.setattr("portal.consent.views.time.time", lambda: later)
    late = client.post(
        "/preferences/link", data={"csrf_token": csrf_token(page.text), "action": "link"}
    )
    assert late.status_code == 303
    assert _snapshot(engine) == before


def test_an_old_link_to_a_browser_identity_merged_into_an_account_is_no_longer_valid(
    app, linking, client, engine, subscriptions
):
    """The host product sent the phone a link to its anonymous identity; the phone then
    joined the person's account, which took its device and choices. The old link neither
    shows, saves nor "erases" the identity left behind, which governs no device: it is
    refused as an erased person's is, and a visit it began ends; the account's own
    preference centre goes on."""
    from portal.identity import preference_link_token

    _subscribe(client, subscriptions)
    with engine.connect() as conn:
        (phone,) = conn.execute(sa.text("SELECT id FROM subscriber")).scalars()
    with app.test_request_context():
        old_link = preference_link_token(phone)
    other = app.test_client()
    assert other.get(f"/preferences?token={old_link}").status_code == 303  # a visit begins
    assert confirm_account_link(app.test_client(), _assertion("user-42")).status_code == 303
    assert confirm_account_link(client, _assertion("user-42")).status_code == 303
    before = _snapshot(engine)
    during = other.get("/preferences")
    assert 'name="topics"' not in during.text  # the visit that began ended with the merge
    assert 'name="confirm"' not in other.get("/preferences/erase").text  # nothing to erase
    again = app.test_client().get(f"/preferences?token={old_link}")
    assert again.status_code == 400
    assert "This link is no longer valid." in again.text
    assert _snapshot(engine) == before
    mine = client.get("/preferences")
    assert mine.status_code == 200 and 'name="topics"' in mine.text
