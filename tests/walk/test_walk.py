"""A Hypothesis-driven walk of every page, form and route parameter of the URL map, as a
stranger, a subscriber and each staff role: no answer is a 5xx, and a refusal changes no
row of any table (tests/walk/walk.py). The JSON API's bodies are fuzzed in tests/api.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from portal import create_app
from tests.walk import walk
from tests.walk.conftest import PERSONAS

# Requests per persona, in the order they walk; at least 5,000 per run.
BUDGET = {"stranger": 800, "subscriber": 1000, "campaigns": 1100, "compliance": 1000, "admin": 1100}
MINIMUM_PER_RUN = 5_000
AT_LEAST_PER_ROUTE = 5


def test_a_run_sends_at_least_five_thousand_requests():
    assert tuple(BUDGET) == PERSONAS
    assert sum(BUDGET.values()) >= MINIMUM_PER_RUN


def test_every_rule_is_walked(world):
    """A new route fails here until the walk can fill in its parameters and has seen the
    form that posts to it on some page."""
    forms = walk.harvest(world)
    assert walk.uncovered(world, forms) == []
    # The forms come from the pages themselves: a few that only a step leads to.
    assert {"action", "topic", "title", "body", "send_at", "timezone"} <= set(
        forms[("/staff/campaigns/new", "POST")].fields
    )
    assert "subscription" in forms[("/staff/campaigns/test-send", "POST")].fields
    assert {"device", "title", "campaign_id"} <= set(
        forms[("/staff/campaigns/device-test", "POST")].fields
    )
    assert {"name", "subscription"} <= set(forms[("/staff/campaigns/test-devices", "POST")].fields)
    assert "previewed" in forms[("/staff/admin/policies/new", "POST")].fields
    assert {"create", "edit", "review"} <= forms[("/staff/admin/topics/new", "POST")].fields[
        "action"
    ]
    assert {"action", "actor", "date_from", "date_to"} <= set(
        forms[("/staff/admin/audit", "GET")].fields
    )
    assert ("/staff/campaigns/<uuid:campaign_id>/resume", "POST") in forms


def test_the_walk_sees_what_is_not_walked(world, settings, clock):
    """A rule with a parameter the world has no values for, and a POST no page offers."""
    forms = walk.harvest(world)
    other = create_app(settings, clock=clock)
    other.add_url_rule("/staff/reports/<report>", "staff.report", lambda report: report)
    other.add_url_rule("/feedback-form", "pages.feedback", lambda: "", methods=["POST"])
    world.app = other
    problems = walk.uncovered(world, forms)
    other.extensions["portal.db"].engine.dispose()
    assert "/staff/reports/<report>: no values for <report>: add them to World.parameters" in (
        problems
    )
    assert "POST /feedback-form: no page offers this form: add the page or step" in problems


def test_the_oracle_sees_a_crash_a_traceback_and_a_refusal_that_wrote(world):
    walker = walk.Walker(world)
    request = walk.WalkRequest("admin", ("/staff/admin/topics/new", "POST"), "POST", "/x", "")
    with pytest.raises(AssertionError, match="answered 500"):
        walker.check(request, 500, "text/html", b"<p>Something went wrong</p>")
    with pytest.raises(AssertionError, match="shows a traceback"):
        walker.check(request, 400, "text/html", b"Traceback (most recent call last):")
    admin = world.personas["admin"]
    answer = admin.client.post(
        "/staff/admin/topics/new",
        data={
            "csrf_token": admin.token,
            "slug": "written",
            "category": "News",
            "label": "Written",
            "topic_class": "marketing",
            "default_state": "opt_out",
            "action": "create",
        },
    )
    assert answer.status_code == 303
    with pytest.raises(AssertionError, match=r"was refused \(422\) but changed \['staff_audit',"):
        walker.check(request, 422, "text/html", b"<p>refused</p>")
    walker.check(request, 422, "text/html", b"<p>refused, and nothing written</p>")
    assert walker.requests == 4


def _walk(walker: walk.Walker, persona: str, chosen: list[walk.Target], forms, n: int) -> None:
    """``n`` requests as ``persona``, each to one of the ``chosen`` targets."""

    @settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        # Every example is a full request and a digest of every table.
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=walk.requests(walker.world, persona, chosen, forms))
    def send(request: walk.WalkRequest) -> None:
        walker.send(request)

    send()


@pytest.mark.fuzz
@pytest.mark.parametrize("persona", PERSONAS)
def test_the_walk(world, walk_report, persona):
    """Each persona walks a world of its own: the five walks are separate tests, so
    parallel workers share them out instead of one worker walking all 5,000 requests."""
    forms = walk.harvest(world)
    assert walk.uncovered(world, forms) == []
    every = sorted(walk.targets(world.app))
    walker = walk.Walker(world)
    _walk(walker, persona, walk.weighted(world, persona, forms), forms, BUDGET[persona])
    # Then every route its share, so none is left to chance.
    for target in every:
        if walker.reached[target] < AT_LEAST_PER_ROUTE:
            _walk(walker, persona, [target], forms, AT_LEAST_PER_ROUTE - walker.reached[target])
    walk_report.append(f"{persona}: {walker.summary()} over {len(every)} rule and method pairs")
    assert min(walker.reached[target] for target in every) >= AT_LEAST_PER_ROUTE
    assert walker.requests >= BUDGET[persona]
