"""The rule from a campaign's delivery counts to what its pages say (portal.campaigns.outcome).

Every state a campaign can be in is named truthfully: a campaign whose deliveries failed
is never a green "Completed" (SPEC §7), and a headline's numbers add up to the campaign's
deliveries. The last tests read the facts from real deliveries, sent by the engine to the
fake push service.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.campaigns import outcome, services
from portal.campaigns.models import Campaign, CampaignStatus, CircuitState
from portal.campaigns.outcome import Facts, Reason, ServiceRetries, Tone
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery.models import Delivery, DeliveryStatus
from tests.campaigns.test_end_to_end import subscribe
from tests.campaigns.test_pages import launch_via_form

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def counts(**given_counts: int) -> dict[str, int]:
    return {s.value: given_counts.get(s.value, 0) for s in DeliveryStatus}


def facts(status: str, **options) -> Facts:
    base = {"send_at": NOW - dt.timedelta(seconds=20), "now": NOW, "counts": counts()}
    return Facts(status=status, **(base | options))


# -- each state --------------------------------------------------------------------------


def test_all_failed_is_named_a_failure_in_red():
    said = outcome.headline(facts("completed", counts=counts(failed=19)))
    assert (said.label, said.tone, said.finished) == ("Failed", Tone.ERROR, True)
    assert said.text == "Finished: 0 of 19 delivered, 19 failed."
    assert said.activity == []


def test_partly_failed_is_a_warning_that_lists_every_kind():
    said = outcome.headline(
        facts("completed", counts=counts(accepted=12, failed=5, revoked=1, skipped=1))
    )
    assert (said.label, said.tone) == ("Partly delivered", Tone.WARNING)
    assert said.text == "Finished: 12 of 19 delivered, 5 failed, 1 revoked, 1 skipped."


def test_all_delivered_is_the_only_green():
    said = outcome.headline(facts("completed", counts=counts(accepted=19)))
    assert (said.label, said.tone) == ("Delivered", Tone.SUCCESS)
    assert said.text == "Finished: 19 of 19 delivered."


def test_nothing_delivered_without_failures_is_not_called_failed():
    said = outcome.headline(facts("completed", counts=counts(revoked=2, skipped=3)))
    assert (said.label, said.tone) == ("Nothing delivered", Tone.WARNING)
    assert said.text == "Finished: 0 of 5 delivered, 2 revoked, 3 skipped."


def test_a_campaign_nobody_could_receive_says_so():
    said = outcome.headline(facts("completed"))
    assert (said.label, said.tone) == ("Nobody to send to", Tone.MUTED)
    assert said.text.startswith("Finished: 0 of 0 delivered")


def test_cancelled_and_expired_say_what_was_delivered_before():
    cancelled = outcome.headline(
        facts("cancelled", counts=counts(accepted=5, skipped=13, sending=1))
    )
    assert (cancelled.label, cancelled.tone, cancelled.finished) == ("Cancelled", Tone.MUTED, True)
    assert cancelled.text == (
        "Cancelled: 5 of 19 delivered, 13 skipped, 1 still with a push service."
    )
    expired = outcome.headline(facts("expired", counts=counts(accepted=4, failed=1, skipped=14)))
    assert (expired.label, expired.tone) == ("Expired", Tone.MUTED)
    assert expired.text == "Expired before the end: 4 of 19 delivered, 1 failed, 14 skipped."


def test_scheduled_for_later_and_due_now_read_differently():
    later = outcome.headline(facts("scheduled", send_at=NOW + dt.timedelta(hours=2)))
    assert (later.label, later.text) == (
        "Scheduled",
        "Scheduled for Thu 1 Jan 2026, 14:00 UTC: nothing sent yet.",
    )
    paris = outcome.headline(
        facts("scheduled", send_at=NOW + dt.timedelta(hours=2), time_zone="Europe/Paris")
    )
    assert paris.text == (
        "Scheduled for Thu 1 Jan 2026, 15:00 Europe/Paris (UTC+01:00) — 14:00 UTC: "
        "nothing sent yet."
    )
    due = outcome.headline(facts("scheduled", send_at=NOW, dispatch_every=5))
    assert (due.label, due.tone, due.finished) == ("Starting", Tone.INFO, False)
    assert due.text == "Starting: nothing sent yet."
    assert due.activity == [
        "Waiting for the dispatcher, which picks up due campaigns every 5 seconds."
    ]


def test_materialising_says_the_audience_is_being_counted_in():
    said = outcome.headline(
        facts("sending", materialised=False, counts=counts(queued=1200, accepted=34))
    )
    assert said.label == "Sending"
    assert said.text == (
        "Sending: 34 of 1,234 done — 34 delivered; 1,200 to go; "
        "the audience is still being counted in."
    )
    assert said.activity[0] == "Counting in the audience: 1,234 deliveries so far."


def test_sending_with_retries_says_how_many_why_and_when():
    retrying = Reason("queued", "server_error", 503, 19, attempts=2)
    said = outcome.headline(
        facts(
            "sending",
            counts=counts(queued=19),
            retrying=19,
            next_retry_at=NOW + dt.timedelta(seconds=4),
            reasons=[retrying],
        )
    )
    assert (said.label, said.tone, said.finished) == ("Sending", Tone.INFO, False)
    assert said.text == "Sending: 0 of 19 done; 19 to go."
    assert said.activity == [
        "Retrying 19 deliveries (19 after 503 Service Unavailable); next attempt at "
        "12:00:04 UTC, attempt 3 of at most 5."
    ]


def test_sending_says_its_rate_and_what_is_in_flight():
    said = outcome.headline(
        facts("sending", counts=counts(accepted=60, sending=40, queued=100), recent=60)
    )
    # Sent 20 s ago: 60 ended in those 20 seconds.
    assert said.activity[:2] == [
        "Sending at 3.0 deliveries a second (over the last 20 seconds).",
        "40 deliveries handed to push services, answer pending.",
    ]


def test_paused_is_a_warning_that_nothing_more_is_sent():
    said = outcome.headline(facts("paused", counts=counts(accepted=3, queued=4)))
    assert (said.label, said.tone) == ("Paused", Tone.WARNING)
    assert said.text == "Paused: 3 of 7 done — 3 delivered; 4 to go."
    assert said.activity == ["Paused: nothing more is sent until the campaign is resumed."]


# -- what holds for every campaign ------------------------------------------------------

statuses = st.sampled_from([s.value for s in CampaignStatus])
some_counts = st.fixed_dictionaries(
    {s.value: st.integers(min_value=0, max_value=2_000_000) for s in DeliveryStatus}
)


@given(
    status=statuses,
    counted=some_counts,
    materialised=st.booleans(),
    ahead=st.integers(min_value=-3600, max_value=3600),
)
def test_the_numbers_of_a_headline_add_up_and_are_all_said(status, counted, materialised, ahead):
    said = outcome.headline(
        Facts(
            status=status,
            send_at=NOW + dt.timedelta(seconds=ahead),
            now=NOW,
            counts=counted,
            materialised=materialised,
        )
    )
    total = sum(counted.values())
    assert sum(n for _, n in said.parts) == total
    if said.label not in ("Scheduled", "Starting"):
        # Every number the sentence gives is one of the parts or the total, and every part
        # that is not zero is in it ("to go" apart: it is a total of its own).
        for word, n in said.parts:
            if n:
                spoken = (f"{n:,} {word}", f"{n:,} of {total:,} {word}")
                assert any(form in said.text for form in spoken), (word, n, said.text)
        said_numbers = {int(x.replace(",", "")) for x in re.findall(r"\d[\d,]*", said.text)}
        allowed = {total, total - counted["queued"] - counted["sending"]} | {
            n for _, n in said.parts
        }
        assert said_numbers <= allowed, said.text
    assert said.finished == (status in ("completed", "cancelled", "expired"))


@given(status=statuses, counted=some_counts)
def test_green_means_every_delivery_was_delivered(status, counted):
    said = outcome.headline(Facts(status=status, send_at=NOW, now=NOW, counts=counted))
    total = sum(counted.values())
    if said.tone is Tone.SUCCESS:
        assert status == "completed" and counted["accepted"] == total > 0
    if status == "completed" and counted["failed"]:
        assert said.tone in (Tone.WARNING, Tone.ERROR)
        assert said.label != "Completed"
    if status == "completed" and counted["failed"] and not counted["accepted"]:
        assert said.tone is Tone.ERROR


# -- why deliveries did not arrive -------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "label"),
    [
        (
            Reason("failed", "max_attempts", 503, 1, 5),
            "Gave up after 5 attempts: the last was 503 Service Unavailable",
        ),
        (
            Reason("failed", "max_attempts", None, 1, 5),
            "Gave up after 5 attempts: the last was no answer (network error or time-out)",
        ),
        (
            Reason("failed", "invalid_endpoint", None, 1),
            "Invalid endpoint: the stored address is no push endpoint",
        ),
        (Reason("failed", "rejected_400", 400, 1), "Refused by the push service: 400 Bad Request"),
        (
            Reason("failed", "not_found_404", 404, 1),
            "Not found at the push service: 404 Not Found (the subscription may be stale)",
        ),
        (
            Reason("revoked", "gone", 410, 1),
            "Subscription gone: the push service answered 410 Gone",
        ),
        (
            Reason("skipped", "deliver_until_passed", None, 1),
            "Expired before sending: its “don't deliver after” time passed",
        ),
        (Reason("skipped", "cancelled", None, 1), "Not sent: the campaign was cancelled first"),
        (
            Reason("skipped", "cancelled", 503, 1),
            "Not sent again: the campaign was cancelled before its next attempt (the last "
            "answer was 503 Service Unavailable)",
        ),
        (
            Reason("skipped", "deliver_until_passed", 429, 1),
            "Not sent again: its “don't deliver after” time passed before its next attempt "
            "(the last answer was 429 Too Many Requests)",
        ),
        (
            Reason("skipped", "subscription_stale", None, 1),
            "Not sent: the subscription was stale before sending",
        ),
        (
            Reason("skipped", "consent_withdrawn", None, 1),
            "Not sent: consent was withdrawn before sending",
        ),
    ],
)
def test_each_reason_reads_in_words(row, label):
    assert outcome.reason_label(row) == label


def test_the_breakdown_adds_reasons_up_most_first_and_leaves_out_what_is_under_way():
    rows = [
        Reason("failed", "rejected_400", 400, 2),
        Reason("failed", "max_attempts", 503, 7, 5),
        Reason("failed", "rejected_400", 400, 1),
        Reason("queued", "server_error", 503, 4, 2),
        Reason("accepted", None, 201, 9),
    ]
    assert outcome.breakdown(rows) == [
        ("Gave up after 5 attempts: the last was 503 Service Unavailable", 7),
        ("Refused by the push service: 400 Bad Request", 3),
    ]


def test_slowdowns_name_circuits_and_the_retries_seen():
    circuit = CircuitState(
        push_service="fcm",
        opened_at=NOW - dt.timedelta(minutes=2),
        open_until=NOW - dt.timedelta(minutes=1, seconds=30),
        reason="40 of 50 answers were 429/5xx",
    )
    lines = outcome.slowdowns(
        [(circuit, False)], [ServiceRetries("autopush", 19, 19)], finished=False
    )
    assert lines == [
        "fcm was slowed down from 11:58:00 UTC to 11:58:30 UTC — 40 of 50 answers were 429/5xx",
        "autopush: 19 deliveries needed more than one attempt, 19 waiting for the next",
    ]
    assert outcome.slowdowns([], [ServiceRetries("autopush", 19, 0)], finished=True) == [
        "autopush: 19 deliveries needed more than one attempt"
    ]
    # Answered "try again later" and never tried again: said by answer, after the retries.
    turned_away = ServiceRetries("fcm", 2, 0, ((429, 1), (503, 3)))
    assert outcome.slowdowns([], [turned_away], finished=True) == [
        "fcm: 2 deliveries needed more than one attempt",
        "fcm: 1 delivery answered 429 Too Many Requests (try again later) and not tried again",
        "fcm: 3 deliveries answered 503 Service Unavailable (try again later) and not tried again",
    ]
    assert outcome.slowdowns([], [ServiceRetries("fcm", 0, 0, ((503, 3),))], finished=True) == [
        "fcm: 3 deliveries answered 503 Service Unavailable (try again later) and not tried again"
    ]
    assert "None:" in outcome.no_slowdown(finished=True)


# -- read from real deliveries -----------------------------------------------------------


def _campaign(app, clock) -> uuid.UUID:
    with db.begin(app) as session:
        draft = CampaignDraft(topic="weekly-digest", title="Digest", body="News")
        return services.create_campaign(session, draft, created_by="x", now=clock.now()).id


def _reading(app, campaign_id, now):
    with db.begin(app) as session:
        return outcome.read(session, session.get(Campaign, campaign_id), now=now)


def test_read_groups_retries_reasons_and_recent_ends(catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = _campaign(app, clock)
    now = clock.now()
    rows = [
        ("accepted", None, 201, 1, now),
        ("accepted", None, 201, 3, now - dt.timedelta(minutes=5)),  # retried, long ago
        ("queued", "server_error", 503, 2, now + dt.timedelta(seconds=9)),
        ("queued", "network_error", None, 1, now + dt.timedelta(seconds=4)),
        ("queued", None, None, 0, now),  # its first attempt still to come
        ("failed", "max_attempts", 503, 5, now),
    ]
    with db.begin(app) as session:
        found = session.get(Campaign, campaign_id)
        found.status, found.materialised_at = "sending", now
        for status, reason, code, attempts, when in rows:
            session.add(
                Delivery(
                    campaign_id=campaign_id,
                    subscription_id=uuid.uuid4(),
                    push_service="fcm",
                    status=status,
                    reason=reason,
                    last_status_code=code,
                    attempts=attempts,
                    next_attempt_at=when,
                    consent_reason="explicit_opt_in",
                    updated_at=min(when, now),
                )
            )
    reading = _reading(app, campaign_id, now)
    found = reading.facts
    assert found.counts == counts(accepted=2, queued=3, failed=1)
    assert (found.retrying, found.next_retry_at) == (2, now + dt.timedelta(seconds=4))
    assert found.recent == 2  # one accepted and the failure, now; not the one long ago
    assert reading.retries == [ServiceRetries("fcm", 4, 2)]
    said = outcome.headline(found)
    assert said.activity[0] == "Sending at 2.0 deliveries a second (over the last 1 second)."
    assert said.activity[1] == (
        "Retrying 2 deliveries (1 after 503 Service Unavailable, 1 after no answer (network "
        "error or time-out)); next attempt at 00:00:04 UTC, attempt 3 of at most 5."
    )


def test_a_campaign_every_push_service_refuses_ends_failed_with_its_reason(
    push_app, dispatcher, fake_push, sign_in, clock
):
    app = push_app
    people = [subscribe(app, fake_push, region="US") for _ in range(3)]
    for person in people:
        fake_push.script(person, 400)
    campaign_id = _campaign(app, clock)
    dispatcher.tick()
    staff = sign_in(app)
    body = staff.get(f"/staff/campaigns/{campaign_id}/progress.json").json
    assert (body["status"], body["statusLabel"], body["tone"]) == ("completed", "Failed", "error")
    assert body["summary"] == "Finished: 0 of 3 delivered, 3 failed."
    assert body["failures"] == [
        {"reason": "Refused by the push service: 400 Bad Request", "count": 3}
    ]
    page = staff.get(f"/staff/campaigns/{campaign_id}").text
    assert '<span class="tag tag--error" id="campaign-status">Failed</span>' in page
    assert "<caption>Why deliveries did not arrive</caption>" in page
    assert "<td>Refused by the push service: 400 Bad Request</td>" in page
    assert "Completed" not in page
    listed = staff.get("/staff/campaigns").text
    assert '<span class="tag tag--error">Failed</span>' in listed
    assert "Finished: 0 of 3 delivered, 3 failed." in listed


def test_retries_are_said_while_they_wait_and_after_the_campaign_gave_up(
    push_app, dispatcher, fake_push, sign_in, clock
):
    app = push_app
    person = subscribe(app, fake_push, region="US")
    fake_push.script(person, *([503] * 5))
    campaign_id = _campaign(app, clock)
    dispatcher.tick()
    staff = sign_in(app)
    body = staff.get(f"/staff/campaigns/{campaign_id}/progress.json").json
    assert body["summary"] == "Sending: 0 of 1 done; 1 to go."
    assert body["retrying"] == 1
    assert body["activity"][-1].startswith(
        "Retrying 1 delivery (1 after 503 Service Unavailable); next attempt at 00:00:01 UTC"
    )
    assert body["slowdowns"] == [
        "other: 1 delivery needed more than one attempt, 1 waiting for the next"
    ]
    assert "None" not in body["html"]["progress"].split("circuits-heading")[1]
    for _ in range(4):
        clock.advance(seconds=70)
        dispatcher.tick()
    body = staff.get(f"/staff/campaigns/{campaign_id}/progress.json").json
    assert (body["statusLabel"], body["tone"], body["finished"]) == ("Failed", "error", True)
    assert body["summary"] == "Finished: 0 of 1 delivered, 1 failed."
    assert body["failures"] == [
        {
            "reason": "Gave up after 5 attempts: the last was 503 Service Unavailable",
            "count": 1,
        }
    ]
    assert body["slowdowns"] == ["other: 1 delivery needed more than one attempt"]


def test_send_now_says_it_is_starting_then_that_the_audience_is_counted_in(
    push_app, dispatcher, fake_push, sign_in, clock
):
    app = push_app
    for _ in range(2):
        subscribe(app, fake_push, region="US")
    staff = sign_in(app)
    campaign_id, launched = launch_via_form(staff)
    page = staff.get(launched.headers["Location"]).text
    assert '<span class="tag tag--info" id="campaign-status">Starting</span>' in page
    assert "Starting: nothing sent yet." in page
    assert "<li>Waiting for the dispatcher, which picks up due campaigns every" in page
    assert "Scheduled for" not in page
    assert "campaign-progress.js" in page  # and it follows what happens next

    dispatcher.settings = replace(dispatcher.settings, materialise_batch=1)
    dispatcher.advance_campaigns()  # due: sending, and one batch of the audience in
    body = staff.get(f"/staff/campaigns/{campaign_id}/progress.json").json
    assert (body["statusLabel"], body["materialised"]) == ("Sending", False)
    assert body["summary"] == (
        "Sending: 0 of 1 done; 1 to go; the audience is still being counted in."
    )
    assert body["activity"][0] == "Counting in the audience: 1 delivery so far."
    assert "Counting in the audience: 1 delivery so far." in body["html"]["progress"]

    dispatcher.tick()
    body = staff.get(f"/staff/campaigns/{campaign_id}/progress.json").json
    assert (body["statusLabel"], body["tone"]) == ("Delivered", "success")
    assert body["summary"] == "Finished: 2 of 2 delivered."
    assert body["activity"] == []
    assert body["slowdowns"] == []
    assert "None: no push service was slowed down" in body["html"]["progress"]
    assert "201 Created" in body["html"]["outcome"]
