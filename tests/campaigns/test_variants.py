"""A/B variants (portal/campaigns/variants.py): two or three versions of a campaign, a
random split stable per subscription, each version's payload, and each version's funnel
with its click-through rate and 95% interval; through the form, the command line and the
engine, on both databases."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import json
import math
import re
import uuid
from collections import Counter

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from portal.campaigns import services as campaigns
from portal.campaigns import variants
from portal.campaigns.models import Campaign
from portal.campaigns.services import MAX_PLAINTEXT, CampaignDraft
from portal.campaigns.variants import wilson
from portal.db import db, uuid7
from portal.delivery.models import Delivery, DeliveryReceipt
from tests.campaigns.conftest import CAMPAIGNER, form_data
from tests.campaigns.test_cli import run
from tests.campaigns.test_form import field_error

B = ("Last chance", "Ends tonight", None)
C = ("Don't miss it", "Midnight deadline", "/static/c.png")


def _draft(**fields) -> CampaignDraft:
    return CampaignDraft(
        **{"topic": "weekly-digest", "title": "Sale", "body": "Half price", **fields}
    )


# -- the split ----------------------------------------------------------------------------


@given(campaign=st.uuids(), subscription=st.uuids(), count=st.integers(2, 3))
def test_a_subscription_always_gets_the_same_variant_of_a_campaign(campaign, subscription, count):
    first = variants.variant_of(campaign, subscription, count)
    assert 0 <= first < count
    assert variants.variant_of(campaign, subscription, count) == first


def test_the_split_is_even_and_differs_between_campaigns():
    people = [uuid7() for _ in range(30_000)]
    one, other = uuid.uuid4(), uuid.uuid4()
    while variants._byte(one) == variants._byte(other):
        other = uuid.uuid4()
    shares = Counter(variants.variant_of(one, p, 3) for p in people)
    for n in shares.values():
        assert abs(n - 10_000) < 4 * math.sqrt(30_000 * (1 / 3) * (2 / 3))
    # Another campaign groups people differently: its A is not the first one's A.
    first_a = {p for p in people if variants.variant_of(one, p, 2) == 0}
    second_a = {p for p in people if variants.variant_of(other, p, 2) == 0}
    overlap = len(first_a & second_a) / len(first_a)
    assert 0.4 < overlap < 0.6


# -- the interval -------------------------------------------------------------------------


def test_the_wilson_interval_matches_known_values():
    # Wilson (1927); e.g. 81 of 263 → 0.2553-0.3662 (Newcombe 1998, table I).
    for (successes, trials), (low, high) in {
        (81, 263): (0.2553, 0.3662),
        (0, 10): (0.0, 0.2775),
        (10, 10): (0.7225, 1.0),
    }.items():
        interval = wilson(successes, trials)
        assert interval is not None
        assert (interval.low, interval.high) == pytest.approx((low, high), abs=5e-5)
    assert wilson(0, 0) is None


@given(trials=st.integers(1, 10_000), data=st.data())
def test_the_interval_holds_the_rate_and_stays_between_0_and_1(trials, data):
    successes = data.draw(st.integers(0, trials))
    interval = wilson(successes, trials)
    assert interval is not None
    assert 0.0 <= interval.low <= successes / trials <= interval.high <= 1.0


def _result(index, shown, clicked):
    return variants.VariantResult(index, "t", "b", None, shown, shown, shown, clicked)


def test_a_variant_leads_only_when_its_interval_is_above_every_other():
    clear = variants.Results([_result(0, 2000, 100), _result(1, 2000, 200)])
    assert clear.leader is not None and clear.leader.name == "B"
    close = variants.Results([_result(0, 200, 10), _result(1, 200, 14)])
    assert close.leader is None
    nothing_shown = variants.Results([_result(0, 0, 0), _result(1, 10, 5)])
    assert nothing_shown.leader is None


# -- the rules ----------------------------------------------------------------------------


def _problems(app, clock, **fields):
    with db.begin(app) as session:
        return [
            (p.field, p.message)
            for p in campaigns.validate_draft(session, _draft(**fields), now=clock.now())
        ]


def test_each_variant_needs_a_title_and_a_message_and_at_most_three(catalogue_ready, clock):
    assert _problems(catalogue_ready, clock, variants=(B, C)) == []
    assert _problems(catalogue_ready, clock, variants=(("", "", None),)) == [
        ("variant_b_title", "Enter variant B's title"),
        ("variant_b_body", "Enter variant B's message"),
    ]
    assert ("variant_b_title", "At most 3 variants: A and 2 more") in _problems(
        catalogue_ready, clock, variants=(B, B, B)
    )
    assert (
        _problems(catalogue_ready, clock, variants=(("T", "B", "https://evil.example/x.png"),))[0][
            0
        ]
        == "variant_b_image"
    )


def test_the_payload_limit_counts_the_largest_variant(catalogue_ready, clock):
    long_body = "x" * 3900
    found = _problems(catalogue_ready, clock, variants=(("Short", long_body, None),))
    # Said at variant B's message, the one too large.
    assert len(found) == 1 and found[0][0] == "variant_b_body"
    assert found[0][1].startswith("Variant B's message is ") and "shorten it by" in found[0][1]
    assert campaigns.payload_size(_draft(variants=(("Short", long_body, None),))) > MAX_PLAINTEXT


# -- through the engine -------------------------------------------------------------------


def _people(app, fake_push, count):
    subs = []
    for _ in range(count):
        sub = fake_push.subscribe()
        response = app.test_client().post(
            "/api/push/subscribe",
            json={
                "subscription": sub.to_json(),
                "topics": ["weekly-digest"],
                "policyVersion": "v1",
            },
        )
        assert response.status_code == 201
        subs.append(sub)
    return subs


def test_each_subscription_gets_its_variants_text_and_the_funnel_counts_each(
    push_app, dispatcher, fake_push, clock, sign_in
):
    subs = _people(push_app, fake_push, 40)
    with db.begin(push_app) as session:
        campaign = campaigns.create_campaign(
            session, _draft(variants=(B,)), created_by="test", now=clock.now()
        )
        campaign_id = campaign.id
    for _ in range(4):
        dispatcher.tick()
    with db.begin(push_app) as session:
        rows = session.execute(
            sa.select(
                Delivery.id, Delivery.subscription_id, Delivery.variant, Delivery.status
            ).where(Delivery.campaign_id == campaign_id)
        ).all()
    assert {row.status for row in rows} == {"accepted"}
    assert {row.variant for row in rows} == {0, 1}
    # The variant written in SQL is the rule's, on this database.
    assert all(
        row.variant == variants.variant_of(campaign_id, row.subscription_id, 2) for row in rows
    )
    by_endpoint = {}
    for sub in subs:
        (plaintext,) = fake_push.plaintexts(sub)
        by_endpoint[sub.endpoint] = json.loads(plaintext)
    titles = Counter(payload["title"] for payload in by_endpoint.values())
    assert set(titles) == {"Sale", "Last chance"}
    variant_of_delivery = {row.id: row.variant for row in rows}
    for payload in by_endpoint.values():
        expected = (
            ("Sale", "Half price")
            if variant_of_delivery[int(payload["deliveryId"])] == 0
            else B[:2]
        )
        assert (payload["title"], payload["body"]) == expected

    # Receipts: every B shown and clicked, A shown only.
    with db.begin(push_app) as session:
        for row in rows:
            session.add(DeliveryReceipt(delivery_id=str(row.id), event="shown", at=clock.now()))
            if row.variant == 1:
                session.add(
                    DeliveryReceipt(delivery_id=str(row.id), event="clicked", at=clock.now())
                )
    with db.begin(push_app) as session:
        found = variants.results(session, session.get(Campaign, campaign_id))
    assert found is not None
    a, b = found.variants
    assert (a.deliveries + b.deliveries, a.clicked, b.clicked) == (40, 0, b.shown)
    assert b.click_through == 1.0 and a.click_through == 0.0
    assert found.leader is b

    page = htmllib.unescape(sign_in(push_app).get(f"/staff/campaigns/{campaign_id}").text)
    assert "A/B test" in page
    assert re.search(r'<tr data-variant="B">\s*<th scope="row">B: “Last chance”</th>', page)
    assert "Variant B leads:" in page


def test_a_campaign_without_variants_has_no_variant_rows_or_results(
    push_app, dispatcher, fake_push, clock
):
    _people(push_app, fake_push, 3)
    with db.begin(push_app) as session:
        campaign = campaigns.create_campaign(session, _draft(), created_by="test", now=clock.now())
        campaign_id = campaign.id
    dispatcher.tick()
    with db.begin(push_app) as session:
        assert set(
            session.scalars(sa.select(Delivery.variant).where(Delivery.campaign_id == campaign_id))
        ) == {None}
        assert variants.results(session, session.get(Campaign, campaign_id)) is None


# -- the form and the command line ----------------------------------------------------------


def test_the_form_reviews_and_launches_an_ab_test(campaigner, catalogue_ready):
    fields = form_data(
        variant_b_title="Last chance",
        variant_b_body="Ends tonight",
        variant_c_title="Don't miss it",
        variant_c_body="Midnight deadline",
    )
    review = campaigner.post("/staff/campaigns/new", {**fields, "action": "review"})
    assert review.status_code == 200
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", review.text))
    assert "3 variants, each to about 33% of the audience" in text
    assert '<input type="hidden" name="variant_c_body" value="Midnight deadline">' in review.text
    launched = campaigner.post("/staff/campaigns/new", {**fields, "action": "launch"})
    assert launched.status_code == 303
    with db.begin(catalogue_ready) as session:
        (campaign,) = session.scalars(sa.select(Campaign)).all()
        assert [v["title"] for v in campaign.variants] == [
            "Monday digest",
            "Last chance",
            "Don't miss it",
        ]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"variant_b_title": "Last chance"}, "variant_b_body", "Enter variant B's message"),
        (
            {"variant_c_title": "C", "variant_c_body": "only C"},
            "variant_b_title",
            "Enter variant B's title",
        ),
        (
            {
                "variant_b_title": "B",
                "variant_b_body": "x",
                "variant_b_image": "https://evil.example/i.png",
            },
            "variant_b_image",
            "Links may lead only to this site",
        ),
    ],
)
def test_the_form_refuses_an_incomplete_variant_and_makes_nothing(
    campaigner, catalogue_ready, fields, field, message
):
    for action in ("review", "launch"):
        answer = campaigner.post("/staff/campaigns/new", {**form_data(**fields), "action": action})
        assert answer.status_code == 422
        assert field_error(answer.text, field).startswith(message)
    with db.begin(catalogue_ready) as session:
        assert session.scalars(sa.select(Campaign)).all() == []


def test_a_clone_keeps_the_variants(push_app, clock, sign_in):
    with db.begin(push_app) as session:
        campaign = campaigns.create_campaign(
            session, _draft(variants=(B,)), created_by="test", now=clock.now()
        )
        campaign_id = campaign.id
    person = sign_in(push_app)
    cloned = person.post(f"/staff/campaigns/{campaign_id}/clone", {})
    assert cloned.status_code == 303
    page = person.get(cloned.headers["Location"]).text
    assert 'value="Last chance"' in page


def test_the_command_line_takes_variants(catalogue_ready):
    result = run(
        catalogue_ready,
        "create",
        "--topic=weekly-digest",
        "--title=Sale",
        "--body=Half price",
        "--variant=Last chance|Ends tonight",
        "--variant=Don't miss it|Midnight | deadline",
    )
    assert result.exit_code == 0, result.output
    with db.begin(catalogue_ready) as session:
        (campaign,) = session.scalars(sa.select(Campaign)).all()
        assert [(v["title"], v["body"]) for v in campaign.variants] == [
            ("Sale", "Half price"),
            ("Last chance", "Ends tonight"),
            ("Don't miss it", "Midnight | deadline"),
        ]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--variant=no bar here"], "error: variant: 'no bar here' is not TITLE|BODY"),
        (["--variant=A|a", "--variant=B|b", "--variant=C|c"], "error: variant: At most 3 variants"),
        (["--variant=|body"], "error: variant: Enter variant B's title"),
    ],
)
def test_the_command_line_refuses_what_the_form_refuses(catalogue_ready, args, error):
    result = run(catalogue_ready, "create", "--topic=weekly-digest", "--title=T", "--body=B", *args)
    assert result.exit_code == 1
    assert error in result.stderr
    with db.begin(catalogue_ready) as session:
        assert session.scalars(sa.select(Campaign)).all() == []


@pytest.mark.parametrize(
    ("share", "hours"),
    [("٣٠", "4"), ("30", "٤"), ("²", "4"), ("0", "4"), ("100", "4"), ("30", "0"), ("3 0", "4")],
)
def test_a_share_or_hours_the_form_refuses_the_command_line_refuses_too(
    campaigner, catalogue_ready, share, hours
):
    """One reading of whole numbers at both doors: ASCII digits only, in range."""
    variant = {"variant_b_title": "Last chance", "variant_b_body": "Ends tonight"}
    fields = form_data(**variant, test_share=share, winner_after_hours=hours)
    answer = campaigner.post("/staff/campaigns/new", {**fields, "action": "launch"})
    assert answer.status_code == 422
    result = run(
        catalogue_ready,
        "create",
        "--topic=weekly-digest",
        "--title=T",
        "--body=B",
        "--variant=Last chance|Ends tonight",
        f"--test-share={share}",
        f"--winner-after={hours}",
    )
    assert result.exit_code == 1, result.output
    assert re.search(r"^error: (test-share|winner-after): ", result.stderr, re.M), result.stderr
    with db.begin(catalogue_ready) as session:
        assert session.scalars(sa.select(Campaign)).all() == []


# -- the winner to the rest ---------------------------------------------------------------


def test_the_winner_is_the_best_click_through_and_a_without_anything_shown():
    assert variants.choose_winner(variants.Results([_result(0, 100, 5), _result(1, 100, 9)])) == 1
    assert variants.choose_winner(variants.Results([_result(0, 100, 9), _result(1, 100, 9)])) == 0
    assert variants.choose_winner(variants.Results([_result(0, 0, 0), _result(1, 0, 0)])) == 0


def test_a_test_share_sends_the_winner_to_the_rest_after_the_test(
    push_app, dispatcher, fake_push, clock, sign_in
):
    subs = _people(push_app, fake_push, 60)
    with db.begin(push_app) as session:
        campaign = campaigns.create_campaign(
            session,
            _draft(variants=(B,), test_share=30, winner_after_hours=4),
            created_by="test",
            now=clock.now(),
        )
        campaign_id = campaign.id
    for _ in range(3):
        dispatcher.tick()

    def deliveries():
        with db.begin(push_app) as session:
            return session.execute(
                sa.select(
                    Delivery.id,
                    Delivery.subscription_id,
                    Delivery.variant,
                    Delivery.status,
                    Delivery.reason,
                ).where(Delivery.campaign_id == campaign_id)
            ).all()

    rows = deliveries()
    tested = [r for r in rows if variants.in_test(campaign_id, r.subscription_id, 30)]
    held = [r for r in rows if not variants.in_test(campaign_id, r.subscription_id, 30)]
    assert 5 <= len(tested) <= 35 and len(tested) + len(held) == 60
    assert {(r.status, r.reason) for r in tested} == {("accepted", None)}
    assert {(r.status, r.reason, r.variant) for r in held} == {("queued", "awaiting_winner", None)}
    assert sum(len(fake_push.received(s)) for s in subs) == len(tested)
    staff = sign_in(push_app)
    page = htmllib.unescape(
        re.sub(r"<[^>]+>", "", staff.get(f"/staff/campaigns/{campaign_id}").text)
    )
    assert (
        f"{len(held)} deliveries waiting for the A/B test's winner, chosen Thu 1 Jan 2026, "
        "04:00 UTC." in page
    )
    assert "Tested on 30% of the audience." in page and "Retrying" not in page

    # Variant B's notifications get clicked, A's are only shown.
    with db.begin(push_app) as session:
        for row in tested:
            session.add(DeliveryReceipt(delivery_id=str(row.id), event="shown", at=clock.now()))
            if row.variant == 1:
                session.add(
                    DeliveryReceipt(delivery_id=str(row.id), event="clicked", at=clock.now())
                )
    clock.advance(hours=3, minutes=59)
    dispatcher.tick()
    assert {r.reason for r in deliveries() if r.id in {h.id for h in held}} == {"awaiting_winner"}
    clock.advance(minutes=1)
    for _ in range(3):
        dispatcher.tick()
    rows = deliveries()
    assert {(r.status, r.variant) for r in rows if r.id in {h.id for h in held}} == {
        ("accepted", 1)
    }
    # Each person got one message, with their delivery's variant: the held ones B's.
    variant_of_delivery = {r.id: r.variant for r in rows}
    for sub in subs:
        (plaintext,) = fake_push.plaintexts(sub)
        message = json.loads(plaintext)
        expected = "Last chance" if variant_of_delivery[int(message["deliveryId"])] else "Sale"
        assert message["title"] == expected
    with db.begin(push_app) as session:
        chosen = session.get(Campaign, campaign_id)
        assert (chosen.winner, chosen.winner_chosen_at, chosen.status) == (
            1,
            clock.now(),
            "completed",
        )
        # Choosing again does nothing: one process chooses, once.
        assert variants.send_winner(session, campaign_id, now=clock.now()) is None
    assert staff.sign_in(CAMPAIGNER).status_code == 303  # the staff session ended meanwhile
    page = htmllib.unescape(
        re.sub(r"<[^>]+>", "", staff.get(f"/staff/campaigns/{campaign_id}").text)
    )
    assert (
        "Variant B won (chosen Thu 1 Jan 2026, 04:00 UTC, by the best click-through rate)" in page
    )


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"test_share": 20, "winner_after_hours": 4}, "test_share", "A test share needs variants"),
        (
            {"variants": (B,), "test_share": 0, "winner_after_hours": 4},
            "test_share",
            "Enter the test share",
        ),
        (
            {"variants": (B,), "test_share": 100, "winner_after_hours": 4},
            "test_share",
            "Enter the test share",
        ),
        (
            {"variants": (B,), "test_share": 20},
            "winner_after_hours",
            "Enter when to send the winner",
        ),
        (
            {"variants": (B,), "test_share": 20, "winner_after_hours": 169},
            "winner_after_hours",
            "Enter when to send the winner",
        ),
        ({"variants": (B,), "winner_after_hours": 4}, "test_share", "Enter the test share"),
        (
            {"variants": (B,), "test_share": 20, "winner_after_hours": 4, "local_time": dt.time(9)},
            "test_share",
            "A test whose winner goes to the rest later cannot also be sent at a local time",
        ),
    ],
)
def test_a_test_share_follows_its_rules(catalogue_ready, clock, fields, field, message):
    found = _problems(catalogue_ready, clock, **fields)
    assert any(f == field and m.startswith(message) for f, m in found), found


def test_dont_deliver_after_must_come_after_the_winner(catalogue_ready, clock):
    found = _problems(
        catalogue_ready,
        clock,
        variants=(B,),
        test_share=20,
        winner_after_hours=4,
        deliver_until=clock.now() + dt.timedelta(hours=3),
    )
    assert (
        "deliver_until",
        "“Don't deliver after” must be later than when the winner is sent (4 hours after the send time)",
    ) in found


def test_the_form_and_the_command_line_take_a_test_share(campaigner, catalogue_ready):
    fields = form_data(
        variant_b_title="Last chance",
        variant_b_body="Ends tonight",
        test_share="25",
        winner_after_hours="6",
    )
    assert (
        campaigner.post("/staff/campaigns/new", {**fields, "action": "launch"}).status_code == 303
    )
    refused = campaigner.post(
        "/staff/campaigns/new", {**form_data(test_share="a lot"), "action": "review"}
    )
    assert refused.status_code == 422
    assert "Enter the test share as a whole percentage, like 20" in refused.text
    result = run(
        catalogue_ready,
        "create",
        "--topic=weekly-digest",
        "--title=Sale",
        "--body=Half price",
        "--variant=Last chance|Ends tonight",
        "--test-share=10",
        "--winner-after=2",
    )
    assert result.exit_code == 0, result.output
    with db.begin(catalogue_ready) as session:
        kept = [
            (c.test_share, c.winner_after)
            for c in session.scalars(sa.select(Campaign).order_by(Campaign.created_at, Campaign.id))
        ]
    assert sorted(kept) == [(10, 7200), (25, 21600)]
    alone = run(
        catalogue_ready,
        "create",
        "--topic=weekly-digest",
        "--title=T",
        "--body=B",
        "--test-share=10",
        "--winner-after=2",
    )
    assert alone.exit_code == 1 and "error: test-share: A test share needs variants" in alone.stderr
