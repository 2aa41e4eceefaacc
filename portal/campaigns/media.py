"""Pictures staff upload for a campaign's icon, image or badge: checked, stored, served.

A picture is read before it is kept: PNG, JPEG, GIF or WebP by its own bytes (never by
the name or type the browser sent), whole (the format's end marker is where it belongs:
a cut-off upload is refused), at most :data:`MAX_BYTES` and :data:`MAX_SIDE` pixels a
side. SVG is refused: it is a document that can carry scripts. A kept picture is named
by the SHA-256 of its bytes and served at ``/media/<sha256>.<extension>``, a path on
this site, so the campaign link rule (:func:`portal.campaigns.services.validate_draft`)
takes it as it takes any other; the same file uploaded twice is one picture. Its metadata
(EXIF with the place a photo was taken, XMP, comments) is taken out before it is kept
(:mod:`portal.campaigns.picture_metadata`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import struct
import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.campaigns import picture_metadata
from portal.campaigns.media_models import Picture
from portal.db import is_postgres
from portal.errors import NotFound, ValidationError

# Android downloads the picture with the notification, often on a phone's data: half a
# megabyte is generous for 720 × 360 (a good JPEG of it is ~60 kB), and leaves the form
# room under MAX_BODY_BYTES.
MAX_BYTES = 512 * 1024
MAX_SIDE = 4096
PATH_PREFIX = "/media/"
FORMATS = {  # content type: extension
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
}
_NAME = re.compile(r"([0-9a-f]{64})\.(png|jpg|gif|webp)")
ACCEPTED = "PNG, JPEG, GIF or WebP"


@dataclass(frozen=True)
class Shape:
    content_type: str
    width: int
    height: int


def _refuse(message: str) -> ValidationError:
    return ValidationError("bad_picture", message, "upload")


def _png(data: bytes) -> Shape:
    # The signature, then IHDR first (length 13), then … IEND with its CRC last.
    if len(data) < 8 + 25 + 12 or data[12:16] != b"IHDR" or data[8:12] != b"\0\0\0\x0d":
        raise _refuse("The PNG file has no header: it is damaged")
    if data[-12:] != b"\0\0\0\0IEND\xaeB`\x82":
        raise _refuse("The PNG file is cut off: upload the whole file")
    width, height = struct.unpack(">II", data[16:24])
    return Shape("image/png", width, height)


# Start-of-frame markers (the baseline, progressive and lossless kinds); C4, C8 and CC
# are other segments that share the range.
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg(data: bytes) -> Shape:
    if data[-2:] != b"\xff\xd9":
        raise _refuse("The JPEG file is cut off: upload the whole file")
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            break
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # the end, or the image data before any frame
            break
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if length < 2:
            break
        if marker in _SOF:
            if length < 7 or at + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return Shape("image/jpeg", width, height)
        at += 2 + length
    raise _refuse("The JPEG file has no frame header: it is damaged")


def _gif(data: bytes) -> Shape:
    if len(data) < 14:
        raise _refuse("The GIF file has no header: it is damaged")
    if data[-1:] != b"\x3b":
        raise _refuse("The GIF file is cut off: upload the whole file")
    width, height = struct.unpack("<HH", data[6:10])
    return Shape("image/gif", width, height)


def _webp(data: bytes) -> Shape:
    (riff_size,) = struct.unpack("<I", data[4:8])
    if riff_size + 8 != len(data):
        raise _refuse("The WebP file is cut off or has something after its end")
    chunk, body = data[12:16], data[20:]
    if chunk == b"VP8 " and len(body) >= 10 and body[3:6] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", body[6:10])
        return Shape("image/webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(body) >= 5 and body[0] == 0x2F:
        (bits,) = struct.unpack("<I", body[1:5])
        return Shape("image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(body) >= 10:
        width = int.from_bytes(body[4:7], "little") + 1
        height = int.from_bytes(body[7:10], "little") + 1
        return Shape("image/webp", width, height)
    raise _refuse("The WebP file has no frame header: it is damaged")


def check_size(size: int) -> None:
    """Refuse a file of ``size`` bytes over :data:`MAX_BYTES` (before reading it, where
    the size is known first)."""
    if size > MAX_BYTES:
        raise _refuse(
            f"The picture is {size / 1024:,.0f} kB: the most is {MAX_BYTES // 1024} kB. "
            "Save it smaller (a 720 × 360 JPEG is about 60 kB)"
        )


def read_shape(data: bytes) -> Shape:
    """What the bytes are (type and size in pixels), or ValidationError saying why they
    cannot be a campaign's picture. Reads headers only; decoding is the browser's."""
    if not data:
        raise _refuse("The file is empty: choose a picture")
    check_size(len(data))
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        shape = _png(data)
    elif data.startswith(b"\xff\xd8\xff"):
        shape = _jpeg(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        shape = _gif(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        shape = _webp(data)
    elif b"<svg" in data[:1024].lower():
        raise _refuse(f"SVG is not accepted (it can carry scripts): upload {ACCEPTED}")
    else:
        raise _refuse(f"The file is not a picture this site takes: upload {ACCEPTED}")
    if not (1 <= shape.width <= MAX_SIDE and 1 <= shape.height <= MAX_SIDE):
        raise _refuse(
            f"The picture is {shape.width} × {shape.height} pixels: each side must be "
            f"from 1 to {MAX_SIDE}"
        )
    return shape


def path_of(picture: Picture) -> str:
    return f"{PATH_PREFIX}{picture.sha256}.{FORMATS[picture.content_type]}"


def store(
    session: Session,
    data: bytes,
    *,
    uploaded_by: uuid.UUID | None,
    now: dt.datetime,
    per_day: int = 0,
) -> Picture:
    """Check ``data`` and keep it without its metadata (once: an identical upload returns
    the kept picture). ``per_day``: at most this many new pictures by ``uploaded_by`` in
    any 24 hours (0: no limit; the command line has none)."""
    shape = read_shape(data)
    # Where a photo was taken, the camera, the owner: every recipient would download it.
    data = picture_metadata.strip(data, shape.content_type)
    shape = read_shape(data)
    digest = hashlib.sha256(data).hexdigest()
    kept = session.get(Picture, digest)
    if kept is not None:
        return kept
    if per_day and uploaded_by is not None:
        _check_quota(session, uploaded_by, now, per_day)
    values = {
        "sha256": digest,
        "content_type": shape.content_type,
        "width": shape.width,
        "height": shape.height,
        "size": len(data),
        "data": data,
        "uploaded_by": uploaded_by,
        "uploaded_at": now,
    }
    # Two members of staff uploading the same file at once: one row, no error.
    insert = (postgresql.insert if is_postgres(session) else sqlite.insert)(Picture)
    session.execute(insert.values(**values).on_conflict_do_nothing())
    picture = session.get(Picture, digest)
    assert picture is not None
    return picture


def _check_quota(session: Session, staff_id: uuid.UUID, now: dt.datetime, per_day: int) -> None:
    since = now - dt.timedelta(days=1)
    recent = session.scalars(
        sa.select(Picture.uploaded_at)
        .where(Picture.uploaded_by == staff_id, Picture.uploaded_at > since)
        .order_by(Picture.uploaded_at)
    ).all()
    if len(recent) >= per_day:
        again = recent[len(recent) - per_day] + dt.timedelta(days=1)
        raise _refuse(
            f"You have uploaded {len(recent)} pictures in the last 24 hours, the most one "
            f"person may: use a picture already kept, or upload again after "
            f"{again.astimezone(dt.UTC):%H:%M} UTC"
        )


def unkept_address(session: Session, value: str) -> str | None:
    """``value`` without its query, when it is a ``/media/`` address that names no kept
    picture (a campaign's icon, image or badge would then be broken in every
    notification); None for any other value."""
    address = value.strip().split("?", 1)[0].split("#", 1)[0]
    if not address.startswith(PATH_PREFIX):
        return None
    try:
        find(session, address.removeprefix(PATH_PREFIX))
    except NotFound:
        return address
    return None


def audit_detail(picture: Picture, **extra: str) -> dict[str, object]:
    """What the audit trail keeps of an upload, from the form or the command line."""
    return {
        **extra,
        "path": path_of(picture),
        "type": picture.content_type,
        "width": picture.width,
        "height": picture.height,
        "bytes": picture.size,
    }


def find(session: Session, name: str) -> Picture:
    """The picture ``/media/<name>`` serves, or NotFound (a name of another shape, or
    whose extension is not the picture's own, names nothing)."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise NotFound("not_found", "There is no such picture")
    picture = session.get(Picture, match[1])
    if picture is None or FORMATS[picture.content_type] != match[2]:
        raise NotFound("not_found", "There is no such picture")
    return picture
