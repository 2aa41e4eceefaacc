"""The preference centre without JavaScript: identity, round trip, one-click actions."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace

import pytest
import sqlalchemy as sa

from portal import ratelimit
from portal.db import db, uuid7
from portal.identity import preference_link_token, sign_assertion
from portal.seams import current_portal
from portal.subscriptions.models import Subscriber
from tests.helpers import (
    all_rows,
    confirm_account_link,
    count_rows,
    csrf_token,
    save_choices,
    sent_statements,
    stored_preferences,
)


def test_a_visitor_without_identity_gets_an_explanation(client, catalogue_ready):
    page = client.get("/preferences")
    assert page.status_code == 200
    assert "We do not know who you are on this browser yet" in page.text
    assert 'href="/"' in page.text


@pytest.mark.parametrize(
    ("zone", "day", "said"),
    [
        # 19:00 UTC on 1 January is already 2 January on Kiritimati (UTC+14).
        ("Pacific/Kiritimati", "02 January 2026", "Times are in your time zone, Pacific/Kiritimati"),
        ("America/Los_Angeles", "01 January 2026", "Times are in your time zone, America/Los_Angeles"),
        (None, "01 January 2026", "Your browser has not told us your time zone"),
    ],
)  # fmt: skip
def test_the_days_the_centre_gives_are_the_persons_own(
    client, clock, subscriptions, catalogue_ready, zone, day, said
):
    """The page says its times are the person's: so are its days (the day they decided,
    the day a device started, the notice's day), not UTC's."""
    clock.set(clock.now().replace(hour=19))
    body = {"subscription": subscriptions().to_json(), "topics": ["offers"]}
    body |= {"policyVersion": "v1"} | ({"timeZone": zone} if zone else {})
    assert client.post("/api/push/subscribe", json=body).status_code == 201
    html = client.get("/preferences").text
    assert said in html
    assert f"On: you chose this on {day}, under notice version v1." in html
    assert f'<td data-label="Since">{day}</td>' in html


def test_round_trip_load_change_save_banner(client, engine, subscribed):
    page = client.get("/preferences")
    assert page.status_code == 200
    html = page.text
    # The title is the page's name and nothing else (no markup from the page's body).
    assert "<title>Your notification choices – Push consent portal</title>" in html
    assert "<legend>Your account</legend>" in html
    assert "<legend>News</legend>" in html
    assert 'id="topic-security-alerts"' in html
    assert "On by default for account messages, because you allowed notifications." in html
    assert "Off until you turn it on" in html
    assert "We send what you choose." in html  # the policy text itself
    assert 'name="policy_version" value="v1"' in html

    # Everything visible is submitted; only the ticked ones are on.
    saved = client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(html),
            "policy_version": "v1",
            "visible": ["security-alerts", "order-updates", "weekly-digest", "offers"],
            "topics": ["security-alerts", "offers"],
        },
    )
    assert saved.status_code == 303
    after = client.get(saved.headers["Location"])
    assert "Your choices are saved." in after.text
    assert "data-focus-on-load" in after.text
    assert 'role="status"' in after.text
    # security-alerts was ticked by default and saved untouched: it stays unset, never
    # turned into an opt-in nobody made. weekly-digest was shown off (an unknown region
    # gets no marketing default) and left off: unset too.
    assert stored_preferences(engine) == {"offers": "opt_in"}
    assert "On: you chose this on" in after.text


def test_unticking_a_default_on_topic_is_an_explicit_opt_out(client, engine, subscribed):
    html = client.get("/preferences").text
    client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(html),
            "policy_version": "v1",
            "visible": ["security-alerts"],
            "topics": [],
        },
    )
    assert stored_preferences(engine) == {"security-alerts": "opt_out"}
    with engine.connect() as conn:
        event = conn.execute(
            sa.text(
                "SELECT kind, previous_state, new_state, source, policy_version, context FROM consent_event WHERE kind = 'preference_changed'"
            )
        ).one()
    assert event[:5] == ("preference_changed", "unset", "opt_out", "preference-centre", "v1")
    assert '"screen":"preference-centre"' in event[5]


def test_post_without_csrf_token_is_refused(client, engine, subscribed):
    response = client.post(
        "/preferences", data={"policy_version": "v1", "visible": ["offers"], "topics": ["offers"]}
    )
    assert response.status_code == 400
    assert stored_preferences(engine) == {}
    for path in ("/preferences/marketing-off", "/preferences/stop-device"):
        assert client.post(path).status_code == 400


def test_a_stale_policy_asks_for_confirmation_and_keeps_the_choices(
    app, client, engine, subscribed, clock, tmp_path
):
    html = client.get("/preferences").text
    notice = tmp_path / "v2.txt"
    notice.write_text("We send what you choose, and now weekly.")
    assert (
        app.test_cli_runner()
        .invoke(args=["portal", "policy", "publish", "v2", "--file", str(notice)])
        .exit_code
        == 0
    )
    response = client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(html),
            "policy_version": "v1",
            "visible": ["offers"],
            "topics": ["offers"],
        },
    )
    assert response.status_code == 409
    page = response.text
    assert "<title>Error: Your notification choices – Push consent portal</title>" in page
    assert 'class="error-summary"' in page
    assert 'href="#policy-ack"' in page
    assert 'id="policy-ack"' in page
    assert "and now weekly" in page
    assert re.search(r'id="topic-offers"[^>]*\bchecked\b', page)  # what they ticked is kept
    assert stored_preferences(engine) == {}
    # Saving again without ticking the confirmation: still an error.
    again = client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(page),
            "policy_version": "v2",
            "ack_required": "1",
            "visible": ["offers"],
            "topics": ["offers"],
        },
    )
    assert again.status_code == 400
    assert stored_preferences(engine) == {}
    confirmed = client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(page),
            "policy_version": "v2",
            "ack_required": "1",
            "policy_ack": "1",
            "visible": ["offers"],
            "topics": ["offers"],
        },
    )
    assert confirmed.status_code == 303
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT policy_version FROM topic_preference")).scalar_one()
            == "v2"
        )


def test_turn_off_all_marketing_in_one_click(client, engine, subscribed):
    html = client.get("/preferences").text
    save_choices(
        client, html, visible=["offers", "weekly-digest"], topics=["offers", "weekly-digest"]
    )
    response = client.post("/preferences/marketing-off", data={"csrf_token": csrf_token(html)})
    assert response.status_code == 303
    assert "All marketing notifications are off" in client.get("/preferences").text
    assert stored_preferences(engine) == {
        "offers": "opt_out",
        "weekly-digest": "opt_out",
    }  # account topics untouched


def test_stop_notifications_on_this_device_in_one_click(client, engine, subscribed):
    html = client.get("/preferences").text
    assert "(this device)" in html
    response = client.post("/preferences/stop-device", data={"csrf_token": csrf_token(html)})
    assert response.status_code == 303
    (row,) = all_rows(engine, "push_subscription")
    assert row["state"] == "revoked"
    assert row["end_reason"] == "unsubscribed"
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.text("SELECT count(*) FROM consent_event WHERE kind = 'unsubscribed'")
            ).scalar_one()
            == 1
        )
    heartbeat = client.post("/api/push/heartbeat", json={"endpoint": subscribed.endpoint})
    assert heartbeat.json["action"] == "unsubscribe"


def test_link_token_identifies_and_expires(app, client, engine, subscribed, clock):
    with engine.connect() as conn:
        subscriber_id = conn.execute(sa.text("SELECT id FROM subscriber")).scalar_one()
    import uuid

    with app.test_request_context():
        token = preference_link_token(
            uuid.UUID(str(subscriber_id))
            if not isinstance(subscriber_id, uuid.UUID)
            else subscriber_id
        )
    other_browser = app.test_client()
    assert "We do not know who you are" in other_browser.get("/preferences").text
    opened = other_browser.get(f"/preferences?token={token}")
    assert opened.status_code == 303
    assert opened.headers["Location"] == "/preferences"  # the token leaves the address bar
    assert "topic-offers" in other_browser.get("/preferences").text

    forged = app.test_client().get(f"/preferences?token={token[:-2]}xx")
    assert forged.status_code == 400
    assert "This link is not valid." in forged.text

    current_portal(app).settings = current_portal(app).settings.with_overrides(
        preference_link_max_age=0
    )
    time.sleep(1.1)
    expired = app.test_client().get(f"/preferences?token={token}")
    assert expired.status_code == 400
    assert "expired" in expired.text


def test_a_preference_link_opened_in_another_browser_never_makes_it_that_persons(
    app, engine, subscribed, subscriptions
):
    """Whoever sends a link chooses its person: opened in someone else's browser it shows
    that person's choices for the visit, but the browser stays its own. A device the
    victim subscribes there afterwards joins the victim, never the link's person."""
    with engine.connect() as conn:
        (sender,) = conn.execute(sa.text("SELECT id FROM subscriber")).scalars()
    with app.test_request_context():
        token = preference_link_token(sender)
    victim = app.test_client()
    opened = victim.get(f"/preferences?token={token}")
    assert opened.status_code == 303
    assert victim.get_cookie("portal_subscriber") is None
    assert "topic-offers" in victim.get("/preferences").text  # the visit shows the link's

    phone = subscriptions()
    subscribed_here = victim.post("/api/push/subscribe", json={"subscription": phone.to_json()})
    assert subscribed_here.status_code == 201
    (row,) = [r for r in all_rows(engine, "push_subscription") if r["endpoint"] == phone.endpoint]
    assert str(row["subscriber_id"]) != str(sender)
    assert count_rows(engine, "subscriber") == 2


def test_a_preference_link_visit_ends_with_the_browsers_session(app, engine, subscribed):
    with engine.connect() as conn:
        (person,) = conn.execute(sa.text("SELECT id FROM subscriber")).scalars()
    with app.test_request_context():
        token = preference_link_token(person)
    browser = app.test_client()
    browser.get(f"/preferences?token={token}")
    assert "topic-offers" in browser.get("/preferences").text
    browser.delete_cookie("session")  # the browser closed: session cookies are gone
    assert "We do not know who you are" in browser.get("/preferences").text


def test_only_a_link_visit_asks_whether_the_person_has_a_device_and_with_them(
    app, client, engine, subscribed
):
    """A preference link's visit asks whether its person still has a device (an identity
    whose devices moved to an account is no longer the link's to manage) in the statement
    that reads the person; the browser's own subscriber is never asked it."""
    devices = re.compile(r"(?s).*EXISTS \(SELECT \*\s+FROM push_subscription")

    def page_statements(browser) -> list[str]:
        with sent_statements(engine) as sent:
            assert "topic-offers" in browser.get("/preferences").text
        return [statement for statement, _ in sent if devices.match(statement)]

    assert page_statements(client) == []
    with engine.connect() as conn:
        (person,) = conn.execute(sa.text("SELECT id FROM subscriber")).scalars()
    with app.test_request_context():
        token = preference_link_token(person)
    visitor = app.test_client()
    assert visitor.get(f"/preferences?token={token}").status_code == 303
    (asked,) = page_statements(visitor)
    assert "FROM subscriber" in asked and "EXISTS" in asked


def test_identity_assertion_links_the_account_and_merges_device_preferences(
    app, client, engine, subscribed, clock
):
    secret = "host-product-secret"
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        identity_assertion_secrets=(secret,)
    )
    html = client.get("/preferences").text
    client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(html),
            "policy_version": "v1",
            "visible": ["offers"],
            "topics": ["offers"],
        },
    )

    # The account already exists from another device, with an older decision on offers.
    laptop = app.test_client()
    first = sign_assertion({"sub": "user-42", "exp": time.time() + 60, "region": "DE"}, secret)
    assert confirm_account_link(laptop, first).status_code == 303

    phone_link = sign_assertion({"sub": "user-42", "exp": time.time() + 60}, secret)
    response = confirm_account_link(client, phone_link)
    assert response.status_code == 303
    with engine.connect() as conn:
        account = conn.execute(
            sa.text("SELECT id, region_code FROM subscriber WHERE external_user_id = 'user-42'")
        ).one()
        owners = set(conn.execute(sa.text("SELECT subscriber_id FROM push_subscription")).scalars())
        linked = conn.execute(
            sa.text("SELECT count(*) FROM consent_event WHERE kind = 'account_linked'")
        ).scalar_one()
        merged = conn.execute(
            sa.text(
                "SELECT state, source FROM topic_preference p JOIN topic t ON t.id = p.topic_id WHERE t.slug = 'offers' AND p.subscriber_id = :a"
            ),
            {"a": account.id},
        ).one()
    assert account.region_code == "EU"
    assert owners == {account.id}  # the phone's subscription now belongs to the account
    assert linked == 2
    assert tuple(merged) == ("opt_in", "account-link")
    # Both browsers now show the account's choices.
    assert "On: you chose this on" in laptop.get("/preferences").text

    expired = sign_assertion({"sub": "user-42", "exp": time.time() - 1}, secret)
    assert app.test_client().get(f"/preferences?assertion={expired}").status_code == 400
    forged = sign_assertion({"sub": "user-42", "exp": time.time() + 60}, "wrong-secret")
    refused = app.test_client().get(f"/preferences?assertion={forged}")
    assert refused.status_code == 400
    assert "not valid" in refused.text
    assert count_rows(engine, "subscriber") == 2  # the phone's anonymous subscriber remains, empty


def test_policy_page_shows_the_exact_text(client, catalogue_ready):
    page = client.get("/policy/v1")
    assert page.status_code == 200
    assert "We send what you choose." in page.text
    assert client.get("/policy/nope").status_code == 404


def _topic_block(html: str, slug: str) -> str:
    """The markup of one topic's control, from its checkbox to its explanation."""
    match = re.search(
        rf'<input[^>]*id="topic-{slug}".*?<p class="choice__state" id="topic-{slug}-state">(.*?)</p>',
        html,
        re.S,
    )
    assert match, f"no control for {slug}"
    return match.group(0)


@pytest.mark.parametrize(
    ("region", "on", "explanation"),
    [
        ("US", True, "On by default where you live. Turn it off if you do not want it."),
        ("EU", False, "Off until you turn it on: we only send these with your agreement."),
        ("UK", False, "Off until you turn it on: we only send these with your agreement."),
        ("CA", False, "Off until you turn it on: we only send these with your agreement."),
    ],
)
def test_each_topic_explains_its_state_for_the_region(
    client, engine, subscribed, region, on, explanation
):
    """weekly-digest is marketing with an opt_in default: only some regions get it on."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subscriber SET region_code = :r"), {"r": region})
    html = client.get("/preferences").text
    digest = _topic_block(html, "weekly-digest")
    assert explanation in digest
    assert (" checked" in digest.split(">", 1)[0]) is on
    # Account messages rest on the permission grant wherever one lives.
    security = _topic_block(html, "security-alerts")
    assert "On by default for account messages, because you allowed notifications." in security
    assert "Off until you turn it on." in _topic_block(html, "offers")

    # Saved untouched: nothing recorded. Unticked where it was on: an explicit opt_out.
    client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(html),
            "policy_version": "v1",
            "visible": ["weekly-digest"],
            "topics": [],
        },
    )
    after = _topic_block(client.get("/preferences").text, "weekly-digest")
    if on:
        assert stored_preferences(engine) == {"weekly-digest": "opt_out"}
        assert "Off: you said no to this on 01 January 2026, under notice version v1." in after
    else:
        assert stored_preferences(engine) == {}
        assert explanation in after


@pytest.mark.postgres_only
def test_a_save_locks_the_person_then_reads_their_choices_once(client, engine, subscribed):
    """The form's save takes the person's row lock before it reads their choices, so the
    read it shows the decisions against is the one they start from: one read, not a read
    for the page and another under the lock. The lock comes in one statement with the
    save's rate-limit count (RATE_LIMIT_SAVES); then one INSERT of the events and one
    upsert of the rows: five statements."""
    html = client.get("/preferences").text
    chosen = ["offers", "order-updates"]
    with sent_statements(engine) as sent:
        saved = save_choices(client, html, visible=chosen, topics=chosen)
    assert saved.status_code == 303
    shapes = [" ".join(statement.split())[:60] for statement, _ in sent]
    first = " ".join(sent[0][0].split())
    assert first.startswith("WITH counted AS (INSERT INTO rate_limit_counter")
    assert "SELECT subscriber.id FROM subscriber" in first and first.endswith(
        "FOR UPDATE) AS locked ON true"
    )
    assert "topic_preference" in sent[1][0] and "FROM subscriber" in sent[1][0]
    reads = [s for s, _ in sent if s.lstrip().startswith("SELECT") and "topic_preference" in s]
    assert len(reads) == 1
    assert [s.split(" (")[0] for s in shapes if s.startswith("INSERT")] == [
        "INSERT INTO consent_event",
        "INSERT INTO topic_preference",
    ]
    assert len(sent) == 5
    assert stored_preferences(engine) == {"offers": "opt_in", "order-updates": "opt_in"}


@pytest.mark.postgres_only
def test_saves_of_one_person_from_many_browsers_at_once_keep_one_chain(
    app, client, engine, subscribed
):
    """Twelve of one person's browsers save the form at the same moment, each ticking a
    different set: every event starts from the state the one before it left (previous
    state = the last new state), nothing is recorded twice, and the stored choices are
    the fold of the events."""
    html = client.get("/preferences").text
    person = client.get_cookie("portal_subscriber")
    assert person is not None
    browsers = []
    for _ in range(12):
        browser = app.test_client()
        browser.set_cookie("portal_subscriber", person.value)
        browsers.append((browser, browser.get("/preferences").text))
    barrier = threading.Barrier(len(browsers))
    answers: list[int] = []
    failures: list[BaseException] = []

    def save(index: int) -> None:
        browser, page = browsers[index]
        ticked = [["offers"], ["weekly-digest"], ["offers", "weekly-digest"], []][index % 4]
        barrier.wait()
        try:
            answer = save_choices(browser, page, visible=["offers", "weekly-digest"], topics=ticked)
            answers.append(answer.status_code)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(len(browsers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and answers == [303] * len(browsers)
    assert html  # the first browser's page was read before the others saved
    with engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT t.slug, e.previous_state, e.new_state FROM consent_event e "
                "JOIN topic t ON t.id = e.topic_id WHERE e.kind = 'preference_changed' "
                "ORDER BY e.seq"
            )
        ).all()
    folded: dict[str, str] = {}
    for slug, previous, new in events:
        assert folded.get(slug, "unset") == previous, events
        assert previous != new
        folded[slug] = new
    assert events and folded == {
        slug: state for slug, state in stored_preferences(engine).items() if slug in folded
    }


FORM_SAVES = [
    ("/preferences", {"policy_version": "v1", "visible": ["offers"], "topics": ["offers"]}),
    ("/preferences", {"policy_version": "v1", "visible": ["offers"]}),
    ("/preferences/marketing-off", {}),
    ("/preferences/frequency", {"how_often": "one-a-day"}),
    ("/preferences/frequency", {"how_often": "as-sent"}),
]


@pytest.mark.parametrize("path", sorted({path for path, _ in FORM_SAVES}))
def test_form_saves_are_rate_limited_per_person_and_a_refusal_changes_nothing(
    app, client, engine, subscribed, subscriptions, clock, path
):
    """Every form save may append consent events, which are kept for good, and the forms
    had no limit at all (the JSON API had): past RATE_LIMIT_SAVES a window a person's
    save gets 429, a page saying nothing changed and when to save again, and writes no
    event; another person saves on; the next window lets them save again."""
    portal = current_portal(app)
    limits = replace(portal.settings.rate_limit, saves=3, window_seconds=60)
    portal.settings = replace(portal.settings, rate_limit=limits)
    forms = [data for form_path, data in FORM_SAVES if form_path == path]

    def post(browser, turn):
        html = browser.get("/preferences").text
        data = {"csrf_token": csrf_token(html), **forms[turn % len(forms)]}
        return browser.post(path, data=data)

    assert [post(client, turn).status_code for turn in range(3)] == [303, 303, 303]
    events = count_rows(engine, "consent_event")
    refused = post(client, 3)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "60"
    assert refused.headers["Cache-Control"] == "no-store"
    assert "Too many changes at once" in refused.text
    assert "nothing was changed this time" in refused.text
    assert count_rows(engine, "consent_event") == events
    assert post(client, 4).status_code == 429  # still refused, still nothing written
    assert count_rows(engine, "consent_event") == events

    other = app.test_client()
    answer = other.post("/api/push/subscribe", json={"subscription": subscriptions().to_json()})
    assert answer.status_code == 201
    assert post(other, 0).status_code == 303  # one person's loop is never another's

    clock.advance(seconds=60)
    assert post(client, 3).status_code == 303


def test_a_form_save_s_count_commits_with_the_save(app, client, engine, subscribed):
    """The count joins the save's own transaction: a save is one write transaction, and
    its count is there once it commits. A save refused for its input counts nothing (it
    changed nothing)."""
    portal = current_portal(app)
    portal.settings = replace(
        portal.settings, rate_limit=replace(portal.settings.rate_limit, saves=60)
    )
    refused = client.post(
        "/preferences/frequency", data={"csrf_token": csrf_token(client.get("/preferences").text)}
    )
    assert refused.status_code == 400
    assert count_rows(engine, "rate_limit_counter") == 0
    html = client.get("/preferences").text
    commits = []

    def committed(connection):
        commits.append(connection)

    sa.event.listen(engine, "commit", committed)
    try:
        with sent_statements(engine) as seen:
            saved = save_choices(client, html, visible=["offers"], topics=["offers"])
    finally:
        sa.event.remove(engine, "commit", committed)
    assert saved.status_code == 303
    writes = [s for s, _ in seen if s.lstrip().upper().startswith(("INSERT", "UPDATE", "WITH"))]
    assert any("INSERT INTO rate_limit_counter" in s for s in writes), writes
    assert len(commits) == 1


@pytest.mark.postgres_only
def test_a_save_s_count_and_the_person_s_lock_are_one_round_trip(app, engine, subscribed):
    """``ratelimit.count_save_and_lock``: the count comes back whether or not the person is
    still there (the lock is joined to the count, not the count to the lock), the lock is
    held to the end of the transaction, and the count goes with a rollback."""
    portal = current_portal(app)
    portal.settings = replace(
        portal.settings, rate_limit=replace(portal.settings.rate_limit, saves=60)
    )
    with engine.connect() as connection:
        who = connection.execute(sa.select(Subscriber.id)).scalar_one()
    locked = sa.select(Subscriber.id).where(Subscriber.id == who).with_for_update(nowait=True)
    with app.test_request_context("/preferences", method="POST"):
        with sent_statements(engine) as sent:
            verdict = ratelimit.count_save_and_lock(who)
        assert len(sent) == 1
        assert verdict is not None and (verdict.hits, verdict.limit) == (1, 60)
        with engine.connect() as other, pytest.raises(sa.exc.OperationalError):
            other.execute(locked)  # the person's row is held by the save's transaction
        assert ratelimit.count_save_and_lock(who).hits == 2  # type: ignore[union-attr]
        db.session.rollback()
        with engine.connect() as other:
            assert other.execute(locked).scalar_one() == who  # free again
        assert count_rows(engine, "rate_limit_counter") == 0  # the counts went with it
        nobody = ratelimit.count_save_and_lock(uuid7())
        assert nobody is not None and nobody.hits == 1
        db.session.commit()
    assert count_rows(engine, "rate_limit_counter") == 1
