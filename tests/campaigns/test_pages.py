"""Review, launch, the campaign page and its controls, progress, circuits and the outcome."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
import sqlalchemy as sa

from portal.campaigns import services
from portal.campaigns.models import Campaign, CircuitState
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery.models import Delivery
from portal.staff.models import Role, StaffAudit
from tests.campaigns.conftest import form_data, set_region
from tests.factories import SubscriptionFactory


def subscribe(app, *, region=None, topics=None, client=None):
    sub = SubscriptionFactory()()
    body = {"subscription": sub.to_json()}
    if topics is not None:
        body |= {"topics": topics, "policyVersion": "v1"}
    response = (client or app.test_client()).post("/api/push/subscribe", json=body)
    assert response.status_code == 201, response.json
    if region:
        set_region(app, sub.endpoint, region)
    return sub


def launch_via_form(person, **fields):
    review = person.post("/staff/campaigns/new", {**form_data(**fields), "action": "review"})
    assert review.status_code == 200, review.text
    campaign_id = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review.text).group(1)
    response = person.post(
        "/staff/campaigns/new",
        {**form_data(**fields), "campaign_id": campaign_id, "action": "launch"},
    )
    assert response.status_code == 303, response.text
    return uuid.UUID(campaign_id), response


def make_campaign(app, clock, **fields):
    with db.begin(app) as session:
        draft = CampaignDraft(
            **{"topic": "weekly-digest", "title": "Digest", "body": "News", **fields}
        )
        return services.create_campaign(session, draft, created_by="x", now=clock.now()).id


def audit_rows(app, action):
    with db.begin(app) as session:
        return [
            (row.actor_email, row.target, row.detail)
            for row in session.scalars(
                sa.select(StaffAudit).where(StaffAudit.action == action).order_by(StaffAudit.id)
            )
        ]


def campaign(app, campaign_id) -> Campaign:
    with db.begin(app) as session:
        found = session.get(Campaign, campaign_id)
        session.expunge(found)
        return found


def test_the_review_step_shows_the_audience_consent_allows(campaigner, catalogue_ready):
    app = catalogue_ready
    subscribe(app, region="US")  # the marketing default applies
    subscribe(app, region="US")
    subscribe(app, region="EU")  # the default does not apply in the EU
    subscribe(app, region="EU", topics=["weekly-digest"])  # opted in
    subscribe(app, region="US", topics=[])  # opted out
    response = campaigner.post("/staff/campaigns/new", {**form_data(), "action": "review"})
    assert response.status_code == 200
    html = response.text
    assert "<h1>Check your campaign before you launch it</h1>" in html
    assert "<strong>3</strong> subscriptions may get this campaign on <strong>Weekly Digest" in html
    rows = {
        label: int(count)
        for label, count in re.findall(
            r'<th scope="row">([^<]+?) <span class="hint table-hint">[^<]*</span></th>\s*'
            r'<td class="numeric">(\d+)</td>',
            html,
        )
    }
    assert rows == {"Opted in": 1, "Transactional grant": 0, "Region default": 2}
    assert "<caption>Audience by the reason consent allows it</caption>" in html
    # Preview, settings, launch, and the draft carried in hidden fields.
    assert 'id="preview-title">Monday digest</p>' in html
    assert "86400 seconds (1 day)" in html
    assert 'name="action" value="launch"' in html
    assert '<input type="hidden" name="title" value="Monday digest">' in html

    transactional = campaigner.post(
        "/staff/campaigns/new", {**form_data(topic="security-alerts"), "action": "review"}
    ).text
    assert "<strong>5</strong> subscriptions" in transactional  # every browser's grant


def test_a_costly_audience_count_is_kept_for_a_while_and_the_pages_say_when(
    campaigner, catalogue_ready, clock, monkeypatch
):
    """Among millions of subscribers a topic's count reads them all (seconds): one that
    cost 2 s (a monotonic clock the count moves) is answered again for 20 s, to the review
    page, its test sends and the launch, which say when it was counted; then it is
    counted again. A cheap count is never kept (``right now``)."""
    from portal.campaigns import views
    from portal.campaigns.readings import CostlyReadings
    from tests.campaigns.test_readings import Clock

    app = catalogue_ready
    monotonic = Clock()
    monkeypatch.setattr(views, "_AUDIENCES", CostlyReadings(monotonic))
    counted = views.audience_counts
    counts: list[int] = []

    def costly(session, topic_id):
        monotonic.now += 2.0
        counts.append(topic_id)
        return counted(session, topic_id)

    monkeypatch.setattr(views, "audience_counts", costly)
    subscribe(app, topics=["weekly-digest"])
    first_at = clock.now()
    review = campaigner.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    said = f"may get this campaign on <strong>Weekly Digest</strong> as counted at {first_at:%H:%M:%S} UTC."
    assert "<strong>1</strong> subscription " + said in review
    assert f"Counted at {first_at:%H:%M:%S} UTC: counting everyone takes a while" in review

    subscribe(app, topics=["weekly-digest"])  # one more, after the count
    clock.advance(dt.timedelta(seconds=5))
    monotonic.now += 5
    again = campaigner.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    assert "<strong>1</strong> subscription " + said in again
    launch_via_form(campaigner)
    assert len(counts) == 1  # the review, the review again and the launch: one count
    ((_, _, detail),) = audit_rows(app, "campaign.launched")
    assert (detail["audience"], detail["byReason"]) == (1, {"explicit_opt_in": 1})
    assert detail["audienceCountedAt"] == first_at.isoformat()

    monotonic.now += 20  # the kept count has had its time
    later = campaigner.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    assert len(counts) == 2
    assert (
        f"<strong>2</strong> subscriptions may get this campaign on <strong>Weekly Digest</strong> as counted at {clock.now():%H:%M:%S} UTC."
        in later
    )
    # Another topic is counted on its own.
    other = campaigner.post(
        "/staff/campaigns/new", {**form_data(topic="security-alerts"), "action": "review"}
    ).text
    assert len(counts) == 3 and "<strong>2</strong> subscriptions" in other


def test_launch_creates_the_campaign_and_audits_it(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    subscribe(app, topics=["weekly-digest"])
    campaign_id, response = launch_via_form(
        campaigner, urgency="high", collapse_key="digest", ttl="600", icon="/static/i.png"
    )
    assert response.location.endswith(f"/staff/campaigns/{campaign_id}")
    found = campaign(app, campaign_id)
    assert (found.title, found.body, found.url, found.icon) == (
        "Monday digest",
        "Five things this week",
        "/news",
        "/static/i.png",
    )
    assert (found.urgency, found.ttl, found.collapse_key) == ("high", 600, "digest")
    assert (found.status, found.created_by, found.is_test) == (
        "scheduled",
        "campaigner@example.test",
        False,
    )
    assert found.send_at == clock.now()
    ((actor, target, detail),) = audit_rows(app, "campaign.launched")
    assert (actor, target) == ("campaigner@example.test", f"campaign:{campaign_id}")
    assert detail["topic"] == "weekly-digest"
    assert detail["audience"] == 1
    assert detail["byReason"] == {"explicit_opt_in": 1}
    assert detail["audienceCountedAt"] == clock.now().isoformat()
    page = campaigner.get(response.location)
    assert "Campaign launched: it sends now." in page.text
    assert "<h1>Monday digest</h1>" in page.text


def test_launch_pressed_twice_makes_one_campaign(campaigner, catalogue_ready, engine):
    campaign_id, _ = launch_via_form(campaigner)
    again = campaigner.post(
        "/staff/campaigns/new",
        {**form_data(), "campaign_id": str(campaign_id), "action": "launch"},
    )
    assert again.status_code == 303
    assert again.location.endswith(f"/staff/campaigns/{campaign_id}")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM campaign")).scalar_one() == 1
    assert "launched already" in campaigner.get(again.location).text


def test_launch_never_reuses_someone_elses_campaign_id(campaigner, catalogue_ready, clock):
    theirs = make_campaign(catalogue_ready, clock, title="Theirs")
    response = campaigner.post(
        "/staff/campaigns/new", {**form_data(), "campaign_id": str(theirs), "action": "launch"}
    )
    assert response.status_code == 303
    assert not response.location.endswith(str(theirs))
    assert campaign(catalogue_ready, theirs).title == "Theirs"


def test_launch_checks_the_rules_again(campaigner, catalogue_ready, engine):
    response = campaigner.post(
        "/staff/campaigns/new", {**form_data(url="http://plain.example"), "action": "launch"}
    )
    assert response.status_code == 422
    assert "Links may lead only to this site" in response.text
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM campaign")).scalar_one() == 0


def test_the_list_shows_campaigns_newest_first_with_status_and_counts(
    campaigner, catalogue_ready, clock
):
    app = catalogue_ready
    first = make_campaign(app, clock, title="First")
    clock.advance(minutes=1)
    second = make_campaign(app, clock, title="Second")
    with db.begin(app) as session:
        found = session.get(Campaign, first)
        found.status, found.materialised_at = "sending", clock.now()
        for status in ("accepted", "accepted", "failed", "queued"):
            session.add(
                Delivery(
                    campaign_id=first,
                    subscription_id=uuid.uuid4(),
                    push_service="fcm",
                    status=status,
                    next_attempt_at=clock.now(),
                    consent_reason="explicit_opt_in",
                    updated_at=clock.now(),
                )
            )
    html = campaigner.get("/staff/campaigns").text
    assert "<caption>Campaigns, newest first</caption>" in html
    assert html.index(">Second</a>") < html.index(">First</a>")
    assert "Sending: 3 of 4 done — 2 delivered, 1 failed; 1 to go." in html
    assert "2 accepted, 1 failed, 0 revoked, 0 skipped, 1 queued, 0 sending" in html
    assert '<span class="tag tag--info">Sending</span>' in html
    # Sent now: due, waiting for the dispatcher's next run.
    assert '<span class="tag tag--info">Starting</span>' in html
    assert f"/staff/campaigns/{second}" in html


def test_the_list_pages_through_older_campaigns(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    for n in range(55):
        make_campaign(app, clock, title=f"Campaign {n:02d}")
        clock.advance(seconds=1)
    html = campaigner.get("/staff/campaigns").text
    assert "Campaign 54" in html
    assert "Campaign 04<" not in html
    older = re.search(r'href="(/staff/campaigns\?before=[^"]+)" rel="next"', html).group(1)
    html = campaigner.get(older.replace("&amp;", "&")).text
    assert "Campaign 04" in html
    assert "Campaign 00" in html
    assert "Campaign 05<" not in html
    assert 'rel="next"' not in html


def test_a_scheduled_campaign_paused_and_resumed_waits_for_its_time(
    campaigner, catalogue_ready, clock
):
    """Resumed before its send time, it is scheduled again: the dispatcher starts it then,
    not at once (which would also fix its audience months early)."""
    from portal.delivery.engine import Dispatcher

    app = catalogue_ready
    subscribe(app, topics=["weekly-digest"])
    later = clock.now() + dt.timedelta(days=30)
    campaign_id = make_campaign(app, clock, send_at=later)
    url = f"/staff/campaigns/{campaign_id}"
    assert campaigner.post(f"{url}/pause").status_code == 303
    assert campaigner.post(f"{url}/resume").status_code == 303
    assert campaign(app, campaign_id).status == "scheduled"
    Dispatcher(app, transport=None).advance_campaigns()  # type: ignore[arg-type]
    assert campaign(app, campaign_id).status == "scheduled"
    assert campaign(app, campaign_id).materialised_at is None
    assert "Scheduled for" in campaigner.get(url).text
    clock.advance(days=30)
    Dispatcher(app, transport=None).advance_campaigns()  # type: ignore[arg-type]
    assert campaign(app, campaign_id).status == "sending"


def test_pause_resume_and_cancel_from_the_page_are_audited(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    url = f"/staff/campaigns/{campaign_id}"
    page = campaigner.get(url).text
    assert "Pause sending" in page
    assert "Resume sending" not in page

    assert campaigner.post(f"{url}/pause").status_code == 303
    assert campaign(app, campaign_id).status == "paused"
    page = campaigner.get(url).text
    assert "Campaign paused." in page
    assert "Resume sending" in page

    assert campaigner.post(f"{url}/resume").status_code == 303
    assert campaign(app, campaign_id).status == "sending"

    refused = campaigner.post(f"{url}/cancel")  # the box is not ticked
    assert refused.status_code == 422
    assert "<title>Error: " in refused.text
    assert '<a href="#confirm">Tick the box to confirm that you want to cancel</a>' in refused.text
    assert 'aria-describedby="confirm-hint confirm-error"' in refused.text
    assert campaign(app, campaign_id).status == "sending"

    assert campaigner.post(f"{url}/cancel", {"confirm": "yes"}).status_code == 303
    assert campaign(app, campaign_id).status == "cancelled"
    page = campaigner.get(url).text
    assert "Campaign cancelled." in page
    assert "Pause sending" not in page
    assert "Cancel campaign" not in page

    actions = [
        (action, actor, detail["status"])
        for action in ("campaign.paused", "campaign.resumed", "campaign.cancelled")
        for actor, _, detail in audit_rows(app, action)
    ]
    assert actions == [
        ("campaign.paused", "campaigner@example.test", "paused"),
        ("campaign.resumed", "campaigner@example.test", "sending"),
        ("campaign.cancelled", "campaigner@example.test", "cancelled"),
    ]

    # A finished campaign cannot be paused: said plainly, nothing changes.
    response = campaigner.post(f"{url}/pause")
    assert response.status_code == 303
    assert "Not paused: a cancelled campaign cannot pause." in campaigner.get(url).text


def test_controls_refuse_a_post_without_a_csrf_token(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    for action, data in (("pause", {}), ("cancel", {"confirm": "yes"})):
        response = campaigner.client.post(f"/staff/campaigns/{campaign_id}/{action}", data=data)
        assert response.status_code == 400
    assert campaign(app, campaign_id).status == "scheduled"
    assert audit_rows(app, "campaign.paused") == []
    launch = campaigner.client.post(
        "/staff/campaigns/new", data={**form_data(), "action": "launch"}
    )
    assert launch.status_code == 400


@pytest.mark.parametrize("role", [Role.ADMIN, Role.COMPLIANCE])
def test_other_roles_are_refused(catalogue_ready, sign_in, clock, role):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    person = sign_in(app, f"{role.value}@example.test", role)
    assert person.get("/staff/campaigns").status_code == 403
    assert person.get(f"/staff/campaigns/{campaign_id}/progress.json").status_code == 403
    assert person.post(f"/staff/campaigns/{campaign_id}/pause").status_code == 403
    assert (
        person.post("/staff/campaigns/new", {**form_data(), "action": "launch"}).status_code == 403
    )
    assert campaign(app, campaign_id).status == "scheduled"


def test_progress_json_counts_deliveries_by_status(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    with db.begin(app) as session:
        found = session.get(Campaign, campaign_id)
        found.status, found.materialised_at = "sending", clock.now()
        for status in ("accepted", "accepted", "failed", "revoked", "skipped", "queued", "sending"):
            session.add(
                Delivery(
                    campaign_id=campaign_id,
                    subscription_id=uuid.uuid4(),
                    push_service="fcm",
                    status=status,
                    next_attempt_at=clock.now(),
                    consent_reason="explicit_opt_in",
                    updated_at=clock.now(),
                )
            )
    response = campaigner.get(f"/staff/campaigns/{campaign_id}/progress.json")
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    body = response.json
    assert body["counts"] == {
        "queued": 1,
        "sending": 1,
        "accepted": 2,
        "failed": 1,
        "revoked": 1,
        "skipped": 1,
    }
    assert (body["total"], body["done"]) == (7, 5)
    assert (body["status"], body["statusLabel"], body["finished"]) == ("sending", "Sending", False)
    assert body["summary"] == (
        "Sending: 5 of 7 done — 2 delivered, 1 failed, 1 revoked, 1 skipped; 2 to go."
    )
    assert body["circuits"] == []
    missing = campaigner.get(f"/staff/campaigns/{uuid.uuid4()}/progress.json")
    assert missing.status_code == 404
    assert missing.json["error"]["code"] == "not_found"

    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    assert '<progress id="progress-bar" max="7" value="5">5 of 7</progress>' in page
    assert '<label for="progress-bar">Deliveries done</label>' in page
    assert (
        '<p id="progress-summary" class="headline headline--info">Sending: 5 of 7 done — ' in page
    )
    assert (
        'id="progress-announce" class="visually-hidden" role="status" aria-live="polite">' in page
    )
    assert '<td class="numeric" data-count="accepted">2</td>' in page
    assert f'data-progress-url="/staff/campaigns/{campaign_id}/progress.json"' in page
    assert "js/campaign-progress.js" in page
    assert 'id="progress-refresh">Refresh</a>' in page
    assert 'http-equiv="refresh"' not in page
    assert 'id="progress-pause" class="secondary" hidden>Pause updates</button>' in page


def test_a_finished_campaign_page_does_not_poll(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    with db.begin(app) as session:
        services.control(session, campaign_id, "cancel", now=clock.now())
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    assert 'data-finished="true"' in page
    assert "campaign-progress.js" not in page
    assert "Cancelled: 0 of 0 delivered." in page
    assert '<progress id="progress-bar"' not in page  # finished: no bar to fill


def test_open_circuits_are_shown_with_their_reason(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    now = clock.now()
    with db.begin(app) as session:
        session.add(
            CircuitState(
                push_service="fcm",
                open_until=now + dt.timedelta(minutes=3, seconds=5),
                reason="40 of 50 answers were 429/5xx",
                opened_at=now,
            )
        )
        session.add(
            CircuitState(
                push_service="wns",
                open_until=now - dt.timedelta(seconds=1),  # closed again
                reason="20 of 20 answers were 429/5xx",
                opened_at=now - dt.timedelta(minutes=1),
            )
        )
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    expected = "fcm slowed down until 00:03:05 UTC — 40 of 50 answers were 429/5xx"
    assert f"<li>{expected}</li>" in page
    assert "wns slowed down" not in page
    circuits = campaigner.get(f"/staff/campaigns/{campaign_id}/progress.json").json["circuits"]
    assert [c["text"] for c in circuits] == [expected]
    assert circuits[0]["pushService"] == "fcm"
    clock.advance(minutes=4)
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    # Closed again, but opened while this campaign was under way: still said.
    assert (
        "<li>fcm was slowed down from 00:00:00 UTC to 00:03:05 UTC — "
        "40 of 50 answers were 429/5xx</li>"
    ) in page
    assert "wns" not in page  # opened before this campaign
    assert campaigner.get(f"/staff/campaigns/{campaign_id}/progress.json").json["circuits"] == []


def test_the_outcome_chart_is_an_accessible_svg_with_a_table(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    rows = [("fcm", "accepted", 201)] * 3 + [
        ("fcm", "revoked", 410),
        ("autopush", "accepted", 201),
        ("autopush", "queued", 429),
        ("wns", "skipped", None),
    ]
    with db.begin(app) as session:
        for service, status, code in rows:
            session.add(
                Delivery(
                    campaign_id=campaign_id,
                    subscription_id=uuid.uuid4(),
                    push_service=service,
                    status=status,
                    last_status_code=code,
                    next_attempt_at=clock.now(),
                    consent_reason="explicit_opt_in",
                    updated_at=clock.now(),
                )
            )
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert 'role="img"' in svg
    assert 'aria-labelledby="outcome-title outcome-desc"' in svg
    assert '<title id="outcome-title">Outcome by push service</title>' in svg
    desc = re.search(r'<desc id="outcome-desc">([^<]+)</desc>', svg).group(1)
    assert desc == (
        "autopush: 1 201 Created, 1 429 Too Many Requests; fcm: 3 201 Created, 1 410 Gone; "
        "wns: 1 Skipped (no answer)."
    )
    # Every bar has its words beside it: colour is never the only signal.
    assert svg.count("<rect") == 5
    for label in ("201 Created", "410 Gone", "429 Too Many Requests", "Skipped (no answer)"):
        assert f'class="chart__label">{label}</text>' in svg
    assert 'class="chart__count">3</text>' in svg
    assert 'class="chart__bar chart__bar--gone"' in svg
    assert 'style="' not in svg
    widths = [float(w) for w in re.findall(r'<rect [^>]*width="([\d.]+)"', svg)]
    assert max(widths) == 340.0  # the largest count fills the bar's length
    table = page[page.index('<table class="outcome__table">') :]
    table = table[: table.index("</table>")]
    assert "<caption>Outcome by push service and answer (the chart as a table)</caption>" in table
    assert '<th scope="col">Push service</th>' in table
    cells = re.findall(
        r'<tr><th scope="row">(\w+)</th><td>([^<]+)</td><td class="numeric">(\d+)</td></tr>',
        table,
    )
    assert cells == [
        ("autopush", "201 Created", "1"),
        ("autopush", "429 Too Many Requests", "1"),
        ("fcm", "201 Created", "3"),
        ("fcm", "410 Gone", "1"),
        ("wns", "Skipped (no answer)", "1"),
    ]


def test_a_campaign_with_no_deliveries_says_so(campaigner, catalogue_ready, clock):
    campaign_id = make_campaign(
        catalogue_ready, clock, send_at=clock.now() + dt.timedelta(hours=2, minutes=5)
    )
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    assert "Scheduled for Thu 1 Jan 2026, 02:05 UTC: nothing sent yet." in page
    with db.begin(catalogue_ready) as session:
        found = session.get(Campaign, campaign_id)
        found.status = "sending"
    summary = campaigner.get(f"/staff/campaigns/{campaign_id}/progress.json").json["summary"]
    assert summary == "Sending: 0 of 0 done; the audience is still being counted in."
    with db.begin(catalogue_ready) as session:
        session.get(Campaign, campaign_id).status = "scheduled"
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    assert "<svg" not in page
    assert "No deliveries yet: the campaign has not started." in page


def test_an_unknown_campaign_is_not_found(campaigner, catalogue_ready):
    response = campaigner.get(f"/staff/campaigns/{uuid.uuid4()}")
    assert response.status_code == 404
    assert "Campaign not found" in response.text
    assert campaigner.post(f"/staff/campaigns/{uuid.uuid4()}/pause").status_code == 404


def test_the_dashboard_and_navigation_list_campaigns(campaigner, catalogue_ready):
    page = campaigner.get("/staff/").text
    assert '<a href="/staff/campaigns">Campaigns</a>' in page
