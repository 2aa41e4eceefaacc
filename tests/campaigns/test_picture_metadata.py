"""Uploaded pictures lose their metadata (portal/campaigns/picture_metadata.py): where a
photo was taken, XMP, comments, text chunks; the picture itself, its colour profile and a
JPEG's orientation stay. Each format's samples are built here from the project's own
sample pictures with metadata added the way cameras and editors add it."""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from portal.campaigns import media
from portal.campaigns.media_models import Picture
from portal.campaigns.picture_metadata import strip
from portal.db import db

PICTURES = Path(__file__).parent / "pictures"
SECRET = b"51 deg 30' 26\" N, 0 deg 7' 39\" W; Jane's iPhone, serial 0042"


def sample(name: str) -> bytes:
    return (PICTURES / name).read_bytes()


# -- building pictures with metadata ------------------------------------------------------


def exif(orientation: int | None, *, big_endian: bool = False) -> bytes:
    """An APP1 EXIF segment: IFD0 with Make, an Orientation (when given) and a GPS IFD
    pointer, then the GPS IFD whose latitude ref points at SECRET."""
    o = ">" if big_endian else "<"
    entries = [(0x010F, 2, len(SECRET), None)]  # Make: ASCII, at the data area
    if orientation is not None:
        entries.append((0x0112, 3, 1, orientation))
    entries.append((0x8825, 4, 1, None))  # GPS IFD pointer
    ifd0_at = 8
    ifd0_size = 2 + 12 * len(entries) + 4
    data_at = ifd0_at + ifd0_size
    gps_at = data_at + len(SECRET)
    tiff = bytearray((b"MM\0*" if big_endian else b"II*\0") + struct.pack(o + "I", ifd0_at))
    tiff += struct.pack(o + "H", len(entries))
    for tag, kind, count, value in entries:
        if tag == 0x010F:
            tiff += struct.pack(o + "HHII", tag, kind, count, data_at)
        elif tag == 0x8825:
            tiff += struct.pack(o + "HHII", tag, kind, count, gps_at)
        else:
            tiff += struct.pack(o + "HHIH", tag, kind, count, value) + b"\0\0"
    tiff += struct.pack(o + "I", 0) + SECRET
    tiff += struct.pack(o + "H", 1) + struct.pack(o + "HHII", 1, 2, 2, 0x004E) + b"\0\0\0\0"
    body = b"Exif\0\0" + bytes(tiff)
    return b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body


def xmp_segment() -> bytes:
    body = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta>" + SECRET + b"</x:xmpmeta>"
    return b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body


def jpeg_with_metadata(orientation: int | None = 6) -> bytes:
    plain = sample("sale-72x36.jpg")
    comment = b"\xff\xfe" + struct.pack(">H", len(SECRET) + 2) + SECRET
    iptc_body = b"Photoshop 3.0\0" + SECRET
    iptc = b"\xff\xed" + struct.pack(">H", len(iptc_body) + 2) + iptc_body
    # After SOI and JFIF's APP0 (18 bytes), as editors write them.
    return plain[:20] + exif(orientation) + xmp_segment() + iptc + comment + plain[20:]


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_with_metadata() -> bytes:
    plain = sample("icon-64x64.png")
    ihdr_end = 8 + 25
    extra = (
        png_chunk(b"tEXt", b"Author\0" + SECRET)
        + png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + SECRET)
        + png_chunk(b"eXIf", exif(None)[10:])
        + png_chunk(b"tIME", b"\x07\xea\x0c\x03\x0c\x00\x00")
    )
    return plain[:ihdr_end] + extra + plain[ihdr_end:]


def webp_with_metadata() -> bytes:
    plain = sample("badge-48x48.webp")  # VP8X, with an ICC profile
    chunks = plain[12:]
    exif_body = exif(None)[10:] + b"\0"  # odd length: padded
    xmp_body = b"<x:xmpmeta>" + SECRET + b"</x:xmpmeta>"
    extra = (
        b"EXIF" + struct.pack("<I", len(exif_body)) + exif_body + b"\0" * (len(exif_body) & 1)
    ) + (b"XMP " + struct.pack("<I", len(xmp_body)) + xmp_body + b"\0" * (len(xmp_body) & 1))
    vp8x = bytearray(chunks[:18])
    vp8x[8] |= 0x08 | 0x04  # the EXIF and XMP flags
    body = b"WEBP" + bytes(vp8x) + chunks[18:] + extra
    return b"RIFF" + struct.pack("<I", len(body)) + body


def gif_with_metadata() -> bytes:
    plain = sample("dots-3x2.gif")
    flags = plain[10]
    header_end = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    loop = b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"
    comment = b"\x21\xfe" + bytes([len(SECRET)]) + SECRET + b"\0"
    xmp = b"\x21\xff\x0bXMP DataXMP" + bytes([len(SECRET)]) + SECRET + b"\0"
    return plain[:header_end] + loop + comment + xmp + plain[header_end:]


# -- the rule -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PICTURES.iterdir()), ids=lambda p: p.name)
def test_a_picture_without_metadata_is_kept_byte_for_byte(path: Path):
    data = path.read_bytes()
    assert strip(data, media.read_shape(data).content_type) == data


@pytest.mark.parametrize(
    ("build", "content_type"),
    [
        (jpeg_with_metadata, "image/jpeg"),
        (png_with_metadata, "image/png"),
        (webp_with_metadata, "image/webp"),
        (gif_with_metadata, "image/gif"),
    ],
    ids=["jpeg", "png", "webp", "gif"],
)
def test_metadata_goes_and_the_picture_stays(build, content_type):
    data = build()
    shape = media.read_shape(data)
    assert SECRET in data
    stripped = strip(data, content_type)
    assert SECRET not in stripped
    assert b"xmpmeta" not in stripped and b"Photoshop" not in stripped
    assert media.read_shape(stripped) == shape  # still a whole picture of the same size
    assert strip(stripped, content_type) == stripped  # nothing left to take


def test_a_jpeg_keeps_its_colour_profile_and_orientation_only():
    stripped = strip(jpeg_with_metadata(6), "image/jpeg")
    assert b"ICC_PROFILE" in stripped and stripped[6:10] == b"JFIF"
    # Orientation 6 (turn 90° clockwise) in a one-tag EXIF segment after JFIF's APP0.
    app1 = stripped[20:]
    assert app1[:2] == b"\xff\xe1" and app1[4:10] == b"Exif\0\0"
    assert app1[4:].count(b"\x12\x01\x03\x00\x01\x00\x00\x00\x06\x00") == 1
    # Without an orientation, or the upright one, no EXIF segment at all.
    for orientation in (None, 1):
        assert b"Exif" not in strip(jpeg_with_metadata(orientation), "image/jpeg")


def test_a_big_endian_exif_orientation_is_read_too():
    plain = sample("sale-72x36.jpg")
    data = plain[:20] + exif(8, big_endian=True) + plain[20:]
    stripped = strip(data, "image/jpeg")
    assert SECRET not in stripped
    assert b"\x12\x01\x03\x00\x01\x00\x00\x00\x08\x00" in stripped


def test_png_chunks_left_are_the_pictures_with_their_checksums():
    stripped = strip(png_with_metadata(), "image/png")
    assert stripped == sample("icon-64x64.png")


def test_a_webp_loses_its_flags_with_its_chunks():
    stripped = strip(webp_with_metadata(), "image/webp")
    assert stripped == sample("badge-48x48.webp")


def test_a_gif_keeps_its_loop_and_loses_comment_and_xmp():
    stripped = strip(gif_with_metadata(), "image/gif")
    assert b"NETSCAPE2.0" in stripped and b"XMP DataXMP" not in stripped
    plain = sample("dots-3x2.gif")
    assert stripped.replace(b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00", b"") == plain


@given(st.binary(min_size=0, max_size=64))
def test_a_comment_of_any_bytes_goes(text):
    plain = sample("sale-72x36.jpg")
    comment = b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text
    assert strip(plain[:20] + comment + plain[20:], "image/jpeg") == plain


# -- kept without it ----------------------------------------------------------------------


def test_an_upload_is_kept_and_named_without_its_metadata(app, clock):
    data = jpeg_with_metadata()
    with db.begin(app) as session:
        picture = media.store(session, data, uploaded_by=None, now=clock.now())
        kept, path = bytes(picture.data), media.path_of(picture)
    assert SECRET not in kept
    assert path == f"/media/{hashlib.sha256(kept).hexdigest()}.jpg"
    served = app.test_client().get(path)
    assert served.status_code == 200 and SECRET not in served.data
    with db.begin(app) as session:
        media.store(session, data, uploaded_by=None, now=clock.now())
        assert session.scalar(sa.select(sa.func.count()).select_from(Picture)) == 1
