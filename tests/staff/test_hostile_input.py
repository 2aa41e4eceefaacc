"""Hostile input on the staff pages: NUL and other control characters in form fields,
route parameters and query strings, and dates at the edge of the calendar.

Each is refused with the field named (a form) or a 404/400 page (the address), and
writes nothing. PostgreSQL refuses NUL in text outright, which is where a missing check
used to surface as a 500.
"""

from __future__ import annotations

import pytest

from portal.staff.models import Role
from tests.helpers import Unchanged, error_summary, field_error

CONTROL = "must not contain control characters"


@pytest.mark.parametrize(
    ("email", "what"),
    [
        ("admin\x00@example.test", "a NUL at character 6"),
        ("admin@exa\x1bmple.test", "U+001B at character 10"),
        ("admin@example.test\x85", "U+0085 at character 19"),
    ],
)
def test_sign_in_refuses_a_control_character_in_the_email(
    app, engine, browser, make_staff, email, what
):
    make_staff("admin@example.test", Role.ADMIN)
    person = browser()
    token = person.token()
    unchanged = Unchanged(engine)
    response = person.client.post(
        "/staff/login", data={"csrf_token": token, "email": email, "password": "whatever"}
    )
    assert response.status_code == 422
    message = f"Email address {CONTROL} (there is {what})"
    assert field_error(response.text, "email") == message
    assert error_summary(response.text) == [("email", message)]
    assert unchanged.changed() == []
    assert person.cookie is None


OVERRIDE = "it shows the text after it in another order than it is kept"


@pytest.mark.parametrize(
    ("email", "message"),
    [
        ("new\x00person@example.test", f"{CONTROL} (there is a NUL at character 4)"),
        # Invisible: a second account that reads as the first, in the audit trail too.
        ("admin\u200b@example.test",  # a zero-width space
         "must not contain invisible characters (there is U+200B at character 6)"),
        ("admin@exa\u00admple.test",  # a soft hyphen
         "must not contain invisible characters (there is U+00AD at character 10)"),
        ("\ufeffadmin@example.test",
         "must not contain invisible characters (there is U+FEFF at character 1)"),
        # "Offers \u202eLIAM-E" would be kept as typed and read "Offers E-MAIL".
        ("new@example.test\u202d",
         f"must not contain a left-to-right override, U+202D, at character 17: {OVERRIDE}"),
    ],
)  # fmt: skip
def test_adding_staff_refuses_an_address_that_is_not_what_it_shows(
    engine, admin_browser, email, message
):
    token = admin_browser.token()
    unchanged = Unchanged(engine)
    response = admin_browser.client.post(
        "/staff/admin/staff",
        data={
            "csrf_token": token,
            "email": email,
            "roles": ["admin"],
            "password": "a brand new passphrase",
        },
    )
    assert response.status_code == 422
    assert field_error(response.text, "email") == f"Email address {message}"
    assert ("email", f"Email address {message}") in error_summary(response.text)
    assert unchanged.changed() == []


def test_a_query_string_read_through_a_form_names_an_override(engine, admin_browser):
    unchanged = Unchanged(engine)
    filtered = admin_browser.get("/staff/admin/audit?actor=a%E2%80%AEb")
    assert filtered.status_code == 422
    assert field_error(filtered.text, "actor") == (
        f"Staff email must not contain a right-to-left override, U+202E, at character 2: {OVERRIDE}"
    )
    assert unchanged.changed() == []


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("actor=a%00b@example.test", "actor", f"Staff email {CONTROL} (there is a NUL at character 2)"),
        ("actor=ann%0A@example.test", "actor", f"Staff email {CONTROL} (there is a line break at character 4)"),
        ("date_from=2026-01-01%00", "date_from", f"From {CONTROL} (there is a NUL at character 11)"),
        ("date_to=9999-12-31", "date_to", "To must be on or before 9999-12-30"),
        ("date_from=9999-12-31&date_to=9999-12-31", "date_from", "From must be on or before 9999-12-30"),
        ("date_to=10000-01-01", "date_to", "To must be a real date, like 2026-03-27"),
    ],
)  # fmt: skip
def test_the_audit_filters_refuse_control_characters_and_far_dates(
    engine, admin_browser, query, field, message
):
    unchanged = Unchanged(engine)
    response = admin_browser.get(f"/staff/admin/audit?{query}")
    assert response.status_code == 422
    assert field_error(response.text, field) == message
    assert (field, message) in error_summary(response.text)
    assert unchanged.changed() == []


def test_the_first_and_last_days_of_the_calendar_filter_the_audit_trail(admin_browser):
    response = admin_browser.get("/staff/admin/audit?date_from=0001-01-01&date_to=9999-12-30")
    assert response.status_code == 200
    assert error_summary(response.text) == []
    assert "admin@example.test" in response.text  # the sign-in is within the range


@pytest.mark.parametrize(
    "keyset",
    ["before=%C2%B2", "after=%D9%A3", "before=1%00", "before=abc", "after=", "before=-1",
     "before=1e3", "after=" + "9" * 19],
)  # fmt: skip
def test_audit_paging_refuses_keysets_that_are_not_ascii_digits(engine, admin_browser, keyset):
    """``"²".isdigit()`` is true but ``int("²")`` fails: only ASCII digits are a page key,
    and anything else is a bad address, not silently the first page."""
    unchanged = Unchanged(engine)
    response = admin_browser.get(f"/staff/admin/audit?{keyset}")
    assert response.status_code == 400
    assert "Bad request" in response.text
    assert unchanged.changed() == []
    assert admin_browser.get("/staff/admin/audit?before=12").status_code == 200


@pytest.mark.parametrize(
    ("query", "status"),
    [("before=garbage", 400), ("before=", 400), ("before=0190a000-0000-7000-8000-000000000000", 404)],
)  # fmt: skip
def test_campaign_paging_refuses_what_names_no_campaign(engine, make_staff, browser, query, status):
    """The "older" link names the last campaign shown; anything else is a bad address, and
    a campaign that does not exist is not found, never silently the first page."""
    make_staff("campaigns@example.test", Role.CAMPAIGNS)
    person = browser()
    assert person.sign_in("campaigns@example.test").status_code == 303
    unchanged = Unchanged(engine)
    response = person.get(f"/staff/campaigns?{query}")
    assert response.status_code == status
    assert unchanged.changed() == []


@pytest.mark.parametrize(
    "path",
    [
        "/staff/admin/topics/offers%00/edit",
        "/staff/admin/topics/off%0Ders/retire",
        "/staff/admin/policies/versions/v1%00",
        "/staff/admin/policies/versions/v%1B1",
    ],
)
def test_topic_slugs_and_policy_versions_in_the_address_are_refused(
    engine, catalogue_ready, admin_browser, path
):
    unchanged = Unchanged(engine)
    assert admin_browser.get(path).status_code == 404
    if "/topics/" in path:  # the policy pages take no POST
        assert admin_browser.post(path).status_code == 404
    assert unchanged.changed() == []


@pytest.mark.parametrize("path", ["/policy/v1%00", "/policy/v%0A1"])
def test_the_public_policy_page_refuses_control_characters_in_the_version(
    client, catalogue_ready, path
):
    response = client.get(path)
    assert response.status_code == 404
    assert "Page not found" in response.text


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("label", "Product\x00news", f"Label {CONTROL} (there is a NUL at character 8)"),
        ("label", "Product\nnews", f"Label {CONTROL} (there is a line break at character 8)"),
        ("category", "News\x07", f"Category {CONTROL} (there is U+0007 at character 5)"),
        ("slug", "product\x00news", f"Slug {CONTROL} (there is a NUL at character 8)"),
        ("description", "Once\x00a month", f"Description {CONTROL} (there is a NUL at character 5)"),
    ],
)  # fmt: skip
def test_a_new_topic_refuses_control_characters(
    engine, catalogue_ready, admin_browser, field, value, message
):
    data = {
        "slug": "product-news",
        "category": "News",
        "label": "Product news",
        "description": "New features.\r\nOnce a month.\tNo more.",
        "topic_class": "marketing",
        "default_state": "opt_out",
        field: value,
    }
    token = admin_browser.token()
    unchanged = Unchanged(engine)
    response = admin_browser.client.post(
        "/staff/admin/topics/new", data={"csrf_token": token, **data}
    )
    assert response.status_code == 422
    assert field_error(response.text, field) == message
    assert (field, message) in error_summary(response.text)
    assert unchanged.changed() == []


def test_a_description_keeps_its_line_breaks_and_tabs(engine, catalogue_ready, admin_browser):
    response = admin_browser.post(
        "/staff/admin/topics/new",
        {
            "slug": "product-news",
            "category": "News",
            "label": "Product news",
            "description": "New features.\r\nOnce a month.\tNo more.",
            "topic_class": "marketing",
            "default_state": "opt_out",
            "action": "create",
        },
    )
    assert response.status_code == 303


def test_editing_a_topic_refuses_a_control_character_in_the_label(
    engine, catalogue_ready, admin_browser
):
    token = admin_browser.token()
    unchanged = Unchanged(engine)
    response = admin_browser.client.post(
        "/staff/admin/topics/offers/edit",
        data={"csrf_token": token, "label": "Offers\x00", "description": ""},
    )
    assert response.status_code == 422
    assert field_error(response.text, "label") == f"Label {CONTROL} (there is a NUL at character 7)"
    assert unchanged.changed() == []


@pytest.mark.parametrize("action", ["preview", "publish"])
def test_a_policy_text_with_a_nul_is_refused(engine, catalogue_ready, admin_browser, action):
    token = admin_browser.token()
    unchanged = Unchanged(engine)
    response = admin_browser.client.post(
        "/staff/admin/policies/new",
        data={"csrf_token": token, "version": "v2", "text": "We send\x00 what you choose.",
              "action": action},
    )  # fmt: skip
    assert response.status_code == 422
    message = f"Notice text {CONTROL} (there is a NUL at character 8)"
    assert field_error(response.text, "text") == message
    assert ("text", message) in error_summary(response.text)
    assert unchanged.changed() == []


def test_a_query_string_with_a_control_character_is_a_bad_request(engine, admin_browser):
    unchanged = Unchanged(engine)
    response = admin_browser.get("/staff/campaigns?before=%00")
    assert response.status_code == 400
    assert "Bad request" in response.text
    assert admin_browser.client.get("/staff/login?next=/staff/%0D%0Aevil").status_code == 400
    assert unchanged.changed() == []


@pytest.mark.parametrize(
    ("email", "what"),
    [("ops\x07@example.test", "U+0007 at character 4"), ("ops\udcff@x.test", None)],
)
def test_the_create_staff_command_refuses_what_the_form_refuses(app, engine, email, what):
    """The same rule at the other door: a control character, or a byte that is not UTF-8
    (the shell passes it through as a lone surrogate)."""
    unchanged = Unchanged(engine)
    result = app.test_cli_runner().invoke(
        args=["portal", "create-staff", email, "--role", "admin", "--password-stdin"],
        input="a brand new passphrase\n",
    )
    assert result.exit_code == 1
    expected = (
        f"Email address {CONTROL} (there is {what})"
        if what
        else "Email address must be text (it has an unpaired surrogate character)"
    )
    assert result.output == f"Error: {expected}\n"
    assert unchanged.changed() == []
