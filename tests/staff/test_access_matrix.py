"""Every staff route refuses anonymous visitors and every role it does not name.

The expectations table must list every rule under /staff: a new route that is left out
fails this test, so nobody can add a staff page without deciding who may use it.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest

from portal.staff.models import Role

ANY = frozenset(Role)
ADMIN = frozenset({Role.ADMIN})
COMPLIANCE = frozenset({Role.COMPLIANCE})
AUDIT = frozenset({Role.ADMIN, Role.COMPLIANCE})
CAMPAIGNS = frozenset({Role.CAMPAIGNS})

EXPECTED: dict[tuple[str, str], frozenset[Role]] = {
    ("/staff/", "GET"): ANY,
    ("/staff/logout", "POST"): ANY,
    ("/staff/password", "GET"): ANY,
    ("/staff/password", "POST"): ANY,
    ("/staff/admin/staff", "GET"): ADMIN,
    ("/staff/admin/staff", "POST"): ADMIN,
    ("/staff/admin/staff/<uuid:staff_id>", "GET"): ADMIN,
    ("/staff/admin/staff/<uuid:staff_id>/roles", "POST"): ADMIN,
    ("/staff/admin/staff/<uuid:staff_id>/disable", "POST"): ADMIN,
    ("/staff/admin/staff/<uuid:staff_id>/enable", "POST"): ADMIN,
    ("/staff/admin/audit", "GET"): AUDIT,
    ("/staff/ops/feedback", "GET"): ADMIN,
    ("/staff/ops/feedback/test", "POST"): ADMIN,
    ("/staff/ops/jobs", "GET"): ADMIN,
    ("/staff/ops/jobs/<name>/run", "POST"): ADMIN,
    ("/staff/admin/topics", "GET"): ADMIN,
    ("/staff/admin/topics/new", "GET"): ADMIN,
    ("/staff/admin/topics/new", "POST"): ADMIN,
    ("/staff/admin/topics/<slug>/edit", "GET"): ADMIN,
    ("/staff/admin/topics/<slug>/edit", "POST"): ADMIN,
    ("/staff/admin/topics/<slug>/retire", "GET"): ADMIN,
    ("/staff/admin/topics/<slug>/retire", "POST"): ADMIN,
    ("/staff/admin/policies", "GET"): ADMIN,
    ("/staff/admin/policies/new", "GET"): ADMIN,
    ("/staff/admin/policies/new", "POST"): ADMIN,
    ("/staff/admin/policies/versions/<version>", "GET"): ADMIN,
    ("/staff/compliance/", "GET"): COMPLIANCE,
    ("/staff/compliance/lookup", "GET"): COMPLIANCE,
    ("/staff/compliance/lookup", "POST"): COMPLIANCE,
    ("/staff/compliance/subscribers/<uuid:subscriber_id>", "GET"): COMPLIANCE,
    ("/staff/compliance/subscribers/<uuid:subscriber_id>/erase", "GET"): COMPLIANCE,
    ("/staff/compliance/subscribers/<uuid:subscriber_id>/erase", "POST"): COMPLIANCE,
    ("/staff/compliance/export", "GET"): COMPLIANCE,
    ("/staff/compliance/export", "POST"): COMPLIANCE,
    ("/staff/compliance/verify-log", "POST"): COMPLIANCE,
    ("/staff/compliance/signing-key", "GET"): AUDIT,
    ("/staff/compliance/consent-log", "GET"): AUDIT,
    ("/staff/campaigns", "GET"): CAMPAIGNS,
    ("/staff/campaigns/new", "GET"): CAMPAIGNS,
    ("/staff/campaigns/new", "POST"): CAMPAIGNS,
    ("/staff/campaigns/test-send", "POST"): CAMPAIGNS,
    ("/staff/campaigns/test-send/<uuid:campaign_id>", "GET"): CAMPAIGNS,
    ("/staff/campaigns/<uuid:campaign_id>", "GET"): CAMPAIGNS,
    ("/staff/campaigns/<uuid:campaign_id>/progress.json", "GET"): CAMPAIGNS,
    ("/staff/campaigns/<uuid:campaign_id>/pause", "POST"): CAMPAIGNS,
    ("/staff/campaigns/<uuid:campaign_id>/resume", "POST"): CAMPAIGNS,
    ("/staff/campaigns/<uuid:campaign_id>/cancel", "POST"): CAMPAIGNS,
    ("/staff/campaigns/<uuid:campaign_id>/clone", "POST"): CAMPAIGNS,
    ("/staff/campaigns/drafts/<uuid:draft_id>", "GET"): CAMPAIGNS,
    ("/staff/campaigns/test-devices", "GET"): CAMPAIGNS,
    ("/staff/campaigns/test-devices", "POST"): CAMPAIGNS,
    ("/staff/campaigns/test-devices/<int:device_id>/rename", "POST"): CAMPAIGNS,
    ("/staff/campaigns/test-devices/<int:device_id>/remove", "POST"): CAMPAIGNS,
    ("/staff/campaigns/device-test", "POST"): CAMPAIGNS,
    ("/staff/campaigns/device-test/<uuid:send_id>", "GET"): CAMPAIGNS,
}
PUBLIC = {"/staff/login"}


def is_staff_rule(app, rule) -> bool:
    """A staff route wherever it is mounted: under /staff, on the staff blueprint, or
    guarded by @staff_required (the sign-in page aside)."""
    if rule.rule in PUBLIC:
        return False
    view = app.view_functions[rule.endpoint]
    return (
        rule.rule.startswith("/staff")
        or rule.endpoint.startswith("staff.")
        or hasattr(view, "staff_roles")
    )


def staff_routes(app) -> set[tuple[str, str]]:
    found = set()
    for rule in app.url_map.iter_rules():
        if is_staff_rule(app, rule):
            for method in rule.methods - {"HEAD", "OPTIONS"}:
                found.add((rule.rule, method))
    return found


def test_the_table_lists_every_staff_route(app):
    found = staff_routes(app)
    missing = found - EXPECTED.keys()
    assert not missing, f"staff routes without an expectation: {sorted(missing)}"
    stale = EXPECTED.keys() - found
    assert not stale, f"expectations for routes that no longer exist: {sorted(stale)}"


def test_every_staff_view_declares_its_roles(app):
    for rule in app.url_map.iter_rules():
        if is_staff_rule(app, rule):
            view = app.view_functions[rule.endpoint]
            assert hasattr(view, "staff_roles"), f"{rule.rule} has no @staff_required"
            method_roles = {EXPECTED[(rule.rule, m)] for m in rule.methods - {"HEAD", "OPTIONS"}}
            declared = view.staff_roles or ANY
            assert method_roles == {declared}, rule.rule


def test_the_walk_finds_staff_routes_mounted_anywhere(make_app):
    """A guarded view outside /staff, or a staff endpoint at another path, is still a
    staff route: the table above must then name it too."""
    from portal.staff.access import staff_required

    other = make_app()
    other.add_url_rule(
        "/reports/weekly",
        endpoint="reports.weekly",
        view_func=staff_required(Role.ADMIN)(lambda: "report"),
    )
    other.add_url_rule(
        "/elsewhere", endpoint="staff.elsewhere", view_func=lambda: "x", methods=["POST"]
    )
    other.add_url_rule("/not-staff", endpoint="pages.not_staff", view_func=lambda: "x")
    found = staff_routes(other)
    assert {("/reports/weekly", "GET"), ("/elsewhere", "POST")} <= found
    assert ("/not-staff", "GET") not in found
    assert found - EXPECTED.keys() == {("/reports/weekly", "GET"), ("/elsewhere", "POST")}


def _url(rule: str, staff_id) -> str:
    # Plain segments (a topic slug, a policy version) name nothing: the page answers 404.
    samples = {"uuid": str(staff_id), "int": "999999", "default": "no-such-thing"}
    return re.sub(r"<(?:(\w+):)?\w+>", lambda m: samples[m.group(1) or "default"], rule)


@pytest.fixture
def victim(make_staff):
    return make_staff("victim@example.test", Role.CAMPAIGNS)


@pytest.mark.parametrize(("rule", "method"), sorted(EXPECTED))
def test_anonymous_visitors_are_sent_to_sign_in(app, browser, victim, rule, method):
    anonymous = browser()
    url = _url(rule, victim.id)
    if method == "GET":
        response = anonymous.get(url)
        assert response.status_code == 302
        target = urlsplit(response.location)
        assert target.path == "/staff/login"
        assert parse_qs(target.query) == {"next": [url]}
    else:
        response = anonymous.post(url)  # with a valid CSRF token: the role check refuses
        assert response.status_code in {303, 401, 403}
        if response.status_code == 303:
            assert urlsplit(response.location).path == "/staff/login"
    assert anonymous.cookie is None


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize(("rule", "method"), sorted(EXPECTED))
def test_each_role_gets_exactly_its_routes(app, browser, make_staff, victim, role, rule, method):
    email = f"{role.value}@example.test"
    make_staff(email, role)
    person = browser()
    assert person.sign_in(email).status_code == 303
    url = _url(rule, victim.id)
    response = person.get(url) if method == "GET" else person.post(url)
    if role in EXPECTED[(rule, method)]:
        assert response.status_code != 403
        assert response.status_code < 500
        assert "/staff/login" not in (response.location or "") or rule == "/staff/logout"
    else:
        assert response.status_code == 403
        assert "You do not have access to this page" in response.text


def test_a_staff_route_without_an_access_rule_is_refused(make_app, make_staff, browser):
    other = make_app()
    other.add_url_rule("/staff/unguarded", endpoint="staff.unguarded", view_func=lambda: "open")
    make_staff("admin@example.test", Role.ADMIN)
    admin = browser(other)
    admin.sign_in("admin@example.test")
    response = admin.get("/staff/unguarded")
    assert response.status_code == 500
    assert "open" not in response.text


def test_the_forbidden_page_names_the_role_needed(app, browser, make_staff):
    make_staff("camp@example.test", Role.CAMPAIGNS)
    person = browser()
    person.sign_in("camp@example.test")
    response = person.get("/staff/admin/audit")
    assert response.status_code == 403
    assert "<strong>admin</strong> or <strong>compliance</strong>" in response.text


def test_the_dashboard_lists_only_what_each_role_may_do(app, browser, make_staff):
    expected = {
        Role.ADMIN: {
            "Staff accounts",
            "Audit trail",
            "Delivery feedback",
            "Background jobs",
            "Change your password",
        },
        Role.COMPLIANCE: {"Audit trail", "Change your password"},
        Role.CAMPAIGNS: {"Campaigns", "Test devices", "Change your password"},
    }
    every = {
        "Staff accounts",
        "Audit trail",
        "Delivery feedback",
        "Background jobs",
        "Campaigns",
        "Test devices",
        "Change your password",
    }
    for role, titles in expected.items():
        make_staff(f"{role.value}@example.test", role)
        person = browser()
        person.sign_in(f"{role.value}@example.test")
        page = person.get("/staff/").text
        main = page[page.index("<main") :]
        for title in every:
            assert (f">{title}</a>" in main) == (title in titles), (role, title)
        assert f"Signed in as <strong>{role.value}@example.test</strong>" in page
