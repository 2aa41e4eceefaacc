"""Drafts: saved from the form, edited until launch, launched through the review, cloned
from any campaign; every step audited, and no write undoes another's."""

from __future__ import annotations

import re
import uuid

import pytest
import sqlalchemy as sa

from portal.campaigns.models import Campaign, Draft
from portal.db import db
from portal.delivery.models import Delivery
from portal.staff.models import Role, StaffAudit
from tests.campaigns.conftest import form_data
from tests.campaigns.test_pages import launch_via_form, make_campaign, subscribe

NEW = "/staff/campaigns/new"


def drafts(app) -> list[Draft]:
    with db.begin(app) as session:
        found = session.scalars(sa.select(Draft).order_by(Draft.created_at)).all()
        session.expunge_all()
        return list(found)


def counts(app) -> tuple[int, int]:
    with db.begin(app) as session:
        return (
            session.scalar(sa.select(sa.func.count()).select_from(Campaign)) or 0,
            session.scalar(sa.select(sa.func.count()).select_from(Delivery)) or 0,
        )


def audit_rows(app, action: str) -> list[StaffAudit]:
    with db.begin(app) as session:
        found = session.scalars(
            sa.select(StaffAudit).where(StaffAudit.action == action).order_by(StaffAudit.id)
        ).all()
        session.expunge_all()
        return list(found)


def save_draft(person, **fields):
    return person.post(NEW, {**form_data(**fields), "action": "save_draft"})


def draft_id_from(response) -> uuid.UUID:
    assert response.status_code == 303, response.text
    found = re.search(r"/staff/campaigns/drafts/([0-9a-f-]{36})$", response.headers["Location"])
    assert found, response.headers["Location"]
    return uuid.UUID(found.group(1))


def editing(draft: Draft, **fields) -> dict:
    """The edit page's form as its hidden fields carry it, with ``fields`` typed over."""
    return {
        **form_data(),
        **draft.fields,
        "draft_id": str(draft.id),
        "draft_version": str(draft.version),
        **fields,
    }


def review_and_launch(person, data: dict):
    review = person.post(NEW, {**data, "action": "review"})
    assert review.status_code == 200, review.text
    chosen = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review.text).group(1)
    return person.post(NEW, {**data, "campaign_id": chosen, "action": "launch"}), chosen


def test_saving_a_draft_sends_nothing_and_is_audited(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    subscribe(app, topics=["weekly-digest"])
    draft_id = draft_id_from(save_draft(campaigner, title="Half done", body=""))
    (draft,) = drafts(app)
    assert draft.id == draft_id and draft.version == 1 and draft.launched_campaign_id is None
    assert draft.fields["title"] == "Half done" and draft.fields["body"] == ""
    assert counts(app) == (0, 0)  # no campaign, no delivery: nothing for the engine
    (row,) = audit_rows(app, "campaign.draft_saved")
    assert row.actor_email == "campaigner@example.test" and row.target == f"draft:{draft_id}"
    page = campaigner.get(f"/staff/campaigns/drafts/{draft_id}")
    assert page.status_code == 200
    assert 'value="Half done"' in page.text and f'value="{draft_id}"' in page.text
    listed = campaigner.get("/staff/campaigns")
    assert "Half done" in listed.text and "Drafts, not sent" in listed.text


def test_a_draft_needs_a_title_and_readable_text(campaigner, catalogue_ready):
    app = catalogue_ready
    assert save_draft(campaigner, title="").status_code == 422
    refused = save_draft(campaigner, body="bad\x1b[31m")
    assert refused.status_code == 422 and "control characters" in refused.text
    assert drafts(app) == []


def test_editing_bumps_the_version_and_a_stale_save_changes_nothing(
    campaigner, catalogue_ready, sign_in
):
    app = catalogue_ready
    draft_id_from(save_draft(campaigner, title="First"))
    (draft,) = drafts(app)
    colleague = sign_in(app, "colleague@example.test")
    saved = colleague.post(NEW, {**editing(draft, title="Colleague's"), "action": "save_draft"})
    assert draft_id_from(saved) == draft.id
    (after,) = drafts(app)
    assert (after.version, after.title, after.updated_by) == (
        2,
        "Colleague's",
        "colleague@example.test",
    )
    # The first tab still holds version 1: its save is refused, and says who saved.
    stale = campaigner.post(NEW, {**editing(draft, title="Mine"), "action": "save_draft"})
    assert stale.status_code == 409
    assert "colleague@example.test saved this draft" in stale.text
    assert 'value="Mine"' in stale.text  # the typing is not lost
    (still,) = drafts(app)
    assert (still.version, still.title) == (2, "Colleague's")
    assert len(audit_rows(app, "campaign.draft_changed")) == 1


def test_launching_a_draft_goes_through_review_and_marks_it(campaigner, catalogue_ready):
    app = catalogue_ready
    subscribe(app, topics=["weekly-digest"])
    draft_id_from(save_draft(campaigner, title="Launch me"))
    (draft,) = drafts(app)
    # The review refuses what a launch would (here: no body) before anything is written.
    bad = campaigner.post(NEW, {**editing(draft, body=""), "action": "review"})
    assert bad.status_code == 422 and counts(app) == (0, 0)
    launched, chosen = review_and_launch(campaigner, editing(draft))
    assert launched.status_code == 303
    assert launched.headers["Location"].endswith(f"/staff/campaigns/{chosen}")
    (after,) = drafts(app)
    assert after.launched_campaign_id == uuid.UUID(chosen)
    assert after.launched_by == "campaigner@example.test"
    (row,) = audit_rows(app, "campaign.launched")
    assert row.detail["draft"] == f"draft:{draft.id}"
    # Its page now leads to the campaign; it is no longer listed as a draft.
    page = campaigner.get(f"/staff/campaigns/drafts/{draft.id}")
    assert page.status_code == 303 and page.headers["Location"].endswith(chosen)
    assert "Drafts, not sent" not in campaigner.get("/staff/campaigns").text


def test_a_launched_draft_cannot_be_edited_and_the_launch_is_kept(
    campaigner, catalogue_ready, sign_in
):
    app = catalogue_ready
    draft_id_from(save_draft(campaigner, title="Ours"))
    (draft,) = drafts(app)
    colleague = sign_in(app, "colleague@example.test")
    launched, chosen = review_and_launch(colleague, editing(draft))
    assert launched.status_code == 303
    # The first tab, opened before the launch, saves its edit: refused, nothing changes.
    late = campaigner.post(NEW, {**editing(draft, title="Changed"), "action": "save_draft"})
    assert late.status_code == 409 and "launched by colleague@example.test" in late.text
    (after,) = drafts(app)
    assert after.launched_campaign_id == uuid.UUID(chosen) and after.title == "Ours"
    with db.begin(app) as session:
        assert session.get(Campaign, uuid.UUID(chosen)).title == "Ours"
    # And it cannot launch it a second time either: one campaign.
    again, _ = review_and_launch(campaigner, editing(draft, title="Changed"))
    assert again.status_code == 409 and counts(app)[0] == 1


def test_a_launch_from_a_stale_version_is_refused(campaigner, catalogue_ready, sign_in):
    app = catalogue_ready
    draft_id_from(save_draft(campaigner, title="v1"))
    (draft,) = drafts(app)
    colleague = sign_in(app, "colleague@example.test")
    colleague.post(NEW, {**editing(draft, title="v2"), "action": "save_draft"})
    # Launching what was reviewed at version 1 would send text nobody reviewed as the draft.
    stale, _ = review_and_launch(campaigner, editing(draft))
    assert stale.status_code == 409 and counts(app) == (0, 0)


def test_a_tampered_draft_reference_is_refused(campaigner, catalogue_ready):
    app = catalogue_ready
    refused = campaigner.post(
        NEW, {**form_data(), "draft_id": "not-a-uuid", "action": "save_draft"}
    )
    assert refused.status_code == 422 and drafts(app) == []
    unknown = campaigner.post(
        NEW,
        {
            **form_data(),
            "draft_id": str(uuid.uuid4()),
            "draft_version": "1",
            "action": "save_draft",
        },
    )
    assert unknown.status_code == 404 and drafts(app) == []
    assert campaigner.get(f"/staff/campaigns/drafts/{uuid.uuid4()}").status_code == 404


def test_clone_copies_any_campaign_into_a_new_draft(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id, _ = launch_via_form(
        campaigner,
        title="Sale",
        body="Half off",
        image="/static/img/icon-192.png",
        action1_title="Shop",
        action1_url="/shop",
        silent="y",
    )
    campaigner.post(f"/staff/campaigns/{campaign_id}/cancel", {"confirm": "yes"})
    cloned = campaigner.post(f"/staff/campaigns/{campaign_id}/clone")
    draft_id = draft_id_from(cloned)
    (draft,) = drafts(app)
    assert draft.id == draft_id and draft.cloned_from == campaign_id
    assert {k: draft.fields[k] for k in ("title", "body", "image", "action1_title", "silent")} == {
        "title": "Sale",
        "body": "Half off",
        "image": "/static/img/icon-192.png",
        "action1_title": "Shop",
        "silent": "y",
    }
    assert draft.fields["schedule"] == "now" and draft.fields["deliver_until"] == ""
    (row,) = audit_rows(app, "campaign.cloned")
    assert row.detail["from"] == f"campaign:{campaign_id}"
    with db.begin(app) as session:  # the original is untouched
        assert session.get(Campaign, campaign_id).status == "cancelled"
    assert campaigner.post(f"/staff/campaigns/{uuid.uuid4()}/clone").status_code == 404


def test_a_campaign_has_no_edit_route(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    for path in (f"/staff/campaigns/{campaign_id}/edit", f"/staff/campaigns/drafts/{campaign_id}"):
        assert campaigner.post(path, form_data(title="Changed")).status_code in {404, 405}
    with db.begin(app) as session:
        assert session.get(Campaign, campaign_id).title == "Digest"


@pytest.mark.parametrize("role", [Role.ADMIN, Role.COMPLIANCE])
def test_without_the_campaigns_role_nobody_drafts_edits_or_clones(
    campaigner, catalogue_ready, sign_in, clock, role
):
    app = catalogue_ready
    campaign_id = make_campaign(app, clock)
    draft_id_from(save_draft(campaigner, title="Ours"))
    (draft,) = drafts(app)
    person = sign_in(app, f"{role.value}@example.test", role)
    assert person.get(f"/staff/campaigns/drafts/{draft.id}").status_code == 403
    assert (
        person.post(NEW, {**editing(draft, title="Theirs"), "action": "save_draft"}).status_code
        == 403
    )
    assert person.post(NEW, {**form_data(), "action": "save_draft"}).status_code == 403
    assert person.post(f"/staff/campaigns/{campaign_id}/clone").status_code == 403
    (after,) = drafts(app)
    assert (after.version, after.title) == (1, "Ours")
    assert audit_rows(app, "campaign.cloned") == []
