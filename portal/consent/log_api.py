"""The consent log's public evidence: signed tree heads, proofs and the log key.

Read-only and public, in the JSON shapes of RFC 6962 §4.3–4.5 (``merkle``'s ``to_json``),
so that Certificate Transparency tooling and the project's own verifiers read them.
Proofs carry hashes only: what they reveal of an event is its leaf hash, which whoever
asks already holds.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response, jsonify, request

from portal.consent import merkle, tree
from portal.db import db
from portal.errors import ApiError, NotFound
from portal.seams import current_portal

bp = Blueprint("consent_log_api", __name__, url_prefix="/api/consent-log")

# A size in decimal: leading zeros are still that number, and are not counted against the
# twenty digits 2^64 - 1 needs (nor parsed: int() refuses over 4,300 digits).
_DIGITS = re.compile(r"0*([0-9]{1,20})")
_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
# A proof or an archived head for a given size never changes.
_IMMUTABLE = "public, max-age=86400, immutable"


@bp.after_request
def _readable_from_any_origin(response: Response) -> Response:
    """Public evidence, read without cookies: an auditor's page on another origin may read
    every answer, the errors included (CORS, `*`: no credentials are ever honoured)."""
    response.headers["Access-Control-Allow-Origin"] = "*"
    response.headers["Access-Control-Allow-Methods"] = "GET, HEAD, OPTIONS"
    return response


def _query(name: str) -> str | None:
    """The one value of a query parameter. Given twice it is refused, not read as its
    first: an answer is cached for a day as the proof of what the URL asks, and a URL
    asking two things has no one answer."""
    values = request.args.getlist(name)
    if len(values) > 1:
        raise ApiError("invalid_parameter", f"{name} must be given once", name)
    return values[0] if values else None


def _size(value: str | None, name: str) -> int:
    if value is None or value == "":
        raise ApiError("invalid_parameter", f"{name} is required", name)
    digits = _DIGITS.fullmatch(value)
    if digits is None or int(digits[1]) > merkle.MAX_UINT64:
        raise ApiError(
            "invalid_parameter", f"{name} must be a whole number from 0 to 2^64 - 1", name
        )
    return int(digits[1])


def _leaf(value: str | None) -> bytes:
    """A leaf hash: standard base64, base64url, or 64 hex digits. A '+' of standard base64
    sent as it is (not as %2B) arrives as a space, which base64 never holds: read back."""
    if not value:
        raise ApiError("invalid_parameter", "leaf is required", "leaf")
    value = value.replace(" ", "+")
    raw = b""
    if _HEX.fullmatch(value):
        raw = bytes.fromhex(value)
    elif re.fullmatch(r"^[A-Za-z0-9+/_-]{43}=?$", value):
        try:
            raw = base64.b64decode(value.rstrip("=").translate(str.maketrans("-_", "+/")) + "=")
        except (ValueError, binascii.Error):
            raw = b""
    if len(raw) != merkle.HASH_SIZE:
        raise ApiError(
            "invalid_parameter",
            "leaf must be a SHA-256 leaf hash: 32 bytes in base64 or 64 hex digits",
            "leaf",
        )
    return raw


def _latest_size() -> int:
    head = tree.latest_head(db.session)
    if head is None:
        raise NotFound("no_tree_head", "the log has no signed tree head yet")
    return head.tree_size


def _answer(body: Mapping[str, Any], cache: str = "no-cache") -> Response:
    response = jsonify(body)
    response.headers["Cache-Control"] = cache
    return response


@bp.get("/tree-head")
def latest() -> Response:
    head = tree.latest_head(db.session)
    if head is None:
        raise NotFound("no_tree_head", "the log has no signed tree head yet")
    return _answer(head.to_json())


@bp.get("/tree-head/<string:size>")
def archived(size: str) -> Response:
    wanted = _size(size, "size")
    # Above the latest head (up to 2^64 - 1, past what a BIGINT holds) there is none.
    head = tree.head_at(db.session, wanted) if wanted <= _latest_size() else None
    if head is None:
        raise NotFound("unknown_tree_size", f"no signed tree head of size {wanted}", "size")
    return _answer(head.to_json(), _IMMUTABLE)


@bp.get("/consistency")
def consistency() -> Response:
    first = _size(_query("from"), "from")
    second = _size(_query("to"), "to")
    if first < 1:
        raise ApiError(
            "invalid_parameter", "from must be at least 1 (no proof from the empty tree)", "from"
        )
    if first > second:
        raise ApiError("invalid_parameter", "from must not be larger than to", "from")
    if second > _latest_size():
        raise NotFound("unknown_tree_size", f"the log has no signed tree of size {second}", "to")
    return _answer(tree.consistency(db.session, first, second).to_json(), _IMMUTABLE)


@bp.get("/inclusion")
def inclusion() -> Response:
    leaf = _leaf(_query("leaf"))
    size = _size(_query("size"), "size")
    if size < 1:
        raise ApiError("invalid_parameter", "size must be at least 1", "size")
    if size > _latest_size():
        raise NotFound("unknown_tree_size", f"the log has no signed tree of size {size}", "size")
    index = tree.leaf_index(db.session, leaf)
    if index is None or index >= size:
        raise NotFound("unknown_leaf", f"no such leaf in the tree of size {size}", "leaf")
    return _answer(tree.inclusion(db.session, index, size).to_json(), _IMMUTABLE)


@bp.get("/key")
def key() -> Response:
    text = current_portal().settings.consent_log_signing_key
    if not text:
        raise NotFound("no_log_key", "this deployment has no consent log key")
    return _answer(merkle.log_key_to_json(tree.signing_key(text).public_key()))
