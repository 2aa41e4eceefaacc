"""What a picture says besides the picture, taken out before it is kept.

A photo from a phone carries where it was taken (EXIF GPS), the camera's serial number,
the owner's name and editing history (EXIF, XMP, IPTC), and every recipient's browser
downloads the file. :func:`strip` removes that metadata, format by format, from bytes
:func:`portal.campaigns.media.read_shape` has already accepted, and leaves the picture:

- JPEG: APP1 (EXIF, XMP), APP3–APP13 and APP15 (IPTC, Photoshop, vendors' notes) and COM
  go; APP0 (JFIF), APP2 (the ICC colour profile) and APP14 (Adobe's colour transform) stay,
  as does everything from the start of scan on. The EXIF orientation, which browsers
  apply, is kept in a minimal EXIF segment of its own (one tag), so a phone photo is not
  turned on its side.
- PNG: the text chunks (tEXt, zTXt, iTXt), eXIf and tIME go; every other chunk stays.
- WebP: the EXIF and "XMP " chunks go, with their flags in VP8X and the RIFF size.
- GIF: comment extensions and application extensions other than the animation loop
  (NETSCAPE2.0, ANIMEXTS1.0) go, XMP among them.

A picture with nothing to remove comes back byte for byte, so its address does not change.
"""

from __future__ import annotations

import struct

_JPEG_DROPPED = frozenset({0xE1, *range(0xE3, 0xEE), 0xEF, 0xFE})
_PNG_DROPPED = frozenset({b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"tIME"})
_WEBP_DROPPED = {b"EXIF": 0x08, b"XMP ": 0x04}  # chunk: its flag in VP8X
_GIF_LOOPS = (b"NETSCAPE2.0", b"ANIMEXTS1.0")
_ORIENTATION = 0x0112


def strip(data: bytes, content_type: str) -> bytes:
    """``data`` without its metadata (see the module's docstring)."""
    if content_type == "image/jpeg":
        return _jpeg(data)
    if content_type == "image/png":
        return _png(data)
    if content_type == "image/webp":
        return _webp(data)
    if content_type == "image/gif":
        return _gif(data)
    return data


def _exif_orientation(segment: bytes) -> int | None:
    """The Orientation tag (1-8) of an APP1 EXIF segment's first IFD, if it has one."""
    if not segment.startswith(b"Exif\0\0") or len(segment) < 14:
        return None
    tiff = segment[6:]
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None:
        return None
    try:
        (first,) = struct.unpack(order + "I", tiff[4:8])
        (count,) = struct.unpack(order + "H", tiff[first : first + 2])
        for n in range(count):
            at = first + 2 + 12 * n
            tag, kind, _, value = struct.unpack(order + "HHI4s", tiff[at : at + 12])
            if tag == _ORIENTATION and kind == 3:  # SHORT
                (orientation,) = struct.unpack(order + "H", value[:2])
                return orientation if 1 <= orientation <= 8 else None
    except struct.error:
        return None
    return None


def _orientation_segment(orientation: int) -> bytes:
    """An APP1 EXIF segment holding only the Orientation tag."""
    ifd = struct.pack("<HHHIHH", 1, _ORIENTATION, 3, 1, orientation, 0) + struct.pack("<I", 0)
    body = b"Exif\0\0" + b"II*\0" + struct.pack("<I", 8) + ifd
    return b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body


def _jpeg(data: bytes) -> bytes:
    kept = [data[:2]]
    orientation: int | None = None
    at, removed = 2, False
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            kept.append(data[at : at + 1])
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # no length
            kept.append(data[at : at + 2])
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # end, or start of scan: the rest is the picture
            break
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        segment = data[at : at + 2 + length]
        if marker in _JPEG_DROPPED:
            removed = True
            if marker == 0xE1 and orientation is None:
                orientation = _exif_orientation(segment[4:])
        else:
            kept.append(segment)
        at += 2 + length
    if not removed:
        return data
    if orientation is not None and orientation != 1:
        # After JFIF's APP0 where there is one (it must come first), else after SOI.
        place = 2 if len(kept) > 1 and kept[1][:2] == b"\xff\xe0" else 1
        kept.insert(place, _orientation_segment(orientation))
    return b"".join(kept) + data[at:]


def _png(data: bytes) -> bytes:
    kept, at, removed = [data[:8]], 8, False
    while at + 12 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        chunk = data[at : at + 12 + length]
        if kind in _PNG_DROPPED:
            removed = True
        else:
            kept.append(chunk)
        at += 12 + length
    return b"".join(kept) + data[at:] if removed else data


def _webp(data: bytes) -> bytes:
    chunks, at, flags_off = [], 12, 0
    while at + 8 <= len(data):
        kind = data[at : at + 4]
        (size,) = struct.unpack("<I", data[at + 4 : at + 8])
        whole = data[at : at + 8 + size + (size & 1)]  # chunks are padded to even sizes
        if kind in _WEBP_DROPPED:
            flags_off |= _WEBP_DROPPED[kind]
        else:
            chunks.append(whole)
        at += 8 + size + (size & 1)
    if not flags_off:
        return data
    if chunks and chunks[0][:4] == b"VP8X":
        first = chunks[0]
        chunks[0] = first[:8] + bytes([first[8] & ~flags_off & 0xFF]) + first[9:]
    body = b"WEBP" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _sub_blocks_end(data: bytes, at: int) -> int:
    """Where a run of GIF data sub-blocks starting at ``at`` ends (after its terminator)."""
    while at < len(data):
        size = data[at]
        at += 1 + size
        if size == 0:
            return at
    return len(data)


def _gif(data: bytes) -> bytes:
    flags = data[10]
    at = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    kept, removed = [data[:at]], False
    while at < len(data):
        introducer = data[at]
        if introducer == 0x3B:  # trailer
            kept.append(data[at:])
            break
        if introducer == 0x21 and at + 1 < len(data):  # an extension
            label = data[at + 1]
            end = _sub_blocks_end(data, at + 2)
            block = data[at:end]
            application = label == 0xFF and data[at + 3 : at + 14] not in _GIF_LOOPS
            if label == 0xFE or application:
                removed = True
            else:
                kept.append(block)
            at = end
        elif introducer == 0x2C and at + 10 <= len(data):  # an image
            local = data[at + 9]
            start = at + 10 + (3 * 2 ** ((local & 7) + 1) if local & 0x80 else 0)
            end = _sub_blocks_end(data, start + 1)  # after the LZW minimum code size
            kept.append(data[at:end])
            at = end
        else:  # not a block this reader knows: keep the rest as it is
            kept.append(data[at:])
            break
    return b"".join(kept) if removed else data
