"""Pictures staff upload for a campaign's icon, image or badge: what is taken (by the
bytes, whole, within the limits), how it is kept and served, and the form's and the
command line's doors to it.

The sample files in ``pictures/`` were encoded by Chromium's canvas (JPEG, PNG, WebP; the
two simple WebP files are the VP8 and VP8L chunks of its files in a RIFF of their own)
and the GIF by hand; the browser test decodes every one of them and compares its size
with what the reader says.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from portal.campaigns import media
from portal.campaigns.media_models import Picture
from portal.campaigns.models import Campaign
from portal.db import db
from portal.errors import NotFound, ValidationError
from portal.staff.models import Role
from tests.campaigns.conftest import form_data
from tests.campaigns.test_cli import run
from tests.campaigns.test_form import field_error, summary_links
from tests.campaigns.test_pages import audit_rows

PICTURES = Path(__file__).parent / "pictures"
SAMPLES = sorted(PICTURES.iterdir())
TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}


def sample(name: str) -> bytes:
    return (PICTURES / name).read_bytes()


def expected_size(path: Path) -> tuple[int, int]:
    match = re.search(r"(\d+)x(\d+)\.", path.name)
    assert match, path.name
    return int(match[1]), int(match[2])


def stored(app) -> list[Picture]:
    with db.begin(app) as session:
        found = list(session.scalars(sa.select(Picture)))
        session.expunge_all()
        return found


# -- what is taken ---------------------------------------------------------------------


@pytest.mark.no_database
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_each_format_is_read_from_its_bytes(path: Path) -> None:
    shape = media.read_shape(path.read_bytes())
    assert shape.content_type == TYPES[path.suffix]
    assert (shape.width, shape.height) == expected_size(path)


@pytest.mark.no_database
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_a_cut_off_file_is_refused(path: Path) -> None:
    data = path.read_bytes()
    for cut in (1, len(data) // 2, len(data) - 8):
        with pytest.raises(ValidationError) as refused:
            media.read_shape(data[:-cut])
        assert refused.value.field == "upload"


@pytest.mark.no_database
@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "The file is empty"),
        (b"<?xml version='1.0'?><svg xmlns='http://www.w3.org/2000/svg'/>", "SVG is not"),
        (b"<SVG onload=alert(1)>", "SVG is not"),
        (b"<html><script>alert(1)</script></html>", "not a picture this site takes"),
        (b"%PDF-1.7\n", "not a picture this site takes"),
        (b"\xff\xd8\xff\xd9", "no frame header"),
        (b"\xff\xd8\xff\xda\x00\x02\xff\xd9", "no frame header"),
        (b"GIF89a\x01\x00", "no header"),
    ],
)
def test_what_is_not_a_whole_picture_is_refused_saying_why(data: bytes, says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        media.read_shape(data)
    assert says in refused.value.message


def _png_of(width: int, height: int) -> bytes:
    data = bytearray(sample("icon-64x64.png"))
    data[16:24] = struct.pack(">II", width, height)
    return bytes(data)


@pytest.mark.no_database
@pytest.mark.parametrize(("width", "height"), [(0, 10), (10, 0), (4097, 10), (10, 4097)])
def test_sides_out_of_range_are_refused(width: int, height: int) -> None:
    with pytest.raises(ValidationError) as refused:
        media.read_shape(_png_of(width, height))
    assert f"{width} × {height} pixels" in refused.value.message


@pytest.mark.no_database
def test_the_largest_sides_and_size_are_taken_and_one_byte_more_is_not() -> None:
    assert media.read_shape(_png_of(4096, 4096)).width == 4096
    png = sample("icon-64x64.png")

    # Padding inside the file (an ancillary chunk before IEND) up to the limit exactly.
    def padded(total: int) -> bytes:
        pad = total - len(png) - 12
        chunk = struct.pack(">I", pad) + b"teXt" + b"\0" * pad + b"\0\0\0\0"
        return png[:-12] + chunk + png[-12:]

    assert media.read_shape(padded(media.MAX_BYTES)).content_type == "image/png"
    with pytest.raises(ValidationError) as refused:
        media.read_shape(padded(media.MAX_BYTES + 1))
    assert "the most is 512 kB" in refused.value.message


@pytest.mark.no_database
def test_a_webp_whose_riff_size_disagrees_is_refused() -> None:
    data = bytearray(sample("simple-72x36.webp"))
    data[4:8] = struct.pack("<I", len(data))  # 8 too many
    with pytest.raises(ValidationError):
        media.read_shape(bytes(data))


@pytest.mark.no_database
@settings(max_examples=400, deadline=None)
@given(
    prefix=st.sampled_from([b"", *(p.read_bytes()[:40] for p in SAMPLES)]),
    tail=st.binary(max_size=300),
)
def test_any_bytes_are_a_shape_within_the_limits_or_a_refusal(prefix: bytes, tail: bytes) -> None:
    try:
        shape = media.read_shape(prefix + tail)
    except ValidationError as refused:
        assert refused.field == "upload"
        assert refused.message
    else:
        assert shape.content_type in media.FORMATS
        assert 1 <= shape.width <= media.MAX_SIDE
        assert 1 <= shape.height <= media.MAX_SIDE


# -- kept and served -------------------------------------------------------------------


def test_the_same_file_twice_is_one_picture_at_one_address(app, clock) -> None:
    data = sample("sale-72x36.jpg")
    with db.begin(app) as session:
        first = media.path_of(media.store(session, data, uploaded_by=None, now=clock.now()))
    with db.begin(app) as session:
        again = media.path_of(media.store(session, data, uploaded_by=None, now=clock.now()))
    assert first == again == f"/media/{hashlib.sha256(data).hexdigest()}.jpg"
    assert len(stored(app)) == 1


def test_two_uploads_of_one_file_at_once_keep_one_picture(app, clock) -> None:
    data = sample("simple-lossless-40x20.webp")
    start = threading.Barrier(2)
    paths: list[str] = []

    def upload() -> None:
        start.wait()
        with db.begin(app) as session:
            paths.append(
                media.path_of(media.store(session, data, uploaded_by=None, now=clock.now()))
            )

    threads = [threading.Thread(target=upload) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(paths) == 2 and paths[0] == paths[1]
    assert len(stored(app)) == 1


def test_a_refused_file_stores_nothing(app, clock) -> None:
    with db.begin(app) as session, pytest.raises(ValidationError):
        media.store(session, b"<svg/>", uploaded_by=None, now=clock.now())
    assert stored(app) == []


def test_the_address_serves_the_bytes_with_their_type_for_a_year(app, clock) -> None:
    data = sample("icon-64x64.png")
    with db.begin(app) as session:
        path = media.path_of(media.store(session, data, uploaded_by=None, now=clock.now()))
    client = app.test_client()
    response = client.get(path)
    assert response.status_code == 200
    assert response.data == data
    assert response.headers["Content-Type"] == "image/png"
    assert response.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "sandbox" in policy and "script" not in policy
    etag = response.headers["ETag"]
    assert client.get(path, headers={"If-None-Match": etag}).status_code == 304
    assert client.head(path).status_code == 200


def test_an_address_that_is_not_exactly_a_kept_picture_is_not_found(app, clock) -> None:
    data = sample("icon-64x64.png")
    with db.begin(app) as session:
        path = media.path_of(media.store(session, data, uploaded_by=None, now=clock.now()))
    digest = hashlib.sha256(data).hexdigest()
    client = app.test_client()
    for wrong in (
        f"/media/{digest}.jpg",  # another extension
        f"/media/{digest.upper()}.png",
        f"/media/{digest}.PNG",
        f"/media/{digest}",
        f"/media/{digest}.png.png",
        f"/media/{'0' * 64}.png",
        "/media/x",
        path + "?download=1",  # the query is ignored; the address still serves
    ):
        response = client.get(wrong)
        assert response.status_code == (200 if "?" in wrong else 404), wrong
    with db.begin(app) as session, pytest.raises(NotFound):
        media.find(session, f"{digest}.gif")


# -- the form --------------------------------------------------------------------------


BOUNDARY = "picture-boundary"


def multipart(fields: dict[str, str], name: str, data: bytes) -> bytes:
    """A form with one file, as a browser sends it. Written out here: the test client
    would spool a file over 500 kB to a temporary file it never closes."""
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'
        for key, value in fields.items()
    ]
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="upload"; filename="{name}"'
    return (
        "".join(parts).encode()
        + f"{head}\r\nContent-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )


def _upload(person, name: str, data: bytes, **fields):
    values = {
        "csrf_token": person.token(),
        **form_data(**fields),
        "action": fields.get("action", "preview"),
        "upload_as": fields.get("upload_as", "image"),
    }
    return person.client.post(
        "/staff/campaigns/new",
        data=multipart(values, name, data),
        content_type=f"multipart/form-data; boundary={BOUNDARY}",
    )


def test_an_upload_fills_the_chosen_field_and_the_preview_draws_it(campaigner, catalogue_ready):
    app = catalogue_ready
    data = sample("sale-72x36.jpg")
    path = f"/media/{hashlib.sha256(data).hexdigest()}.jpg"
    page = _upload(campaigner, "holiday sale.JPG", data)
    assert page.status_code == 200, page.text
    assert f'name="image" type="text" value="{path}"' in page.text
    assert f'src="{path}"' in page.text  # the preview's <img>
    assert f"Uploaded: 72 × 36 pixels, kept at {path}, and now the image" in page.text
    [(who, target, detail)] = audit_rows(app, "campaign.picture_uploaded")
    assert target == f"picture:{hashlib.sha256(data).hexdigest()}"
    assert detail == {
        "path": path,
        "usedAs": "image",
        "type": "image/jpeg",
        "width": 72,
        "height": 36,
        "bytes": len(data),
    }
    assert who == "campaigner@example.test"


def test_uploaded_as_the_icon_then_launched_the_payload_names_it(campaigner, catalogue_ready):
    app = catalogue_ready
    data = sample("icon-64x64.png")
    review = _upload(campaigner, "icon.png", data, upload_as="icon", action="review")
    assert review.status_code == 200, review.text
    path = f"/media/{hashlib.sha256(data).hexdigest()}.png"
    campaign_id = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review.text).group(1)
    launched = campaigner.post(
        "/staff/campaigns/new",
        {**form_data(icon=path), "campaign_id": campaign_id, "action": "launch"},
    )
    assert launched.status_code == 303, launched.text
    with db.begin(app) as session:
        assert session.get(Campaign, uuid.UUID(campaign_id)).icon == path


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("notes.png", b"just text", "The file is not a picture this site takes"),
        ("logo.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>", "SVG is not accepted"),
        ("cut.jpg", sample("sale-72x36.jpg")[:-1], "The JPEG file is cut off"),
        ("empty.png", b"", "The file is empty"),
    ],
)
def test_a_refused_upload_says_why_at_the_field_and_keeps_nothing(
    campaigner, catalogue_ready, name, data, says
):
    app = catalogue_ready
    page = _upload(campaigner, name, data, image="/static/img/kept.png", action="review")
    assert page.status_code == 422
    assert field_error(page.text, "upload").startswith(says)
    assert summary_links(page.text)[0][0] == "upload"
    assert 'value="/static/img/kept.png"' in page.text  # what was typed stays
    assert stored(app) == []
    assert audit_rows(app, "campaign.picture_uploaded") == []


def test_a_picture_over_the_limit_is_refused_saying_its_own_size(
    campaigner, catalogue_ready, tmp_path
):
    big = (
        _png_of(64, 64)[:-12]
        + struct.pack(">I", 600 * 1024)
        + b"teXt"
        + b"\0" * (600 * 1024)
        + b"\0\0\0\0"
        + _png_of(64, 64)[-12:]
    )
    page = _upload(campaigner, "big.png", big)
    assert page.status_code == 422
    assert field_error(page.text, "upload").startswith(
        f"The picture is {len(big) / 1024:,.0f} kB: the most is 512 kB"
    )
    file = tmp_path / "big.png"
    file.write_bytes(big)
    result = run(catalogue_ready, "upload-picture", str(file))
    assert result.exit_code == 1
    assert f"The picture is {len(big) / 1024:,.0f} kB" in result.stderr
    assert stored(catalogue_ready) == []


def test_an_unknown_use_is_refused_and_nothing_is_kept(campaigner, catalogue_ready):
    page = _upload(campaigner, "x.png", sample("icon-64x64.png"), upload_as="url")
    assert page.status_code == 422
    assert field_error(page.text, "upload_as") == "Choose what the uploaded picture is for"
    assert stored(catalogue_ready) == []


def test_a_file_larger_than_a_request_may_be_is_refused_before_anything(
    campaigner, catalogue_ready
):
    page = _upload(campaigner, "huge.png", b"\x89PNG\r\n\x1a\n" + b"\0" * (2 * 1024 * 1024))
    assert page.status_code == 413
    assert stored(catalogue_ready) == []


def test_no_file_chosen_changes_nothing(campaigner, catalogue_ready):
    page = _upload(campaigner, "", b"")
    assert page.status_code == 200
    assert "Uploaded:" not in page.text
    assert stored(catalogue_ready) == []


def test_only_the_campaigns_role_can_upload(catalogue_ready, sign_in):
    officer = sign_in(catalogue_ready, "officer@example.test", Role.COMPLIANCE)
    page = _upload(officer, "x.png", sample("icon-64x64.png"))
    assert page.status_code == 403
    client = catalogue_ready.test_client()
    anonymous = client.post(
        "/staff/campaigns/new",
        data={"upload": (io.BytesIO(sample("icon-64x64.png")), "x.png")},
        content_type="multipart/form-data",
    )
    assert anonymous.status_code in (302, 303, 400, 401, 403)
    assert stored(catalogue_ready) == []


# -- the command line ------------------------------------------------------------------


def test_the_command_line_keeps_a_picture_and_prints_its_address(catalogue_ready, tmp_path):
    app = catalogue_ready
    data = sample("simple-72x36.webp")
    file = tmp_path / "sale.webp"
    file.write_bytes(data)
    result = run(app, "upload-picture", str(file))
    assert result.exit_code == 0, result.output
    path = f"/media/{hashlib.sha256(data).hexdigest()}.webp"
    assert result.stdout.strip() == path
    [(_, target, detail)] = audit_rows(app, "campaign.picture_uploaded")
    assert detail["via"] == "cli"
    assert target.endswith(hashlib.sha256(data).hexdigest())
    created = run(
        app, "create", "--topic", "weekly-digest", "--title", "T", "--body", "B", "--image", path
    )
    assert created.exit_code == 0, created.output


def test_the_command_line_refuses_what_the_form_refuses(catalogue_ready, tmp_path):
    file = tmp_path / "logo.svg"
    file.write_bytes(b"<svg/>")
    result = run(catalogue_ready, "upload-picture", str(file))
    assert result.exit_code == 1
    assert "SVG is not accepted" in result.stderr
    assert stored(catalogue_ready) == []


# -- an address that names no picture -----------------------------------------------------


def test_a_media_address_naming_no_picture_is_refused_by_the_form_and_the_command_line(
    campaigner, catalogue_ready
):
    app = catalogue_ready
    missing = f"/media/{'ab' * 32}.png"
    page = campaigner.post(
        "/staff/campaigns/new", {**form_data(image=missing, badge=missing), "action": "review"}
    )
    assert page.status_code == 422
    says = f"No picture is kept at {missing}: upload it again, or check the address"
    assert field_error(page.text, "image") == says
    assert field_error(page.text, "badge") == says
    result = run(
        app, "create", "--topic", "weekly-digest", "--title", "T", "--body", "B", "--icon", missing
    )
    assert result.exit_code == 1
    assert f"error: icon: no picture is kept at {missing}" in result.stderr


def test_a_kept_pictures_address_is_taken_as_typed(campaigner, catalogue_ready, clock):
    app = catalogue_ready
    with db.begin(app) as session:
        path = media.path_of(
            media.store(session, sample("dots-3x2.gif"), uploaded_by=None, now=clock.now())
        )
    page = campaigner.post("/staff/campaigns/new", {**form_data(image=path), "action": "review"})
    assert page.status_code == 200, page.text
    # The link itself is not a picture: /media/ there is only a page link like any other.
    page = campaigner.post(
        "/staff/campaigns/new", {**form_data(url=f"/media/{'ab' * 32}.png"), "action": "review"}
    )
    assert page.status_code == 200, page.text
