"""No input stalls the engine (SPEC §7): one delivery that cannot be built or sent fails
alone, with its reason; the batch, the job and the campaign go on."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery import engine as engine_module
from tests.fakepush import token_of
from tests.helpers import all_rows

SUBSCRIBE = "/api/push/subscribe"


def _subscribe(app, sub):
    body = {"subscription": sub.to_json(), "topics": ["weekly-digest"], "policyVersion": "v1"}
    response = app.test_client().post(SUBSCRIBE, json=body)
    assert response.status_code == 201, response.json
    return uuid.UUID(response.json["id"])


def _launch(app, clock):
    with db.begin(app) as session:
        draft = CampaignDraft(topic="weekly-digest", title="Monday digest", body="Five things")
        return campaigns.create_campaign(session, draft, created_by="test", now=clock.now()).id


def _deliveries(engine):
    subs = {uuid.UUID(str(r["id"])): r for r in all_rows(engine, "push_subscription")}
    return {
        token_of_row(subs[uuid.UUID(str(d["subscription_id"]))]): (d["status"], d["reason"])
        for d in all_rows(engine, "delivery")
    }


def token_of_row(row) -> str:
    return row["endpoint"].rsplit("/", 1)[1]


def _status(app, campaign_id) -> str:
    with db.begin(app) as session:
        return session.get(Campaign, campaign_id).status


def test_an_endpoint_with_its_scheme_in_capitals_is_sent_and_the_campaign_finishes(
    push_app, dispatcher, fake_push, clock, engine
):
    good = [fake_push.subscribe() for _ in range(2)]
    capitals = fake_push.subscribe()
    capitals.endpoint = capitals.endpoint.replace("https://", "HTTPS://")
    for sub in (*good, capitals):
        _subscribe(push_app, sub)
    campaign_id = _launch(push_app, clock)

    report = dispatcher.tick()

    assert (report.accepted, report.failed) == (3, 0)
    for sub in (*good, capitals):
        assert len(fake_push.plaintexts(token_of(sub))) == 1
    assert _status(push_app, campaign_id) == "completed"


def test_a_row_the_transport_refuses_and_a_row_that_raises_fail_alone(
    push_app, dispatcher, fake_push, clock, engine, monkeypatch, caplog
):
    subs = [fake_push.subscribe() for _ in range(5)]
    ids = [_subscribe(push_app, sub) for sub in subs]
    refused, raising = subs[1], subs[3]
    # Written straight into the table in a form no push service takes.
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET endpoint = :e WHERE endpoint = :old"),
            {"e": refused.endpoint.replace("https://", "http://"), "old": refused.endpoint},
        )
    real = engine_module.PushRequest.encrypted

    def encrypted(endpoint, *args, **kwargs):
        if endpoint == raising.endpoint:
            raise RuntimeError("injected: this one message cannot be built")
        return real(endpoint, *args, **kwargs)

    monkeypatch.setattr(engine_module.PushRequest, "encrypted", encrypted)
    campaign_id = _launch(push_app, clock)

    report = dispatcher.tick()

    assert (report.claimed, report.accepted, report.failed) == (5, 3, 2)
    for sub in (subs[0], subs[2], subs[4]):
        assert len(fake_push.plaintexts(sub)) == 1
    assert fake_push.received(refused) == [] and fake_push.received(raising) == []
    outcome = _deliveries(engine)
    assert outcome.pop(token_of(refused)) == ("failed", "invalid_endpoint")
    assert outcome.pop(token_of(raising)) == ("failed", "send_error")
    assert set(outcome.values()) == {("accepted", None)}
    assert _status(push_app, campaign_id) == "completed"
    # Not the subscriptions' fault as far as anyone knows: their lifecycle is untouched.
    states = {uuid.UUID(str(r["id"])): r["state"] for r in all_rows(engine, "push_subscription")}
    assert states[ids[1]] == states[ids[3]] == "pending"
    assert refused.endpoint.split("//")[1] not in caplog.text  # no endpoint in the logs
    # Nothing is left leased, so nothing is claimed again at the next expiry.
    clock.advance(minutes=10)
    assert dispatcher.tick().claimed == 0


def test_a_request_the_transport_cannot_prepare_fails_alone(
    push_app, dispatcher, fake_push, clock, engine, monkeypatch
):
    subs = [fake_push.subscribe() for _ in range(4)]
    for sub in subs:
        _subscribe(push_app, sub)
    transport = dispatcher.transport
    real = transport._prepare

    def prepare(request):
        if request.endpoint == subs[2].endpoint:
            raise RuntimeError("injected: the transport cannot prepare this one")
        return real(request)

    monkeypatch.setattr(transport, "_prepare", prepare)
    campaign_id = _launch(push_app, clock)

    report = dispatcher.tick()

    assert (report.accepted, report.failed) == (3, 1)
    outcome = _deliveries(engine)
    assert outcome.pop(token_of(subs[2])) == ("failed", "send_error")
    assert set(outcome.values()) == {("accepted", None)}
    for sub in (subs[0], subs[1], subs[3]):
        assert len(fake_push.plaintexts(sub)) == 1
    assert _status(push_app, campaign_id) == "completed"


def test_run_job_dispatch_exits_zero_when_one_row_is_bad(
    push_app, dispatcher, fake_push, clock, engine
):
    subs = [fake_push.subscribe() for _ in range(3)]
    for sub in subs:
        _subscribe(push_app, sub)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET endpoint = :e WHERE endpoint = :old"),
            {"e": subs[0].endpoint.replace("https://", "http://"), "old": subs[0].endpoint},
        )
    campaign_id = _launch(push_app, clock)

    result = push_app.test_cli_runner().invoke(args=["portal", "run-job", "dispatch"])

    assert result.exit_code == 0, result.output
    assert "dispatch: 3 rows looked at, 3 changed" in result.output
    assert [len(fake_push.plaintexts(s)) for s in subs] == [0, 1, 1]
    statuses = sorted((d["status"], d["reason"]) for d in all_rows(engine, "delivery"))
    assert statuses == [("accepted", None), ("accepted", None), ("failed", "invalid_endpoint")]
    assert _status(push_app, campaign_id) == "completed"
    assert all(d["lease_expires_at"] is None for d in all_rows(engine, "delivery"))
