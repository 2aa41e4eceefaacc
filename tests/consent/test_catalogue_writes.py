"""A write checks the topics it names against committed state, in its own transaction.

The pages may show a copy of the catalogue a few seconds old (``catalogue.current``); the
subscribe call, the preferences call and the preference centre's saves read the topic rows
themselves, in the transaction that writes the decisions. Here a topic is retired by the
``portal topic retire`` command in another operating-system process, while the running
app's copy still lists it, and the app is asked at once to record a decision for it.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.pool import NullPool

from portal.consent import catalogue
from portal.consent.models import PolicyVersion
from portal.consent.preferences import Choice, chosen_topics
from portal.db import create_engine, db
from tests.helpers import count_rows, csrf_token, sent_statements

ROOT = Path(__file__).resolve().parent.parent.parent
URL = "/api/push/preferences"


@pytest.fixture(autouse=True)
def _pages_copy_never_expires(monkeypatch):
    """However slow the other process is to start, the running app's copy of the
    catalogue is still the one read before the retire: only the write's own read can
    know the topic is gone."""
    monkeypatch.setattr(catalogue, "CATALOGUE_TTL_SECONDS", 3600.0)


def retire_in_another_process(database_url: str, instance: Path, slug: str) -> str:
    """``flask --app app portal topic retire SLUG`` in a fresh Python process on the same
    database, as an operator would run it beside the web workers."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECRET", "VAPID", "SUBSCRIPTION", "PORTAL", "DATABASE"))
    }
    environ |= {
        "DATABASE_URL": database_url,
        "PORTAL_INSTANCE_PATH": str(instance),
        "PORTAL_SCHEDULER": "off",
        "PORTAL_AUTO_MIGRATE": "off",
    }
    done = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", "portal", "topic", "retire", slug],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"retired {slug}" in done.stdout
    return done.stdout


def pages_copy(app) -> set[str]:
    with app.app_context():
        return {t.slug for t in catalogue.current(db.session).topics}


def _decisions(endpoint: str, slug: str) -> dict:
    return {
        "endpoint": endpoint,
        "decisions": [{"slug": slug, "state": "opt_in"}],
        "policyVersion": "v1",
        "decidedAt": "2025-12-31T23:00:00Z",
    }


def _offers_rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FROM topic_preference p JOIN topic t ON t.id = p.topic_id"
                " WHERE t.slug = 'offers'"
            )
        ).scalar_one()


def test_a_topic_retired_by_another_process_is_refused_at_once(
    app, client, engine, subscriptions, subscribed, database_url, tmp_path
):
    # The running app has shown its pages: its copy of the catalogue lists "offers".
    assert client.get("/preferences").status_code == 200
    assert "offers" in pages_copy(app)
    events = count_rows(engine, "consent_event")
    subscriptions_before = count_rows(engine, "push_subscription")

    retire_in_another_process(database_url, tmp_path / "cli-instance", "offers")
    assert "offers" in pages_copy(app)  # the pages' copy has not caught up yet

    answer = client.post(URL, json=_decisions(subscribed.endpoint, "offers"))
    assert answer.status_code == 422, answer.json
    assert answer.json["error"]["code"] == "unknown_topic"
    assert answer.json["error"]["field"] == "decisions[0].slug"

    newcomer = subscriptions()
    answer = client.post(
        "/api/push/subscribe",
        json={"subscription": newcomer.to_json(), "topics": ["offers"], "policyVersion": "v1"},
    )
    assert answer.status_code == 422, answer.json
    assert answer.json["error"]["code"] == "unknown_topic"
    assert answer.json["error"]["field"] == "topics[0]"

    assert count_rows(engine, "consent_event") == events  # nothing logged
    assert count_rows(engine, "push_subscription") == subscriptions_before
    assert _offers_rows(engine) == 0
    # A topic still active is taken as before, in the same running app.
    ok = client.post(URL, json=_decisions(subscribed.endpoint, "weekly-digest"))
    assert ok.status_code == 200
    assert "offers" not in {p["slug"] for p in ok.json["preferences"]}


def test_the_preference_centre_saves_nothing_for_a_topic_retired_elsewhere(
    app, client, engine, subscribed, database_url, tmp_path
):
    page = client.get("/preferences")
    assert 'id="topic-offers"' in page.text
    events = count_rows(engine, "consent_event")
    retire_in_another_process(database_url, tmp_path / "cli-instance", "offers")

    saved = client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(page.text),
            "policy_version": "v1",
            "visible": ["security-alerts", "order-updates", "weekly-digest", "offers"],
            "topics": ["security-alerts", "offers"],
        },
    )
    assert saved.status_code == 303
    assert _offers_rows(engine) == 0
    assert count_rows(engine, "consent_event") == events  # nothing else needed to change
    after = client.get(saved.headers["Location"])
    assert "Offers is no longer offered, so nothing was saved for it." in after.text
    # The save found the pages' copy behind and dropped it: the page shows what is now.
    assert 'id="topic-offers"' not in after.text
    assert "offers" not in pages_copy(app)


def test_a_retire_in_progress_elsewhere_is_waited_for_then_refused(app, engine, subscribed):
    """A retire that has written but not yet committed: the write waits for it rather
    than reading around it, and then refuses the topic."""
    assert "offers" in pages_copy(app)
    events = count_rows(engine, "consent_event")
    other = create_engine(engine.url.render_as_string(hide_password=False), poolclass=NullPool)
    answers: list[tuple[int, dict]] = []
    # A client of the writing thread's own; the body's auth shows it holds the subscription.
    browser = app.test_client()

    def write() -> None:
        body = _decisions(subscribed.endpoint, "offers") | {"auth": subscribed.auth_b64}
        response = browser.post(URL, json=body)
        answers.append((response.status_code, response.json))

    retiring = other.connect()
    try:
        transaction = retiring.begin()  # on SQLite, BEGIN IMMEDIATE: the write lock
        retiring.execute(
            sa.text("UPDATE topic SET retired_at = CURRENT_TIMESTAMP WHERE slug = 'offers'")
        )
        thread = threading.Thread(target=write)
        thread.start()
        time.sleep(1.0)
        assert not answers, f"the write did not wait for the retire in progress: {answers}"
        transaction.commit()
        thread.join(60)
    finally:
        retiring.close()
        other.dispose()
    assert answers and answers[0][0] == 422, answers
    assert answers[0][1]["error"]["field"] == "decisions[0].slug"
    assert count_rows(engine, "consent_event") == events


def _offers_by_the_api(session) -> set[str]:
    return set(chosen_topics(session, policy_version="v1", choices=[Choice("offers", "topics")]))


def _offers_by_a_page(session) -> set[str]:
    return set(catalogue.write_basis(session).topics)


@pytest.mark.postgres_only
@pytest.mark.parametrize(
    "read", [_offers_by_the_api, _offers_by_a_page], ids=["topics_for_write", "write_basis"]
)
def test_a_write_holds_its_topics_until_it_commits(app, engine, catalogue_ready, read):
    """While a write's transaction is open, a retire elsewhere waits for it: the API's
    writes (``topics_for_write``) and the preference centre's forms (``write_basis``)."""
    other = create_engine(engine.url.render_as_string(hide_password=False), poolclass=NullPool)
    with app.app_context():
        session = db.session
        assert "offers" in read(session)
        try:
            with other.connect() as retiring, retiring.begin():
                retiring.exec_driver_sql("SET LOCAL lock_timeout = '300ms'")
                with pytest.raises(sqlalchemy.exc.OperationalError) as refused:
                    retiring.execute(
                        sa.text("UPDATE topic SET retired_at = now() WHERE slug = 'offers'")
                    )
                assert isinstance(refused.value.orig, psycopg.errors.LockNotAvailable)
        finally:
            session.rollback()
            other.dispose()
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT retired_at FROM topic WHERE slug = 'offers'")).scalar_one()
            is None
        )


def test_a_page_save_s_basis_is_what_is_committed_now_in_one_statement(
    app, engine, clock, catalogue_ready
):
    """The current policy's version and the active topics, as ``current_policy`` and
    ``topics_for_write`` read them, in one statement; with no active topic, the version
    all the same."""
    with app.app_context():
        session = db.session
        with sent_statements(engine) as sent:
            basis = catalogue.write_basis(session)
        assert len(sent) == 1
        assert basis.policy_version == catalogue.current_policy(session).version
        assert basis.topics.keys() == catalogue.topics_for_write(session).keys()
        catalogue.publish_policy(session, version="v9", text="Newer.", now=clock.now())
        for slug in list(basis.topics):
            catalogue.retire_topic(session, slug, now=clock.now())
        session.commit()
        assert catalogue.write_basis(session) == catalogue.WriteBasis("v9", {})
        session.rollback()


def test_a_page_save_finds_the_pages_copy_behind_and_drops_it(app, engine, clock, catalogue_ready):
    """A newer policy committed elsewhere: the save's basis has it, and the pages' copy of
    the catalogue, which has the older one, is read afresh next time."""
    with app.app_context():
        session = db.session
        assert catalogue.current(session).policy.version == "v1"
        session.rollback()  # SQLite: a transaction holds the write lock from its start
        with engine.begin() as elsewhere:
            # Core, not the ORM: no flush of this process's sessions sees it.
            elsewhere.execute(
                sa.insert(PolicyVersion.__table__).values(
                    version="v2",
                    published_at=clock.now() + dt.timedelta(minutes=1),
                    text="Newer.",
                    text_sha256=catalogue.text_digest("Newer."),
                )
            )
        assert catalogue.current(session).policy.version == "v1"  # the copy, still
        assert catalogue.write_basis(session).policy_version == "v2"
        assert catalogue.current(session).policy.version == "v2"
        session.rollback()


def test_slugs_no_topic_could_have_are_left_out_without_asking_the_database(
    app, clock, catalogue_ready
):
    # A form may name anything; PostgreSQL refuses a NUL byte in a query parameter
    # outright (found by the walk: a save naming "offers\x00" answered 500).
    with app.app_context():
        label = catalogue.retire_topic(db.session, "offers", now=clock.now()).label
        db.session.commit()
        named = {"offers\x00", "o" * 65, "Offers", "offers"}
        assert catalogue.retired_labels(db.session, named) == [label]
        assert catalogue.retired_labels(db.session, {"offers\x00"}) == []
        assert catalogue.policy(db.session, "v1\x00.1") is None
        assert catalogue.policy(db.session, "v1") is not None
