"""The compliance dashboard: weekly opt-ins and opt-outs, the chain status, pending erasures."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import uuid

import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from portal.charts import nice_step
from portal.compliance import services
from portal.compliance.charts import LABEL_SPACE, weekly_chart
from portal.consent import catalogue, log
from portal.consent.models import DecisionWeek, EventKind
from portal.db import db
from portal.jobs import run_job
from portal.operations.models import JobRun, JobState
from portal.operations.scheduler import run_recorded
from portal.subscriptions.models import Subscriber
from tests.helpers import all_rows, sent_statements

# The clock's Thursday, 2026-01-01: its week starts on Monday 2025-12-29.
MONDAY = dt.date(2025, 12, 29)


def _decide(app, slug, state, when):
    with db.begin(app) as session:
        log.append(
            session,
            kind=EventKind.PREFERENCE_CHANGED,
            subscriber_id=uuid.uuid4(),
            topic_id=catalogue.topic_by_slug(session, slug).id,
            previous_state="unset",
            new_state=state,
            source="preference-centre",
            actor="subscriber",
            recorded_at=when,
            policy_version="v1",
        )


def _at(day: dt.date, hour: int = 12) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(hour), tzinfo=dt.UTC)


def test_weekly_counts(app, clock, catalogue_ready):
    _decide(app, "offers", "opt_in", _at(MONDAY, 0))  # this week, first moment
    _decide(app, "offers", "opt_in", _at(MONDAY + dt.timedelta(days=3)))
    _decide(app, "offers", "opt_out", _at(MONDAY - dt.timedelta(days=1), 23))  # last Sunday
    _decide(app, "weekly-digest", "opt_out", _at(MONDAY - dt.timedelta(weeks=11)))
    _decide(app, "weekly-digest", "opt_in", _at(MONDAY - dt.timedelta(weeks=12)))  # too old
    with db.begin(app) as session:  # not a preference change: not counted
        log.append(
            session,
            kind=EventKind.SUBSCRIBED,
            subscriber_id=uuid.uuid4(),
            source="api",
            actor="subscriber",
            recorded_at=_at(MONDAY),
        )
    with app.app_context():
        weeks = services.weekly_decisions(db.session, clock.now())
    by_slug = {item.topic.slug: item for item in weeks}
    assert list(by_slug) == ["security-alerts", "order-updates", "weekly-digest", "offers"]
    offers = by_slug["offers"].weeks
    assert len(offers) == 12
    assert offers[-1] == services.WeekCount(MONDAY, 2, 0)
    assert offers[-2] == services.WeekCount(MONDAY - dt.timedelta(weeks=1), 0, 1)
    digest = by_slug["weekly-digest"].weeks
    assert digest[0] == services.WeekCount(MONDAY - dt.timedelta(weeks=11), 0, 1)
    assert by_slug["weekly-digest"].totals == (0, 1)


# A statement that counts the consent log's preference changes by week.
COUNTS_WEEKS = re.compile(r"(?is)SELECT .*count\(\*\).*FROM consent_event.*GROUP BY")


def _weeks(app, clock) -> dict[str, list[services.WeekCount]]:
    with app.app_context():
        weeks = services.weekly_decisions(db.session, clock.now())
        db.session.commit()
    return {item.topic.slug: item.weeks for item in weeks}


def _kept(app) -> list[tuple[dt.date, dict[str, int]]]:
    with db.begin(app) as session:
        rows = session.scalars(sa.select(DecisionWeek).order_by(DecisionWeek.week)).all()
        return [(row.week, dict(row.counts)) for row in rows]


def test_a_past_week_is_counted_once_and_kept_and_only_this_week_is_counted_again(
    app, clock, engine, catalogue_ready
):
    _decide(app, "offers", "opt_in", _at(MONDAY + dt.timedelta(days=1)))  # this week
    _decide(app, "offers", "opt_out", _at(MONDAY - dt.timedelta(days=1), 23))  # last week
    _decide(app, "offers", "opt_in", _at(MONDAY - dt.timedelta(weeks=5)))
    with sent_statements(engine, COUNTS_WEEKS) as counting:
        first = _weeks(app, clock)
    # One count of the eleven past weeks, kept; one of this week.
    assert len(counting) == 2
    kept = _kept(app)
    assert [week for week, _ in kept] == [MONDAY - dt.timedelta(weeks=n) for n in range(11, 0, -1)]
    with db.begin(app) as session:
        offers = catalogue.topic_by_slug(session, "offers").id
    assert kept[-1] == (MONDAY - dt.timedelta(weeks=1), {f"{offers}:opt_out": 1})
    assert kept[-5] == (MONDAY - dt.timedelta(weeks=5), {f"{offers}:opt_in": 1})
    assert [counts for _, counts in kept].count({}) == 9

    # A new decision this week counts at once; the past weeks are read as kept: an
    # event dated into one of them behind the log's back (never done by the app) does
    # not change them, and this week alone is counted again.
    _decide(app, "offers", "opt_in", _at(MONDAY + dt.timedelta(days=2)))
    _decide(app, "offers", "opt_in", _at(MONDAY - dt.timedelta(weeks=3)))
    with sent_statements(engine, COUNTS_WEEKS) as counting:
        second = _weeks(app, clock)
    assert len(counting) == 1
    (_, parameters) = counting[0]
    values = list(parameters.values()) if isinstance(parameters, dict) else list(parameters)
    assert any(str(value).startswith(str(MONDAY)) for value in values)  # from this Monday
    assert second["offers"][-1] == services.WeekCount(MONDAY, 2, 0)
    assert second["offers"][:-1] == first["offers"][:-1]
    assert second["offers"][-4] == services.WeekCount(MONDAY - dt.timedelta(weeks=3), 0, 0)


def test_the_week_just_ended_is_counted_afresh_for_an_hour_then_kept(app, clock, catalogue_ready):
    # Monday 00:30: last week's last decisions may still be committing.
    next_monday = MONDAY + dt.timedelta(weeks=1)
    clock.set(_at(next_monday, 0) + dt.timedelta(minutes=30))
    _decide(app, "offers", "opt_in", _at(MONDAY + dt.timedelta(days=6), 23))
    weeks = _weeks(app, clock)
    assert weeks["offers"][-2] == services.WeekCount(MONDAY, 1, 0)
    assert MONDAY not in [week for week, _ in _kept(app)]
    # One committed late, recorded in the last minute of the week.
    _decide(
        app, "offers", "opt_out", _at(MONDAY + dt.timedelta(days=6), 23) + dt.timedelta(minutes=59)
    )
    clock.advance(hours=1)
    weeks = _weeks(app, clock)
    assert weeks["offers"][-2] == services.WeekCount(MONDAY, 1, 1)
    with db.begin(app) as session:
        offers = catalogue.topic_by_slug(session, "offers").id
    assert (MONDAY, {f"{offers}:opt_in": 1, f"{offers}:opt_out": 1}) in _kept(app)


def test_kept_weeks_older_than_the_chart_are_deleted_by_table_retention(
    app, clock, catalogue_ready
):
    _weeks(app, clock)
    assert len(_kept(app)) == 11
    clock.advance(days=7 * 3)  # three weeks on: the three oldest kept are off the chart
    run_job(app, "table-retention")
    assert [week for week, _ in _kept(app)] == [
        MONDAY - dt.timedelta(weeks=n) for n in range(8, 0, -1)
    ]
    _weeks(app, clock)
    assert len(_kept(app)) == 11  # the chart's eleven past weeks, the newest counted now


def test_the_chart_is_accessible_svg_with_a_table(app, clock, officer, catalogue_ready):
    _decide(app, "offers", "opt_in", _at(MONDAY))
    _decide(app, "offers", "opt_in", _at(MONDAY))
    _decide(app, "offers", "opt_out", _at(MONDAY))
    html = officer.get("/staff/compliance/").text
    assert "<script" not in html.split("</main>")[0]
    chart = html[html.index('<section class="chart" aria-labelledby="chart-3-heading">') :]
    chart = chart[: chart.index("</section>")]
    assert 'role="img" aria-labelledby="chart-3-title chart-3-desc"' in chart
    assert '<title id="chart-3-title">Offers: opt-ins and opt-outs per week</title>' in chart
    assert "2 opt-ins and 1 opt-outs over the 12 weeks" in chart
    assert 'fill="url(#chart-3-hatch)"' in chart  # opt-outs striped, not only coloured
    assert re.search(r'class="chart__value" text-anchor="middle">2</text>', chart)
    assert "style=" not in chart
    table = chart[chart.index("<table>") :]
    assert "<caption>Offers: opt-ins and opt-outs per week</caption>" in table
    assert '<th scope="col">Opt-ins</th>' in table
    assert (
        '<tr><th scope="row"><time datetime="2025-12-29">29 December 2025</time> (so far)</th>'
        "<td>2</td><td>1</td></tr>" in table
    )
    assert "Opt-outs: striped bars" in html


def test_chart_geometry():
    assert [nice_step(n) for n in (1, 4, 5, 9, 20, 21, 120, 4000)] == [
        1, 1, 2, 5, 5, 10, 50, 1000
    ]  # fmt: skip
    topic = type("T", (), {"label": "X"})()
    weeks = [services.WeekCount(MONDAY - dt.timedelta(weeks=11 - i), i, 0) for i in range(12)]
    chart = weekly_chart(services.TopicWeeks(topic, weeks), 0)
    tallest = max(chart.bars, key=lambda b: b.height)
    assert tallest.value == 11
    assert tallest.y >= 18  # inside the plot, under the top margin
    assert all(b.y + b.height == chart.baseline for b in chart.bars if b.height)
    assert chart.ticks[-1].value >= 11


def test_chain_status_before_and_after_a_check(app, engine, clock, officer, person):
    page = officer.get("/staff/compliance/").text
    assert (
        "<strong>Not verified yet</strong>: no check of the log has finished, so none of its "
        "6 events have been verified." in page
    )
    assert "The log holds 6 events now." in page
    # Nothing is due until someone asks.
    with app.app_context():
        assert db.session.get(JobState, "verify-log") is None
    response = officer.post("/staff/compliance/verify-log")
    assert response.status_code == 303
    page = officer.get(response.location).text
    assert "Check requested: the scheduler starts it within half a minute." in page
    assert "<strong>Check requested</strong>" in page
    assert "Check the whole log now" not in page  # no second request while one is queued
    again = officer.post("/staff/compliance/verify-log")
    assert "A check is already under way" in officer.get(again.location).text
    # The next scheduler tick in any process runs it.
    report = run_recorded(app, "verify-log", trigger="scheduler", only_if_due=True)
    assert report is not None
    assert report.processed == 6
    page = officer.get("/staff/compliance/").text
    assert "<strong>Intact</strong>" in page
    assert "when last verified, 2026-01-01 00:20:00 UTC: 6 events checked in" in page
    assert "written since that check" not in page
    assert "<strong>Check requested</strong>" not in page
    (row,) = [
        r
        for r in all_rows(engine, "staff_audit")
        if r["action"] == services.Action.LOG_VERIFICATION
    ]
    assert row["actor_email"] == "officer@example.test"
    assert row["target"] == "consent-log"


def _log_check(app, clock, **fields) -> None:
    """A run of the verify-log job recorded now: unfinished unless ``seconds`` is given."""
    with db.begin(app) as session:
        session.add(
            JobRun(
                name="verify-log",
                trigger="scheduler",
                host="h",
                started_at=clock.now(),
                changed=0,
                **fields,
            )
        )


def test_a_broken_chain_and_a_running_check_are_shown(app, clock, officer, catalogue_ready):
    _log_check(
        app,
        clock,
        seconds=1.5,
        processed=10,
        error="consent log broken at event 7: hash does not match its content (altered)",
    )
    page = officer.get("/staff/compliance/").text
    assert "<strong>Broken</strong>" in page
    assert "event 7: hash does not match its content" in page
    clock.advance(minutes=1)
    _log_check(app, clock, processed=0)  # started, not finished
    page = officer.get("/staff/compliance/").text
    assert "<strong>Checking now</strong>: started 2026-01-01 00:01:00 UTC" in page
    assert "<strong>Broken</strong>" in page  # the last verdict stays until the new one
    again = officer.post("/staff/compliance/verify-log")
    assert "A check is already under way" in officer.get(again.location).text
    # A run that never finished (its process died) stops counting after an hour.
    clock.advance(minutes=61)
    officer.sign_in("officer@example.test")
    page = officer.get("/staff/compliance/").text
    assert "Checking now" not in page
    assert "Check the whole log now" in page


def test_the_verify_log_job(app, person):
    report = run_job(app, "verify-log")
    assert report.processed == 6
    assert report.problems == []
    result = app.test_cli_runner().invoke(args=["portal", "run-job", "verify-log"])
    assert result.exit_code == 0
    assert "verify-log: 6 rows looked at" in result.output


def test_pending_erasures_count_devices_until_they_are_told(app, engine, clock, officer, person):
    page = officer.get("/staff/compliance/").text
    assert "<strong>0</strong> devices of erased people have not yet been told to stop" in page
    assert "not tombstoned" not in page

    erased = officer.post(
        f"/staff/compliance/subscribers/{person.subscriber_id}/erase", {"confirm": "y"}
    )
    assert erased.status_code == 303
    page = officer.get("/staff/compliance/").text
    assert "<strong>1</strong> device of erased people has not yet been told to stop" in page
    assert "the next time it visits the site" in page

    clock.advance(minutes=1)
    beat = person.client.post("/api/push/heartbeat", json={"endpoint": person.sub.endpoint})
    assert beat.json["action"] == "unsubscribe"
    [row] = [r for r in all_rows(engine, "push_subscription") if r["end_reason"] == "erased"]
    assert row["browser_told_at"] is not None
    page = officer.get("/staff/compliance/").text
    assert "<strong>0</strong> devices of erased people have not yet been told to stop" in page

    # Told once: a later heartbeat keeps the first time.
    first = row["browser_told_at"]
    clock.advance(minutes=1)
    person.client.post("/api/push/heartbeat", json={"endpoint": person.sub.endpoint})
    [row] = [r for r in all_rows(engine, "push_subscription") if r["end_reason"] == "erased"]
    assert row["browser_told_at"] == first


def test_an_erasure_that_left_a_subscription_behind_is_a_fault(app, clock, officer, person):
    # An erasure that (against the rules) left a subscription behind is counted.
    with db.begin(app) as session:
        session.get(Subscriber, person.subscriber_id).erased_at = clock.now()
    page = officer.get("/staff/compliance/").text
    assert "<strong>1</strong> subscription of erased people is not tombstoned" in page
    assert "tell the operators" in page


def test_a_device_registering_again_is_no_longer_pending(app, officer, person):
    officer.post(f"/staff/compliance/subscribers/{person.subscriber_id}/erase", {"confirm": "y"})
    # Its own browser (the device cookie names the tombstone) registers it again.
    again = person.client.post("/api/push/subscribe", json={"subscription": person.sub.to_json()})
    assert again.status_code == 200  # the tombstone comes back for a new subscriber
    page = officer.get("/staff/compliance/").text
    assert "<strong>0</strong> devices of erased people have not yet been told to stop" in page


def test_the_dashboard_is_listed_for_compliance(app, officer):
    home = officer.get("/staff/").text
    for title in (
        "Compliance dashboard",
        "Consent look-up",
        "Export consent history",
        "Export signing key",
    ):
        assert f">{title}</a>" in home


@given(st.integers(min_value=1, max_value=160))
def test_week_labels_never_overlap_and_the_newest_week_is_labelled(count):
    topic = type("T", (), {"label": "X"})()
    weeks = [
        services.WeekCount(MONDAY - dt.timedelta(weeks=count - 1 - i), 1, 0) for i in range(count)
    ]
    chart = weekly_chart(services.TopicWeeks(topic, weeks), 0)
    xs = [label.x for label in chart.labels]
    assert all(b - a >= LABEL_SPACE - 0.2 for a, b in itertools.pairwise(xs)), xs  # 0.2: rounding
    assert chart.labels[-1].text == f"{weeks[-1].week:%d %b}"
    assert xs[-1] < chart.right  # inside the chart
    if count <= 11:  # 586 units of plot: up to 10 weeks fit a label each
        assert len(chart.labels) == count or count == 11


def test_events_written_since_the_last_check_are_not_called_verified(app, clock, officer, person):
    _log_check(app, clock, seconds=0.1, processed=0)  # a check of the log while it was still empty
    page = officer.get("/staff/compliance/").text
    when = f"{clock.now():%Y-%m-%d %H:%M:%S} UTC"
    assert f"when last verified, {when}: the log was empty then." in page
    assert "<strong>Not verified yet</strong>: 6 events written since that check." in page
    assert "0 events checked" not in page
    clock.advance(minutes=1)
    _log_check(app, clock, seconds=0.1, processed=6)
    page = officer.get("/staff/compliance/").text
    assert "6 events checked in 0.1 s" in page
    assert "Not verified yet" not in page


def test_a_log_shorter_than_its_last_check_is_flagged(app, clock, officer, person):
    _log_check(app, clock, seconds=0.1, processed=60)
    page = officer.get("/staff/compliance/").text
    assert (
        "<strong>Fewer events than were checked</strong>: the log holds 6, the last check read 60."
        in page
    )


def test_an_empty_log_never_checked_says_so(officer):
    page = officer.get("/staff/compliance/").text
    assert (
        "<strong>Not verified yet</strong>: no check of the log has finished, and the log is "
        "empty." in page
    )
