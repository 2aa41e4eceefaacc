"""The compliance officer's pages about one person read indexes, not whole tables (PostgreSQL).

An officer looks a person up while the audience is millions strong: a search, a history,
an erasure or a dashboard that read a growing table from end to end would take seconds
each and push the preference centre's pages out of memory. The person of
``tests/compliance/conftest.py`` stands among ``PEOPLE`` others with an account ID each
and a year of history; every statement of a look-up by each of its keys, the person's
history, the erasure, the consent log's page, the compliance dashboard and the console's
home is planned (``tests/plans.py``), and none may read a growing table with a
sequential scan, nor walk one's index testing every row (the history's deliveries, among
campaigns sent to everyone, did: an OR of the person's events and devices that no
index served). (The dashboard's weekly chart reads the events of its twelve weeks, by
the ``recorded_at`` index: its cost grows with the decisions of those weeks, not with the
log.)
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from portal.db import db
from portal.subscriptions.models import Subscriber
from portal.subscriptions.reference import display, reference_for
from tests.helpers import sent_statements
from tests.plans import PLANNED, deliveries, plans, populate, whole_table_reads

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def among_many(app, engine, person):
    """The person with an account ID and a reference, among ``PEOPLE`` others who have
    account IDs of their own."""
    with db.begin(app) as session:
        session.get(Subscriber, person.subscriber_id).external_user_id = "acct-42"
        given = reference_for(session, person.subscriber_id)
    # The others decided a year and more ago: the dashboard's twelve weeks are a small
    # part of a log with history, as they are in a portal that has run for a while.
    populate(engine, person.subscriber_id, events_aged="1 year")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE subscriber SET external_user_id = 'member-' || id "
                "WHERE id <> :person AND external_user_id IS NULL"
            ),
            {"person": person.subscriber_id},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))
    return person, display(given)


def test_a_look_up_by_each_key_reads_no_growing_table_whole(engine, officer, among_many):
    person, reference = among_many
    searches = ["acct-42", "acct-4", reference, str(person.subscriber_id)]
    with sent_statements(engine, PLANNED) as statements:
        for query in searches:
            found = officer.get("/staff/compliance/lookup", query_string={"q": query})
            assert found.status_code == 200, (query, found.status_code)
            assert f"/staff/compliance/subscribers/{person.subscriber_id}" in found.text
        by_endpoint = officer.post("/staff/compliance/lookup", {"endpoint": person.sub.endpoint})
        assert by_endpoint.status_code == 303
    assert len(statements) >= 2 * len(searches)  # the searches were seen
    problems = whole_table_reads(engine, statements)
    assert not problems, "\n\n".join(problems)


def test_a_broad_account_id_start_reads_only_what_its_page_lists(engine, officer, among_many):
    """ "member-" starts the account IDs of everyone but the person, 103,000 people: its
    count stops one past the listed cap (``PREFIX_LISTED``, 1,000) and each page is read
    from the prefix index in order, the 50th too. Before, the search counted every match
    and sorted them all for each page (no sequential scan, so the whole-table check above
    did not see it)."""
    # With a few thousand matches, reading them all and sorting costs the planner about
    # what the index's first thousand do, and it may take either; with 100,000 more, in
    # an order the table's is not, only the index is cheap.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO subscriber (id, external_user_id, created_at) "
                "SELECT md5('member-' || i)::uuid, 'member-' || md5(i::text), now() "
                "FROM generate_series(1, 100000) AS i"
            )
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE subscriber"))
    with sent_statements(engine, PLANNED) as statements:
        for page in ("1", "50"):
            found = officer.get(
                "/staff/compliance/lookup", query_string={"q": "member-", "page": page}
            )
            assert found.status_code == 200
            assert "of the first 1,000 people found" in found.text
            assert "More account IDs start with “member-” than are listed" in found.text
    past = officer.get("/staff/compliance/lookup", query_string={"q": "member-", "page": "51"})
    assert past.status_code == 404 and "There is no page 51" in past.text
    by_prefix = [(sql, p) for sql, p in statements if "LIKE" in sql and "subscriber" in sql]
    assert len(by_prefix) == 4  # per page: the capped count, the listing
    for (sql, _), plan in zip(by_prefix, plans(engine, by_prefix), strict=True):
        # Stopped at its limit (a count's scan too: it stops once one past the cap is
        # found); nothing sorted; a page read in the prefix index's own order.
        assert plan.splitlines()[1 if "count(" in sql else 0].lstrip(" ->").startswith("Limit")
        assert "Sort" not in plan, plan
        if "ORDER BY" in sql:
            assert "Index Scan using ix_subscriber_external_user_id_prefix" in plan, plan


def test_a_history_and_an_erasure_read_no_growing_table_whole(engine, clock, officer, among_many):
    person, _reference = among_many
    # Campaigns sent to everyone, five in each partition of delivery: the history lists
    # the person's deliveries among 60,000 and more.
    deliveries(engine, at=clock.now())
    history = f"/staff/compliance/subscribers/{person.subscriber_id}"
    with sent_statements(engine, PLANNED) as statements:
        page = officer.get(history)
        assert page.status_code == 200
        assert "Campaign 5" in page.text and "Campaign 1<" in page.text
        assert officer.get(f"{history}/erase").status_code == 200
        erased = officer.post(f"{history}/erase", {"confirm": "y", "reference": "REQ-1"})
        assert erased.status_code == 303
        assert officer.get(history).status_code == 200
    with engine.connect() as conn:
        left = conn.execute(
            sa.text("SELECT erased_at IS NOT NULL FROM subscriber WHERE id = :id"),
            {"id": person.subscriber_id},
        ).scalar_one()
    assert left  # the erasure happened
    problems = whole_table_reads(engine, statements)
    assert not problems, "\n\n".join(problems)


def test_the_consent_log_and_the_dashboard_read_no_growing_table_whole(engine, officer, among_many):
    with sent_statements(engine, PLANNED) as statements:
        assert officer.get("/staff/compliance/consent-log").status_code == 200
        assert officer.get("/staff/compliance/").status_code == 200
        assert officer.get("/staff/").status_code == 200
    problems = whole_table_reads(engine, statements)
    assert not problems, "\n\n".join(problems)
