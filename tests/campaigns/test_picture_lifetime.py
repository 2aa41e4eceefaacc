"""How long uploaded pictures live and how many one person may upload: unused pictures go
with the table-retention job after PICTURE_UNUSED_RETENTION_DAYS, pictures a campaign or a
draft names stay; PICTURE_UPLOADS_PER_DAY new pictures per member of staff in any 24 hours.
On SQLite and on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import io
import struct
import zlib
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from flask import Flask

from portal import create_app
from portal.campaigns import drafts, media
from portal.campaigns import services as campaigns
from portal.campaigns.media_models import Picture
from portal.campaigns.services import CampaignDraft
from portal.config import PictureSettings, RetentionSettings
from portal.db import db
from portal.jobs import run_job
from tests.campaigns.conftest import CAMPAIGNER, form_data

DAY = dt.timedelta(days=1)


def png(seed: int) -> bytes:
    """A different valid 1 × 1 PNG for each ``seed`` (its one pixel's colour)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixel = zlib.compress(b"\0" + seed.to_bytes(3, "big"))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", pixel) + chunk(b"IEND", b"")


@pytest.fixture
def app(catalogue_ready, clock) -> Iterator[Flask]:
    portal = catalogue_ready.extensions["portal"]
    application = create_app(
        portal.settings.with_overrides(
            retention=RetentionSettings(batch_size=2), pictures=PictureSettings(uploads_per_day=3)
        ),
        clock=clock,
    )
    application.config["TESTING"] = True
    yield application
    application.extensions["portal.db"].engine.dispose()


def _keep(app, seed: int, clock) -> str:
    with db.begin(app) as session:
        return media.path_of(media.store(session, png(seed), uploaded_by=None, now=clock.now()))


def _kept(app) -> set[str]:
    with db.begin(app) as session:
        return {media.path_of(p) for p in session.scalars(sa.select(Picture))}


def test_unused_pictures_go_after_the_window_and_named_ones_stay(app, clock):
    as_icon, as_image, as_badge, in_variant, in_draft, unused, recent = (
        _keep(app, seed, clock) for seed in range(7)
    )
    with db.begin(app) as session:
        draft = CampaignDraft(
            topic="weekly-digest",
            title="Sale",
            body="Half price",
            icon=as_icon,
            image=as_image,
            badge=as_badge,
            variants=(("B", "b", in_variant),),
        )
        campaign = campaigns.create_campaign(session, draft, created_by="test", now=clock.now())
        # An absolute address (PUBLIC_URL's, or a campaign link origin's) names it too.
        campaign.image = f"https://portal.example.test{as_image}"
        drafts.create(
            session,
            {**form_data(), "title": "Later", "image": in_draft},
            by="test",
            now=clock.now(),
        )
    clock.advance(DAY * 31)
    fresh = _keep(app, 99, clock)
    report = run_job(app, "table-retention")
    assert not report.problems
    assert _kept(app) == {as_icon, as_image, as_badge, in_variant, in_draft, fresh}
    assert unused not in _kept(app) and recent not in _kept(app)
    assert app.test_client().get(unused).status_code == 404
    assert app.test_client().get(as_icon).status_code == 200


def test_nothing_goes_inside_the_window(app, clock):
    paths = {_keep(app, seed, clock) for seed in range(3)}
    clock.advance(DAY * 29)
    run_job(app, "table-retention")
    assert _kept(app) == paths


def _upload(person, seed: int):
    return person.post(
        "/staff/campaigns/new",
        {
            **form_data(),
            "upload": (io.BytesIO(png(seed)), "dot.png"),
            "upload_as": "image",
            "action": "preview",
        },
        content_type="multipart/form-data",
    )


def test_one_person_uploads_at_most_the_quota_in_any_24_hours(app, clock, sign_in):
    person = sign_in(app)
    for seed in range(3):
        assert _upload(person, seed).status_code == 200
    refused = _upload(person, 3)
    assert refused.status_code == 422
    assert (
        "You have uploaded 3 pictures in the last 24 hours, the most one person may: use a "
        "picture already kept, or upload again after 00:00 UTC"
    ) in refused.text.replace("&#39;", "'")
    assert len(_kept(app)) == 3
    # The same file again is the kept picture: no new one, so no refusal.
    assert _upload(person, 1).status_code == 200
    # A day after the first, one more may come.
    clock.advance(DAY + dt.timedelta(seconds=1))
    assert person.sign_in(CAMPAIGNER).status_code == 303  # the staff session ended meanwhile
    assert _upload(person, 3).status_code == 200
    assert len(_kept(app)) == 4


def test_the_command_line_has_no_quota(app, clock, tmp_path):
    for seed in range(5):
        path = tmp_path / f"{seed}.png"
        path.write_bytes(png(seed))
        result = app.test_cli_runner().invoke(
            args=["portal", "campaign", "upload-picture", str(path)]
        )
        assert result.exit_code == 0, result.output
    assert len(_kept(app)) == 5
