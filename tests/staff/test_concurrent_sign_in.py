"""Sign-in attempts racing on one account are counted one by one (PostgreSQL)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import all_rows


@pytest.mark.postgres_only
def test_racing_wrong_passwords_lock_the_account_exactly_once(app, engine, make_staff, browser):
    make_staff("ann@example.test")
    people = [browser() for _ in range(12)]
    tokens = [person.token() for person in people]

    def attempt(index: int) -> int:
        person = people[index]
        response = person.client.post(
            "/staff/login",
            data={
                "csrf_token": tokens[index],
                "email": "ann@example.test",
                "password": "nope nope",
            },
        )
        return response.status_code

    with ThreadPoolExecutor(max_workers=12) as pool:
        statuses = list(pool.map(attempt, range(12)))
    assert sorted(statuses) == [401] * 4 + [429] * 8
    (user,) = all_rows(engine, "staff_user")
    assert user["failed_logins"] == 0 and user["locked_until"] is not None
    audit = all_rows(engine, "staff_audit")
    assert sum(1 for row in audit if row["action"] == "staff.locked_out") == 1
    assert sum(1 for row in audit if row["action"] == "staff.sign_in_failed") == 12
