"""The console's 404s say what was not found and lead back to where such things are listed."""

from __future__ import annotations

import uuid

import pytest

from portal.staff.models import Role

MISSING = uuid.UUID("01890000-0000-7000-8000-000000000000")


@pytest.mark.parametrize(
    ("path", "what", "back"),
    [
        (f"/staff/admin/staff/{MISSING}", "No staff user has this address", "/staff/admin/staff"),
        (
            "/staff/admin/topics/no-such-topic/edit",
            "No topic has this address",
            "/staff/admin/topics",
        ),
        (
            "/staff/admin/topics/no-such-topic/retire",
            "No topic has this address",
            "/staff/admin/topics",
        ),
        (
            "/staff/admin/policies/versions/no-such-version",
            "No policy version has this address",
            "/staff/admin/policies",
        ),
        (
            f"/staff/compliance/subscribers/{MISSING}",
            "No person has this address",
            "/staff/compliance/lookup",
        ),
        (
            f"/staff/compliance/subscribers/{MISSING}/erase",
            "No person has this address",
            "/staff/compliance/lookup",
        ),
    ],
)
def test_a_missing_thing_is_named_with_a_way_back(make_staff, browser, path, what, back):
    make_staff("all@example.test", Role.ADMIN, Role.COMPLIANCE)
    signed_in = browser()
    assert signed_in.sign_in("all@example.test").status_code == 303
    page = signed_in.get(path)
    assert page.status_code == 404
    assert what in page.text
    assert f'href="{back}"' in page.text
