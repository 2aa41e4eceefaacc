"""Erasure (GDPR Art. 17): nothing of the person left, the log still proves consent."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa

from portal.identity import sign_assertion
from portal.seams import current_portal
from tests.helpers import all_rows, confirm_account_link, count_rows, csrf_token

UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/140.0.0.0 Safari/537.36 Unique/7f3a"


def _dump_everything(engine) -> bytes:
    """Every row of every table, as bytes: what a scan for personal data would read."""
    chunks = []
    with engine.connect() as conn:
        for table in sa.inspect(engine).get_table_names():
            for row in conn.execute(sa.text(f"SELECT * FROM {table}")):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        chunks.append(bytes(value))
                    elif value is not None:
                        chunks.append(str(value).encode())
    return b"\n".join(chunks)


def test_erasure_leaves_nothing_of_the_person_and_the_log_still_verifies(
    app, engine, subscriptions, catalogue_ready
):
    secret = "host-secret"
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        identity_assertion_secrets=(secret,)
    )
    browser = app.test_client()
    phone, laptop = subscriptions(), subscriptions("autopush")
    devices = {}  # each subscription's device cookie, as its own browser keeps it
    for sub in (phone, laptop):
        browser.post(
            "/api/push/subscribe",
            json={
                "subscription": sub.to_json(),
                "topics": ["weekly-digest"],
                "policyVersion": "v1",
                "timeZone": "America/St_Johns",  # where the person is
            },
            headers={"User-Agent": UA, "Accept-Language": "fr-CA"},
        )
        devices[sub.endpoint] = browser.get_cookie("portal_device").value
    linked = confirm_account_link(
        browser, sign_assertion({"sub": "customer-8812", "exp": time.time() + 60}, secret)
    )
    assert linked.status_code == 303
    before = _dump_everything(engine)
    sealed = [bytes(r["auth_sealed"]) for r in all_rows(engine, "push_subscription")]
    # Every needle the scan looks for afterwards is really there before: the scan can see it.
    for sub in (phone, laptop):
        assert sub.endpoint.encode() in before
        assert sub.p256dh.encode() in before
    assert len(sealed) == 2 and all(blob in before for blob in sealed)
    assert UA.encode() in before
    assert b"customer-8812" in before
    assert b"fr-CA" in before
    assert b"America/St_Johns" in before

    page = browser.get("/preferences/erase")
    assert page.status_code == 200
    unconfirmed = browser.post("/preferences/erase", data={"csrf_token": csrf_token(page.text)})
    assert unconfirmed.status_code == 400
    assert "<title>Error: Erase your data" in unconfirmed.text
    assert 'href="#erase-confirm"' in unconfirmed.text
    assert count_rows(engine, "topic_preference") > 0  # nothing happened yet

    done = browser.post(
        "/preferences/erase", data={"csrf_token": csrf_token(page.text), "confirm": "yes"}
    )
    assert (done.status_code, done.headers["Location"]) == (303, "/preferences/erased")
    shown = browser.get("/preferences/erased")
    assert "Your data is erased" in shown.text
    assert "Download your receipt" in shown.text
    assert browser.get("/preferences/erased").text == shown.text  # a reload shows it again
    cleared = [c for c in done.headers.getlist("Set-Cookie") if "Expires=Thu, 01 Jan 1970" in c]
    # The device cookie stays: it names only the tombstone, and proves it is this browser's.
    assert {c.split("=")[0] for c in cleared} == {"portal_subscriber"}

    after = _dump_everything(engine)
    for sub in (phone, laptop):
        for needle in (sub.endpoint.encode(), sub.p256dh.encode(), sub.auth_b64.encode(), sub.auth):
            assert needle not in after
    for blob in sealed:  # the stored keys themselves, sealed as they were
        assert blob not in after
    assert UA.encode() not in after
    assert b"Unique/7f3a" not in after
    assert b"customer-8812" not in after
    assert b"fr-CA" not in after
    assert b"America/St_Johns" not in after
    assert count_rows(engine, "topic_preference") == 0

    with engine.connect() as conn:
        kinds = [r[0] for r in conn.execute(sa.text("SELECT kind FROM consent_event ORDER BY seq"))]
        subs = conn.execute(
            sa.text("SELECT state, end_reason, deleted_at FROM push_subscription")
        ).all()
    assert kinds[0] == "permission_granted"  # consent existed...
    assert "preference_changed" in kinds
    assert kinds[-1] == "erased"  # ...and ended
    assert all(
        s.state == "revoked" and s.end_reason == "erased" and s.deleted_at is not None for s in subs
    )
    assert app.test_cli_runner().invoke(args=["portal", "verify-log"]).exit_code == 0

    # Each browser is told to unsubscribe at its next heartbeat: its device cookie
    # proves the tombstone is its own.
    for sub in (phone, laptop):
        device = app.test_client()
        device.set_cookie("portal_device", devices[sub.endpoint])
        beat = device.post("/api/push/heartbeat", json={"endpoint": sub.endpoint})
        assert beat.json == {"state": "revoked", "action": "unsubscribe"}
    # The receipt downloads and names the erasure event.
    link = shown.text.split('href="/preferences/erasure-receipt/')[1].split('"')[0]
    receipt = app.test_client().get(f"/preferences/erasure-receipt/{link}")
    assert receipt.headers["Content-Disposition"].startswith("attachment")
    body = json.loads(receipt.data)
    assert body["consentEventSeq"] == len(kinds)
    assert body["subscriptionsEnded"] == 2
    assert app.test_client().get("/preferences/erasure-receipt/forged.token").status_code == 404


def test_re_registration_after_erasure_starts_afresh(app, engine, subscriptions, catalogue_ready):
    browser = app.test_client()
    sub = subscriptions()
    browser.post(
        "/api/push/subscribe",
        json={"subscription": sub.to_json(), "topics": ["offers"], "policyVersion": "v1"},
    )
    page = browser.get("/preferences/erase")
    browser.post("/preferences/erase", data={"csrf_token": csrf_token(page.text), "confirm": "yes"})
    with engine.connect() as conn:
        erased_id = conn.execute(sa.text("SELECT id FROM subscriber")).scalar_one()
    again = browser.post("/api/push/subscribe", json={"subscription": sub.to_json()})
    assert again.status_code == 200
    with engine.connect() as conn:
        owner = conn.execute(sa.text("SELECT subscriber_id FROM push_subscription")).scalar_one()
        prefs = conn.execute(
            sa.text("SELECT count(*) FROM topic_preference WHERE subscriber_id = :s"), {"s": owner}
        ).scalar_one()
    assert owner != erased_id
    assert prefs == 0  # nothing inherited
    assert "topic-offers" in browser.get("/preferences").text
