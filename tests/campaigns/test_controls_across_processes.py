"""Cancel or pause a campaign from one process while another materialises and sends it.

The dispatching process is ``tests/campaigns/dispatch_loop.py``: the dispatcher's tick
over and over (a materialisation batch of 400, send batches of 200) against the fake push
service, which answers after 0.15 s, and a tenth of the messages 503 (to be tried again). This process
launches a campaign to a few thousand recipients, waits a seeded random moment and
cancels (or pauses) it, then waits for the dispatching process's batch under way to be
recorded. Each time:

- once the dispatching process has marked what the cancel left queued (its tick's
  ``skip_unsent``), nothing of the campaign is ``queued`` or ``sending``;
- every delivery is ``skipped`` as ``cancelled``, or was taken for sending before the
  cancel committed (what the cancel's own transaction saw as out or answered): nothing
  queued then is claimed or sent after it, nor anything brought back to the queue;
- after a pause, nothing is claimed and no delivery is added after the pause committed;
- the campaign page's counts add up.

On SQLite the two processes share the file, and its write lock serialises them.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask

from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign, CampaignStatus
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery.models import Delivery, DeliveryStatus
from tests.campaigns.test_controls_under_concurrency import campaign_page_adds_up
from tests.campaigns.test_multiprocess import environ, populate
from tests.conftest import BACKEND
from tests.fakepush import Answer, FakePushProcess, token_of
from tests.support import ROOT, stop

pytestmark = pytest.mark.slow

AUDIENCE = 3000
MATERIALISE_BATCH = 400
SEND_BATCH = 200
# 50 runs on PostgreSQL (under a minute); SQLite, slower to write, runs fewer. RACE_RUNS
# sets another number, for a longer run by hand.
RUNS = int(os.environ.get("RACE_RUNS") or (50 if BACKEND == "postgresql" else 12))
WINDOW = 0.6  # the cancel lands this long (at most) after the campaign starts


def real_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class DispatchLoop:
    def __init__(self, env: dict, log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.campaigns.dispatch_loop",
                    str(MATERIALISE_BATCH),
                    str(SEND_BATCH),
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while "dispatching" not in self.output():
            self.check()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"the dispatching process exited:\n{self.output()[-3000:]}")


@pytest.fixture
def world(catalogue_ready, settings, tmp_path) -> Iterator[tuple[Flask, FakePushProcess, list]]:
    app = catalogue_ready
    # Answers take 0.15 s: a batch is out for about half a second, so many changes land
    # while one is.
    with FakePushProcess(decrypt=False, record=False, default_answer=Answer.slow(0.15)) as push:
        browsers = populate(app, push, AUDIENCE, region="US")
        loop = DispatchLoop(environ(settings, push, tmp_path), tmp_path / "dispatch.log")
        try:
            yield app, push, browsers, loop
        finally:
            stop(loop.process)  # before the database is emptied: it holds connections


def launch(app: Flask) -> uuid.UUID:
    draft = CampaignDraft(topic="weekly-digest", title="Race", body="Five things", url="/news")
    with db.begin(app) as session:
        return campaigns.create_campaign(session, draft, created_by="test", now=real_now()).id


def rows(app: Flask, campaign_id: uuid.UUID) -> dict[int, tuple[str, str | None]]:
    with db.begin(app) as session:
        found = session.execute(
            sa.select(Delivery.id, Delivery.status, Delivery.reason).where(
                Delivery.campaign_id == campaign_id
            )
        ).all()
    return {delivery_id: (status, reason) for delivery_id, status, reason in found}


def wait_started(app: Flask, campaign_id: uuid.UUID, loop: DispatchLoop) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with db.begin(app) as session:
            status = session.execute(
                sa.select(Campaign.status).where(Campaign.id == campaign_id)
            ).scalar_one()
        if status != CampaignStatus.SCHEDULED.value:
            return
        loop.check()
        time.sleep(0.005)
    raise AssertionError("the campaign never started")


def settle(
    app: Flask,
    campaign_id: uuid.UUID,
    loop: DispatchLoop,
    out: tuple[str, ...] = (DeliveryStatus.SENDING.value,),
) -> dict:
    """Wait until the batch the dispatching process had under way is recorded: nothing
    of the campaign is ``out`` (``sending``; after a cancel ``queued`` too, which the
    dispatching process marks skipped) and nothing changes for a while."""
    deadline = time.monotonic() + 30
    last: dict | None = None
    while time.monotonic() < deadline:
        loop.check()
        found = rows(app, campaign_id)
        sending = [d for d, (status, _) in found.items() if status in out]
        if not sending and found == last:
            return found
        last = found
        time.sleep(0.15)
    raise AssertionError(
        f"still sending 30 s after the change: {Counter(s for s, _ in (last or {}).values())}"
    )


def change(app: Flask, campaign_id: uuid.UUID, action: str) -> dict[int, tuple[str, str | None]]:
    """Cancel or pause; what the change's own transaction sees afterwards."""
    with db.begin(app) as session:
        campaigns.control(session, campaign_id, action, now=real_now())
        seen = session.execute(
            sa.select(Delivery.id, Delivery.status, Delivery.reason).where(
                Delivery.campaign_id == campaign_id
            )
        ).all()
    return {delivery_id: (status, reason) for delivery_id, status, reason in seen}


def retries_for(push: FakePushProcess, browsers: list, moments: random.Random) -> None:
    """A tenth of the recipients get a 503 for their next message (tried again later)."""
    chosen = moments.sample(browsers, len(browsers) // 10)
    push.script_many((token_of(b), [Answer.of(503)]) for b in chosen)


CANCELLED = (DeliveryStatus.SKIPPED.value, "cancelled")
OUT = (DeliveryStatus.QUEUED.value, DeliveryStatus.SENDING.value)


def test_a_cancel_from_another_process_at_any_moment_leaves_nothing_to_send(world):
    app, push, browsers, loop = world
    moments = random.Random("cancel-across-processes-20261202")
    mid_way = in_flight = 0
    problems: list[str] = []  # every run's, so a failure shows how often and how
    for run in range(RUNS):
        retries_for(push, browsers, moments)
        campaign_id = launch(app)
        wait_started(app, campaign_id, loop)
        time.sleep(moments.uniform(0, WINDOW))
        at_cancel = change(app, campaign_id, "cancel")
        # Out to a push service or answered when the cancel committed; the rest, queued
        # (or skipped as cancelled, by the recording of a batch claimed before it), must
        # end as cancelled.
        taken = {
            d
            for d, row in at_cancel.items()
            if row != CANCELLED and row[0] != DeliveryStatus.QUEUED.value
        }
        after = settle(app, campaign_id, loop, out=OUT)
        left = Counter(
            status
            for status, _ in after.values()
            if status in (DeliveryStatus.QUEUED.value, DeliveryStatus.SENDING.value)
        )
        if left:
            problems.append(f"run {run}: the cancelled campaign kept {dict(left)}")
        late = Counter(row for d, row in after.items() if row != CANCELLED and d not in taken)
        if late:
            problems.append(f"run {run}: taken after the cancel: {dict(late)}")
        if set(after) != set(at_cancel):
            problems.append(f"run {run}: {len(set(after) - set(at_cancel))} added after it")
        campaign_page_adds_up(app, campaign_id)
        mid_way += 0 < len(after) < AUDIENCE
        in_flight += DeliveryStatus.SENDING.value in {s for s, _ in at_cancel.values()}
    assert not problems, f"{len(problems)} of {RUNS} runs:\n" + "\n".join(problems)
    # The cancels really landed mid-way: during materialisation, and with a batch out.
    assert mid_way >= RUNS // 2, mid_way
    assert in_flight >= RUNS // 4, in_flight


def test_a_pause_from_another_process_stops_claims_and_materialisation(world):
    app, push, browsers, loop = world
    moments = random.Random("pause-across-processes-20261202")
    runs = max(RUNS // 4, 5)
    mid_way = 0
    for run in range(runs):
        retries_for(push, browsers, moments)
        campaign_id = launch(app)
        wait_started(app, campaign_id, loop)
        time.sleep(moments.uniform(0, WINDOW))
        at_pause = change(app, campaign_id, "pause")
        after = settle(app, campaign_id, loop)
        assert set(after) == set(at_pause), f"run {run}: deliveries added after the pause"
        for delivery_id, (status, _) in after.items():
            before = at_pause[delivery_id][0]
            if before == DeliveryStatus.QUEUED.value:
                assert status == DeliveryStatus.QUEUED.value, (
                    f"run {run}: delivery {delivery_id} was queued at the pause, now {status}"
                )
        assert DeliveryStatus.SENDING.value not in {s for s, _ in after.values()}
        campaign_page_adds_up(app, campaign_id)
        mid_way += 0 < len(after) < AUDIENCE
        with db.begin(app) as session:
            campaigns.control(session, campaign_id, "cancel", now=real_now())
    assert mid_way >= runs // 2, mid_way
