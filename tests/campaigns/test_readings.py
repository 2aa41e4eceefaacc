"""A campaign's progress read at most every ten times what reading it costs
(portal/campaigns/readings.py), and ``progress.json`` saying when to ask again."""

from __future__ import annotations

import itertools
import threading
import uuid

import pytest

from portal.campaigns import readings, views
from portal.campaigns.models import Campaign
from portal.campaigns.readings import REUSE_ABOVE, REUSE_FACTOR, CostlyReadings
from portal.db import db
from portal.delivery.models import Delivery
from tests.campaigns.test_pages import make_campaign


class Clock:
    """A monotonic clock moved by hand; a reading moves it by what it costs."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _costing(clock: Clock, seconds: float):
    counter = itertools.count(1)

    def take() -> int:
        clock.now += seconds
        return next(counter)

    return take


def test_a_cheap_reading_is_always_taken_afresh():
    clock = Clock()
    kept = CostlyReadings(clock)
    take = _costing(clock, REUSE_ABOVE)  # at the threshold: not above it
    assert [kept.read("c", take).value for _ in range(3)] == [1, 2, 3]
    assert kept.seconds_fresh(kept.read("c", take)) == 0


def test_a_costly_reading_is_answered_again_for_ten_times_its_cost_then_taken_afresh():
    clock = Clock()
    kept = CostlyReadings(clock)
    take = _costing(clock, 2.0)
    first = kept.read("c", take)
    assert first.value == 1
    assert kept.seconds_fresh(first) == pytest.approx(REUSE_FACTOR * 2.0)
    clock.now += REUSE_FACTOR * 2.0 - 0.1
    again = kept.read("c", take)
    assert again is first  # not read: the database was not asked
    assert kept.seconds_fresh(again) == pytest.approx(0.1)
    clock.now += 0.1
    assert kept.read("c", take).value == 2  # stale: read afresh


def test_readings_of_other_keys_are_their_own():
    clock = Clock()
    kept = CostlyReadings(clock)
    take = _costing(clock, 1.0)
    assert kept.read(("c", "sending"), take).value == 1
    assert kept.read(("c", "paused"), take).value == 2  # a new status: read afresh
    assert kept.read(("c", "sending"), take).value == 1


def test_a_reading_that_became_cheap_is_no_longer_kept():
    clock = Clock()
    kept = CostlyReadings(clock)
    assert kept.read("c", _costing(clock, 1.0)).value == 1
    clock.now += REUSE_FACTOR * 1.0
    assert kept.read("c", _costing(clock, 0.01)).value == 1  # a new counter: its first
    assert kept.read("c", lambda: "fresh").value == "fresh"


def test_at_most_max_kept_readings_are_held(monkeypatch):
    monkeypatch.setattr(readings, "MAX_KEPT", 3)
    clock = Clock()
    kept = CostlyReadings(clock)
    for key in range(5):
        kept.read(key, _costing(clock, 1.0))
    assert list(kept._kept) == [2, 3, 4]  # the oldest dropped first


def _sending_campaign(app, clock) -> uuid.UUID:
    campaign_id = make_campaign(app, clock)
    with db.begin(app) as session:
        found = session.get(Campaign, campaign_id)
        found.status, found.materialised_at = "sending", clock.now()
        session.add(
            Delivery(
                campaign_id=campaign_id,
                subscription_id=uuid.uuid4(),
                push_service="fcm",
                status="queued",
                next_attempt_at=clock.now(),
                consent_reason="explicit_opt_in",
                updated_at=clock.now(),
            )
        )
    return campaign_id


def test_progress_json_says_to_ask_again_in_five_seconds_for_a_cheap_reading(
    campaigner, catalogue_ready, clock
):
    campaign_id = _sending_campaign(catalogue_ready, clock)
    url = f"/staff/campaigns/{campaign_id}/progress.json"
    assert campaigner.get(url).json["refreshAfter"] == views.POLL_SECONDS


def costly_readings(monkeypatch, seconds: float) -> tuple[Clock, list[int]]:
    """Every progress reading of ``portal.campaigns.views`` costs ``seconds`` on a
    monotonic clock moved by hand (returned, with the list the readings taken are
    counted into)."""
    monotonic = Clock()
    monkeypatch.setattr(views, "_READINGS", CostlyReadings(monotonic))
    fresh = views._progress
    taken: list[int] = []

    def costly(campaign):
        monotonic.now += seconds
        taken.append(1)
        return fresh(campaign)

    monkeypatch.setattr(views, "_progress", costly)
    return monotonic, taken


def test_progress_json_answers_a_costly_reading_again_until_the_status_changes(
    campaigner, catalogue_ready, clock, monkeypatch
):
    """Reading this campaign costs 3 s (a monotonic clock moved by the reading): the
    next question within 30 s gets the same answer, with the wait left; a pause is
    answered at once, from a reading of its own."""
    app = catalogue_ready
    campaign_id = _sending_campaign(app, clock)
    monotonic, _ = costly_readings(monkeypatch, 3.0)
    url = f"/staff/campaigns/{campaign_id}/progress.json"
    first = campaigner.get(url).json
    assert first["refreshAfter"] == 30
    with db.begin(app) as session:  # a delivery answered since
        session.execute(
            Delivery.__table__.update()
            .where(Delivery.campaign_id == campaign_id)
            .values(status="accepted", last_status_code=201)
        )
    monotonic.now += 10
    again = campaigner.get(url).json
    assert again["counts"] == first["counts"] and again["counts"]["queued"] == 1
    assert again["refreshAfter"] == 20
    monotonic.now += 20
    later = campaigner.get(url).json
    assert later["counts"]["accepted"] == 1 and later["refreshAfter"] == 30

    paused = campaigner.post(f"/staff/campaigns/{campaign_id}/pause")
    assert paused.status_code == 303
    now_paused = campaigner.get(url).json
    assert now_paused["status"] == "paused"


def test_the_page_and_its_script_share_one_costly_reading(
    campaigner, catalogue_ready, clock, monkeypatch
):
    """A campaign that takes 3 s to read: opening its page reads it once; the page's
    script, another member of staff opening the page, and a reload within 30 s are
    answered from that reading, and the page says when newer numbers come."""
    app = catalogue_ready
    campaign_id = _sending_campaign(app, clock)
    monotonic, taken = costly_readings(monkeypatch, 3.0)
    page_url = f"/staff/campaigns/{campaign_id}"

    page = campaigner.get(page_url).get_data(as_text=True)
    assert len(taken) == 1
    assert 'data-refresh-after="30"' in page
    assert "This campaign takes a while to count: newer numbers in 30 seconds." in page
    assert "Use Refresh to see newer numbers." not in page

    with db.begin(app) as session:  # a delivery answered since
        session.execute(
            Delivery.__table__.update()
            .where(Delivery.campaign_id == campaign_id)
            .values(status="accepted", last_status_code=201)
        )
    answer = campaigner.get(f"{page_url}/progress.json").json
    again = campaigner.get(page_url).get_data(as_text=True)
    assert len(taken) == 1  # neither read the deliveries again
    assert answer["counts"]["queued"] == 1 and answer["refreshAfter"] == 30
    assert 'data-done="0"' in again

    monotonic.now += 30  # the reading has stood for ten times its cost
    later = campaigner.get(page_url).get_data(as_text=True)
    assert len(taken) == 2 and 'data-done="1"' in later


def test_a_cheap_reading_leaves_the_page_as_it_was(campaigner, catalogue_ready, clock):
    campaign_id = _sending_campaign(catalogue_ready, clock)
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").get_data(as_text=True)
    assert f'data-refresh-after="{views.POLL_SECONDS}"' in page
    assert "Use Refresh to see newer numbers." in page
    assert "takes a while to count" not in page


def test_a_pause_from_the_page_shows_a_fresh_reading(
    campaigner, catalogue_ready, clock, monkeypatch
):
    app = catalogue_ready
    campaign_id = _sending_campaign(app, clock)
    _, taken = costly_readings(monkeypatch, 3.0)
    campaigner.get(f"/staff/campaigns/{campaign_id}")
    paused = campaigner.post(f"/staff/campaigns/{campaign_id}/pause", follow_redirects=True)
    assert paused.status_code == 200
    assert len(taken) == 2  # the paused campaign's own reading
    assert 'data-status="Paused"' in paused.get_data(as_text=True)


def test_while_one_thread_renews_a_kept_reading_the_others_get_the_kept_one():
    """A stale costly reading being read afresh by one request: a second request is
    answered at once with the kept (older) reading, not a second reading beside it; once
    the renewal is in, both get the new one."""
    clock = Clock()
    kept = CostlyReadings(clock)
    assert kept.read("c", _costing(clock, 1.0)).value == 1
    clock.now += REUSE_FACTOR * 1.0  # stale now
    inside, release = threading.Event(), threading.Event()
    taken: list[str] = []

    def slow() -> str:
        taken.append("renewal")
        inside.set()
        release.wait(5)
        clock.now += 1.0
        return "renewed"

    renewal: list[readings.Reading] = []
    renewer = threading.Thread(target=lambda: renewal.append(kept.read("c", slow)))
    renewer.start()
    assert inside.wait(5)
    beside = kept.read("c", lambda: taken.append("beside") or "beside")
    assert beside.value == 1 and taken == ["renewal"]  # the kept one; nothing read beside
    assert kept.seconds_fresh(beside) == 0  # older than its time: ask again soon
    release.set()
    renewer.join(5)
    assert renewal[0].value == "renewed"
    assert kept.read("c", lambda: "again").value == "renewed"


def test_a_renewal_that_fails_lets_the_next_request_read_afresh():
    clock = Clock()
    kept = CostlyReadings(clock)
    kept.read("c", _costing(clock, 1.0))
    clock.now += REUSE_FACTOR * 1.0

    def broken() -> None:
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        kept.read("c", broken)
    assert kept.read("c", lambda: "fresh").value == "fresh"


def test_two_first_readings_at_once_are_each_taken():
    """With nothing kept yet there is nothing to answer with: a second request reads
    too rather than wait (a cheap reading is never kept, so waiting would only slow
    it)."""
    kept = CostlyReadings(Clock())
    inside, release = threading.Event(), threading.Event()

    def slow() -> str:
        inside.set()
        release.wait(5)
        return "first"

    worker = threading.Thread(target=lambda: kept.read("c", slow))
    worker.start()
    assert inside.wait(5)
    assert kept.read("c", lambda: "second").value == "second"
    release.set()
    worker.join(5)


def test_an_ab_test_page_opened_again_does_not_count_its_variants_again(
    campaigner, catalogue_ready, clock, monkeypatch
):
    """The variants' results count all of a campaign's deliveries too: they are part of
    the kept reading, not read again at every opening."""
    app = catalogue_ready
    campaign_id = _sending_campaign(app, clock)
    with db.begin(app) as session:
        session.get(Campaign, campaign_id).variants = [
            {"title": "First", "body": "One"},
            {"title": "Second", "body": "Two"},
        ]
    _, taken = costly_readings(monkeypatch, 3.0)
    counted: list[int] = []
    results = views.variants.results

    def counting(session, campaign):
        counted.append(1)
        return results(session, campaign)

    monkeypatch.setattr(views.variants, "results", counting)
    pages = [campaigner.get(f"/staff/campaigns/{campaign_id}") for _ in range(2)]
    assert [page.status_code for page in pages] == [200, 200]
    assert pages[0].text.count("Second") == pages[1].text.count("Second") > 0
    assert len(taken) == 1 and len(counted) == 1
