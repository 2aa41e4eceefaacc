"""The answer → state function (SPEC §5), with property tests over answer sequences."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from portal.config import RetrySettings
from portal.subscriptions.lifecycle import (
    MAX_RETRY_AFTER,
    Lifecycle,
    Outcome,
    PushAnswer,
    apply_answer,
    backoff_delay,
    may_retry,
    parse_retry_after,
)
from portal.subscriptions.models import PushService, SubscriptionState

S = SubscriptionState
TRANSIENT = [429, 500, 502, 503, 504, None]


def test_success_activates_and_zeroes_failures():
    after = apply_answer(Lifecycle(S.STALE, 2, False), PushAnswer(201))
    assert after.outcome == Outcome.ACCEPTED
    assert after.lifecycle == Lifecycle(S.ACTIVE, 0, True)
    assert apply_answer(Lifecycle(S.PENDING), PushAnswer(200)).lifecycle.state == S.ACTIVE


def test_gone_revokes_at_once_without_retry():
    after = apply_answer(Lifecycle(S.ACTIVE, 0, True), PushAnswer(410))
    assert after.outcome == Outcome.REVOKED
    assert after.lifecycle.state == S.REVOKED


def test_three_404s_in_a_row_make_it_stale():
    life = Lifecycle(S.ACTIVE, 0, True)
    for expected in (S.ACTIVE, S.ACTIVE, S.STALE):
        step = apply_answer(life, PushAnswer(404))
        assert step.outcome == Outcome.FAILED
        life = step.lifecycle
        assert life.state == expected
    assert life.consecutive_failures == 3


def test_a_success_between_404s_resets_the_count():
    life = Lifecycle(S.ACTIVE)
    for status in (404, 404, 201, 404, 404):
        life = apply_answer(life, PushAnswer(status)).lifecycle
    assert life == Lifecycle(S.ACTIVE, 2, True)


@pytest.mark.parametrize("status", [*TRANSIENT, 406])
def test_transient_answers_retry_and_touch_nothing(status):
    life = Lifecycle(S.ACTIVE, 1, True)
    service = PushService.WNS if status == 406 else PushService.FCM
    after = apply_answer(life, PushAnswer(status, service))
    assert after.outcome == Outcome.RETRY
    assert after.lifecycle == life


@pytest.mark.parametrize("status", [400, 401, 403, 413, 406, 301, 100, 600])
def test_other_answers_fail_the_delivery_only(status):
    life = Lifecycle(S.ACTIVE, 1, True)
    after = apply_answer(life, PushAnswer(status, PushService.FCM))
    assert after.outcome == Outcome.FAILED
    assert after.lifecycle == life  # no pruning, no counting


def test_406_is_a_rate_limit_only_from_wns():
    assert (
        apply_answer(Lifecycle(S.ACTIVE), PushAnswer(406, PushService.WNS)).outcome == Outcome.RETRY
    )
    assert (
        apply_answer(Lifecycle(S.ACTIVE), PushAnswer(406, PushService.APPLE)).outcome
        == Outcome.FAILED
    )


services = st.sampled_from(list(PushService))
statuses = st.one_of(
    st.none(),
    st.sampled_from([200, 201, 202, 404, 410, 429, 406, 500, 503, 400, 403, 413]),
    st.integers(100, 599),
)
answers = st.builds(PushAnswer, statuses, services)
states = st.sampled_from(list(SubscriptionState))
lifecycles = st.builds(Lifecycle, states, st.integers(0, 10), st.booleans())


def _transient(answer: PushAnswer) -> bool:
    s = answer.status
    return (
        s is None
        or s == 429
        or 500 <= s < 600
        or (s == 406 and answer.push_service == PushService.WNS)
    )


@settings(max_examples=500)
@given(lifecycles, st.lists(answers, max_size=30))
def test_revoked_only_after_a_410(start, sequence):
    life = start
    for answer in sequence:
        before = life
        life = apply_answer(life, answer).lifecycle
        if life.state == S.REVOKED and before.state != S.REVOKED:
            assert answer.status == 410


@settings(max_examples=500)
@given(lifecycles, st.lists(answers, max_size=30))
def test_transient_answers_never_change_state_or_counters(start, sequence):
    life = start
    for answer in sequence:
        step = apply_answer(life, answer)
        if _transient(answer):
            assert step.lifecycle == life
            assert step.outcome == Outcome.RETRY
        life = step.lifecycle


@settings(max_examples=500)
@given(st.lists(st.one_of(answers, st.just(PushAnswer(404))), max_size=40))
def test_stale_exactly_when_three_404s_in_a_row(sequence):
    life = Lifecycle(S.ACTIVE)
    run = 0  # 404s since the last success
    for answer in sequence:
        life = apply_answer(life, answer).lifecycle
        if answer.status == 410:
            return  # terminal: nothing after it matters here
        if answer.status == 404:
            run += 1
        elif answer.status is not None and 200 <= answer.status < 300:
            run = 0
        assert life.consecutive_failures == run
        assert (life.state == S.STALE) == (run >= 3)


@given(
    st.integers(1, 12), st.floats(0, 1, exclude_max=True), st.one_of(st.none(), st.floats(0, 500))
)
def test_backoff_bounds(attempt, u, retry_after):
    retry = RetrySettings()
    delay = backoff_delay(attempt, retry, retry_after=retry_after, rand=lambda: u)
    base = max(min(2 ** (attempt - 1), 64.0), retry_after or 0)
    assert base <= delay <= base * 1.3 + 1e-9


def test_backoff_schedule():
    retry = RetrySettings()
    assert [backoff_delay(n, retry, rand=lambda: 0.0) for n in range(1, 9)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        64,
    ]
    assert backoff_delay(1, retry, retry_after=30, rand=lambda: 0.0) == 30
    assert backoff_delay(1, retry, rand=lambda: 1.0) == pytest.approx(1.3)
    assert may_retry(4, retry) and not may_retry(5, retry)


def test_retry_after_seconds_and_http_date():
    now = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    assert parse_retry_after("120", now) == 120
    assert parse_retry_after("Sun, 01 Mar 2026 12:01:30 GMT", now) == 90
    assert parse_retry_after("Sun, 01 Mar 2026 11:00:00 GMT", now) == 0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


def test_retry_after_is_ascii_delta_seconds_or_a_date_and_never_more_than_four_weeks():
    now = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    # str.isdigit() takes these; float() refused the first and made inf of the second.
    assert parse_retry_after("\u00b2", now) is None
    assert parse_retry_after("\u0661\u0660", now) is None  # Arabic-Indic 10
    assert parse_retry_after("9" * 400, now) == MAX_RETRY_AFTER
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now) == MAX_RETRY_AFTER
    assert parse_retry_after(str(28 * 24 * 3600 - 1), now) == MAX_RETRY_AFTER - 1


@given(st.text(max_size=60))
def test_any_retry_after_reads_as_none_or_a_bounded_wait(value):
    """A push service's header is read while its batch is out: nothing it says raises."""
    now = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    seconds = parse_retry_after(value, now)
    assert seconds is None or 0.0 <= seconds <= MAX_RETRY_AFTER
    if seconds is not None:
        assert backoff_delay(1, RetrySettings(), retry_after=seconds) < 2 * MAX_RETRY_AFTER
