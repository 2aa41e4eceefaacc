"""Rich notifications: image, badge, two buttons and the display flags — in the form,
the command line and the payload, under the link rule and the byte limit."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import sqlalchemy as sa

from portal.campaigns import services
from portal.campaigns.models import Campaign, Draft
from portal.campaigns.services import MAX_PLAINTEXT, CampaignDraft
from portal.db import db
from portal.staff.models import StaffAudit
from tests.campaigns.conftest import form_data
from tests.campaigns.test_cli import campaigns, run
from tests.campaigns.test_form import allow_link_origins, field_error, review
from tests.campaigns.test_pages import launch_via_form

RICH = {
    "image": "/static/img/sale.png",
    "badge": "/static/img/badge.png",
    "action1_title": "Shop now",
    "action1_url": "/shop",
    "action2_title": "Not now",
    "action2_url": "https://cdn.example.com/later",
    "require_interaction": "y",
    "silent": "y",
}


def test_the_payload_carries_image_actions_and_flags_next_to_the_fields(
    campaigner, catalogue_ready
):
    app = catalogue_ready
    allow_link_origins(app, "https://cdn.example.com")
    campaign_id, _ = launch_via_form(campaigner, **RICH)
    with db.begin(app) as session:
        campaign = session.get(Campaign, campaign_id)
        message = json.loads(services.payload(campaign, 42))
        rendered = services.PayloadTemplate(campaign).render(42)
    assert json.loads(rendered) == message
    assert message == {
        "deliveryId": "42",
        "campaignId": str(campaign_id),
        "title": "Monday digest",
        "body": "Five things this week",
        "tag": f"campaign-{campaign_id}",
        "url": "/news",
        "image": "/static/img/sale.png",
        "badge": "/static/img/badge.png",
        "actions": [
            {"action": "action-1", "title": "Shop now", "url": "/shop"},
            {"action": "action-2", "title": "Not now", "url": "https://cdn.example.com/later"},
        ],
        "requireInteraction": True,
        "silent": True,
    }


def test_a_plain_campaign_keeps_the_old_payload(catalogue_ready, clock):
    with db.begin(catalogue_ready) as session:
        campaign = services.create_campaign(
            session,
            CampaignDraft(topic="weekly-digest", title="T", body="B"),
            created_by="x",
            now=clock.now(),
        )
        message = json.loads(services.payload(campaign, 1))
    assert set(message) == {"deliveryId", "campaignId", "title", "body", "tag"}


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"action1_title": "Shop"}, "action1_url", "Enter the button's link"),
        ({"action1_url": "/shop"}, "action1_title", "Enter the button's label"),
        (
            {"action2_title": "Later", "action2_url": "/later"},
            "action1_title",
            "Enter the button's label",
        ),
        (
            {"action1_title": "x" * 41, "action1_url": "/shop"},
            "action1_title",
            "A button's label must be 40 characters or fewer",
        ),
        (
            {"action1_title": "Go", "action1_url": "https://evil.example/"},
            "action1_url",
            "Links may lead only to this site",
        ),
        (
            {"action1_title": "Go", "action1_url": "javascript:alert(1)"},
            "action1_url",
            "A link is an https:// URL or a path on this site",
        ),
        ({"image": "https://evil.example/x.png"}, "image", "Links may lead only to this site"),
        (
            {"badge": "//evil.example/b.png"},
            "badge",
            "A link is an https:// URL or a path on this site",
        ),
        ({"image": "/x\x1b.png"}, "image", None),
    ],
)
def test_bad_buttons_and_images_are_refused(campaigner, engine, fields, field, message):
    response = review(campaigner, **fields)
    assert response.status_code == 422
    found = field_error(response.text, field)
    if message is None:
        assert "control characters" in found
    else:
        assert found.startswith(message)
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(Campaign)) == 0


def test_the_byte_limit_counts_the_image_and_the_buttons(campaigner):
    plain = review(campaigner, body="x" * 10)
    used = int(re.search(r"(\d+) of 3993 bytes", plain.text).group(1))
    rich = review(campaigner, body="x" * 10, **RICH | {"action2_url": "/later"})
    rich_used = int(re.search(r"(\d+) of 3993 bytes", rich.text).group(1))
    assert rich_used > used + len("Shop now") + len("/static/img/sale.png")
    room = MAX_PLAINTEXT - rich_used
    fits = {**RICH, "action2_url": "/later"}
    assert review(campaigner, body="x" * (10 + room), **fits).status_code == 200
    over = review(campaigner, body="x" * (11 + room), **fits)
    assert over.status_code == 422 and "The message is 3994 bytes" in over.text


def test_cli_create_takes_image_and_up_to_two_actions(catalogue_ready):
    app = catalogue_ready
    result = run(
        app,
        "create",
        "--topic",
        "weekly-digest",
        "--title",
        "Sale",
        "--body",
        "Half off",
        "--image",
        "/static/img/sale.png",
        "--badge",
        "/static/img/badge.png",
        "--action",
        "Shop now=/shop",
        "--action",
        "Later=/later?x=a=b",
        "--require-interaction",
        "--silent",
    )
    assert result.exit_code == 0, result.output
    (campaign,) = campaigns(app)
    assert campaign.id == uuid.UUID(result.stdout.strip())
    assert campaign.image == "/static/img/sale.png" and campaign.badge == "/static/img/badge.png"
    assert campaign.actions == [
        {"title": "Shop now", "url": "/shop"},
        {"title": "Later", "url": "/later?x=a=b"},
    ]
    assert campaign.require_interaction and campaign.silent


@pytest.mark.parametrize(
    ("actions", "said"),
    [
        (["A=/a", "B=/b", "C=/c"], "error: action: At most 2 buttons"),
        (["no link here"], "error: action: 'no link here' is not LABEL=URL"),
        (["Go=https://evil.example/"], "error: action: Links may lead only to this site"),
        (["=/a"], "error: action: Enter the button's label"),
    ],
)
def test_cli_refuses_bad_actions_and_creates_nothing(catalogue_ready, actions, said):
    app = catalogue_ready
    args = ["create", "--topic", "weekly-digest", "--title", "T", "--body", "B"]
    for action in actions:
        args += ["--action", action]
    result = run(app, *args)
    assert result.exit_code == 1
    assert said in result.stderr
    assert campaigns(app) == []


def test_cli_create_draft_saves_without_launching(catalogue_ready, clock):
    app = catalogue_ready
    result = run(
        app,
        "create",
        "--draft",
        "--topic",
        "weekly-digest",
        "--title",
        "Later",
        "--body",
        "B",
        "--action",
        "Shop=/shop",
        "--send-at",
        "2026-03-29T09:30",
        "--zone",
        "Europe/Paris",
    )
    assert result.exit_code == 0, result.output
    draft_id = uuid.UUID(result.stdout.strip())
    assert campaigns(app) == []
    with db.begin(app) as session:
        draft = session.get(Draft, draft_id)
        assert draft.created_by == "command line"
        assert (draft.fields["schedule"], draft.fields["send_at"], draft.fields["timezone"]) == (
            "later",
            "2026-03-29T09:30",
            "Europe/Paris",
        )
        assert (draft.fields["action1_title"], draft.fields["action1_url"]) == ("Shop", "/shop")
        row = session.scalars(
            sa.select(StaffAudit).where(StaffAudit.action == "campaign.draft_saved")
        ).one()
        assert row.actor_via == "cli" and row.target == f"draft:{draft_id}"
    bad = run(
        app,
        "create",
        "--draft",
        "--topic",
        "weekly-digest",
        "--title",
        "T",
        "--body",
        "B",
        "--url",
        "javascript:x",
    )
    assert bad.exit_code == 1 and "error: url:" in bad.stderr


def test_cli_clone_makes_a_draft_of_a_campaign(catalogue_ready):
    app = catalogue_ready
    made = run(
        app,
        "create",
        "--topic",
        "weekly-digest",
        "--title",
        "Once",
        "--body",
        "B",
        "--image",
        "/i.png",
    )
    campaign_id = uuid.UUID(made.stdout.strip())
    result = run(app, "clone", str(campaign_id))
    assert result.exit_code == 0, result.output
    draft_id = uuid.UUID(result.stdout.strip())
    with db.begin(app) as session:
        draft = session.get(Draft, draft_id)
        assert draft.cloned_from == campaign_id
        assert (draft.fields["title"], draft.fields["image"]) == ("Once", "/i.png")
        row = session.scalars(
            sa.select(StaffAudit).where(StaffAudit.action == "campaign.cloned")
        ).one()
        assert row.detail["from"] == f"campaign:{campaign_id}" and row.actor_via == "cli"
    missing = run(app, "clone", str(uuid.uuid4()))
    assert missing.exit_code == 1 and "no such campaign" in missing.stderr
    assert len(campaigns(app)) == 1


def test_each_platform_cuts_where_it_cuts_and_says_so(campaigner, catalogue_ready):
    from portal.campaigns.presentation import PLATFORMS

    title = "T" * 45  # over macOS's 43 and Android's 30, within Windows' 70 and Firefox's 50
    body = "b" * 150  # over every platform's cut but Firefox's 200
    html = campaigner.post(
        "/staff/campaigns/new",
        {
            **form_data(title=title, body=body, image="/static/img/icon.svg"),
            "action1_title": "A label longer than nineteen",
            "action1_url": "/a",
            "action": "preview",
        },
    ).text
    sections = {
        m.group(1): m.group(0)
        for m in re.finditer(
            r'<li class="platform platform--([a-z-]+)".*?<ul class="platform__facts">.*?</ul>',
            html,
            re.S,
        )
    }
    assert list(sections) == [p.key for p in PLATFORMS]
    windows, macos, android, firefox = (sections[p.key] for p in PLATFORMS)
    assert f'<p class="platform__title">{title}</p>' in windows
    assert (
        f'<p class="platform__title">{"T" * 42}…<span class="visually-hidden"> (cut here)</span>'
        in macos
    )
    assert "<strong>cut</strong> to 43 of its 45 characters" in macos
    assert f"{'T' * 29}…" in android and "cut</strong> to 30 of its 45" in android
    assert "shown whole (up to 50 characters)" in firefox
    assert "cut</strong> to 140 of its 150" in windows
    assert "shown whole (up to 200 characters)" in firefox
    # The image is drawn where the platform shows it, and said to be missing elsewhere.
    assert 'class="platform__image" src="/static/img/icon.svg"' in windows
    assert 'class="platform__image"' in android
    assert "platform__image" not in macos and "The image is not shown here." in macos
    # Buttons: cut after 19 characters where shown; Firefox shows none and says so.
    assert "A label longer tha…" in windows
    assert "platform__actions" not in firefox and "Firefox shows no buttons." in firefox
    assert "macOS shows the buttons under Options." in macos
