"""The audit trail: the record() service, and a table the database keeps append-only."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from portal.db import db
from portal.staff import audit
from portal.staff.models import Role, StaffAudit
from tests.helpers import count_rows


@pytest.fixture
def entry(app, make_staff):
    user = make_staff("ann@example.test", Role.ADMIN)
    with app.app_context(), db.begin() as session:
        row = audit.record(session, user, "campaign.launched", "campaign:42", {"audience": 7})
        session.flush()
        return row.id


def test_record_stores_actor_time_action_target_detail(app, clock, engine, entry):
    with app.app_context():
        row = db.session.get(StaffAudit, entry)
        assert row.actor_email == "ann@example.test"
        assert row.actor_id is not None
        assert row.at == clock.now()
        assert (row.action, row.target, row.detail) == (
            "campaign.launched",
            "campaign:42",
            {"audience": 7},
        )


def test_record_without_a_staff_account(app, engine):
    with app.app_context(), db.begin() as session:
        audit.record(session, None, "job.purged", None, {"rows": 3})
        audit.record(session, audit.Anonymous("x@example.test"), "staff.sign_in_failed")
    assert count_rows(engine, "staff_audit") == 2


@pytest.mark.parametrize(
    "detail",
    [
        {"password": "hunter2"},
        {"new_password": "x"},
        {"api_token": "x"},
        {"nested": {"client_secret": "x"}},
        {"items": [{"cookies": "x"}]},
        {"privateKey": "x"},
    ],
)
def test_record_refuses_details_that_look_like_secrets(app, engine, detail):
    with app.app_context(), pytest.raises(audit.SecretInAudit), db.begin() as session:
        audit.record(session, None, "staff.created", "staff:x", detail)
    assert count_rows(engine, "staff_audit") == 0


def test_record_accepts_ordinary_details(app):
    with app.app_context(), db.begin() as session:
        audit.record(session, None, "x", None, {"key_version": 2, "text_sha256": "ab", "roles": []})


def test_other_packages_can_name_their_actions(app):
    audit.register_action("campaign.launched", "Campaign launched")
    assert audit.action_labels()["campaign.launched"] == "Campaign launched"


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE staff_audit SET action = 'staff.nothing_happened' WHERE id >= :id",
        "UPDATE staff_audit SET detail = NULL WHERE id = :id",
        "DELETE FROM staff_audit WHERE id = :id",
        "DELETE FROM staff_audit",
    ],
)
def test_the_database_refuses_to_change_or_delete_audit_rows(engine, entry, statement):
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(sa.text(statement), {"id": entry})
    with engine.connect() as conn:
        action = conn.execute(
            sa.text("SELECT action FROM staff_audit WHERE id = :id"), {"id": entry}
        ).scalar_one()
    assert action == "campaign.launched"


@pytest.mark.postgres_only
def test_postgres_refuses_truncate_too(engine, entry):
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE staff_audit"))
    assert count_rows(engine, "staff_audit") == 2  # staff.created and the entry


def test_inserts_still_work_and_ids_grow(engine, entry):
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO staff_audit (at, action) VALUES (:at, 'manual.note')"),
            {"at": "2026-01-02 00:00:00"},
        )
    with engine.connect() as conn:
        ids = conn.execute(sa.text("SELECT id FROM staff_audit ORDER BY id")).scalars().all()
    assert ids[-2:] == [entry, entry + 1]


def test_the_orm_cannot_edit_an_audit_row_either(app, entry):
    with app.app_context():
        row = db.session.get(StaffAudit, entry)
        row.action = "staff.rewritten"
        with pytest.raises(sa.exc.DBAPIError, match="append-only"):
            db.session.commit()
        db.session.rollback()


def test_a_staff_user_with_an_audit_trail_cannot_be_deleted(engine, entry):
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM staff_user"))


def test_the_triggers_go_with_a_downgrade(fresh_database, pg_server, backend):
    from portal.db import create_engine
    from portal.migrate import downgrade, upgrade

    url = fresh_database()
    engine = create_engine(url)
    try:
        upgrade(engine)
        downgrade(engine, "0001")
        with engine.connect() as conn:
            if backend == "postgresql":
                left = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_proc WHERE proname = 'staff_audit_append_only'"
                    )
                ).scalar_one()
            else:
                left = conn.execute(
                    sa.text("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'")
                ).scalar_one()
        assert left == 0
        assert not {"staff_user", "staff_audit"} & set(sa.inspect(engine).get_table_names())
        upgrade(engine)
        assert {"staff_user", "staff_role", "staff_session", "staff_audit"} <= set(
            sa.inspect(engine).get_table_names()
        )
    finally:
        engine.dispose()
        if pg_server is not None:
            pg_server.drop(url)
