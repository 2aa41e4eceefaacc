"""What every JSON endpoint shares: strict body parsing and the error shape."""

from __future__ import annotations

import json
import logging
import re
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, current_app, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from portal.db import DATABASE_UNAVAILABLE, db
from portal.errors import ApiError

log = logging.getLogger("portal")
RETRY_AFTER_SECONDS = 30

_LOCALE = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,3}$")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_body() -> dict[str, Any]:
    """The request's JSON object, or an :class:`ApiError` saying precisely what is wrong."""
    if request.mimetype != "application/json":
        raise ApiError("unsupported_media_type", "send the body as application/json", status=415)
    request.max_content_length = current_app.extensions["portal.settings"].api_max_body_bytes
    raw = request.get_data(cache=True)  # 413 past the limit, raised by Werkzeug
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise ApiError("invalid_json", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError("invalid_json", "the body must be a JSON object")
    return data


def check_same_origin() -> None:
    """The API is same-origin only: a browser's cross-site POST is refused outright."""
    if request.headers.get("Sec-Fetch-Site") == "cross-site":
        raise ApiError("cross_origin", "cross-site requests are not accepted", status=403)
    origin = request.headers.get("Origin")
    if origin and origin != "null" and _origin_host(origin) != request.host:
        raise ApiError("cross_origin", "cross-origin requests are not accepted", status=403)


def _origin_host(origin: str) -> str | None:
    """The host[:port] an Origin header names; None when it is not a URL at all."""
    try:
        return urlsplit(origin).netloc
    except ValueError:  # e.g. "http://[::1": an unclosed IPv6 bracket
        return None


def request_origin() -> str:
    return request.host_url.rstrip("/")


def request_locale() -> str | None:
    best = request.accept_languages.best
    if best and _LOCALE.fullmatch(best):
        return best
    return None


def error_response(error: ApiError) -> tuple[Response, int]:
    return jsonify(error.to_json()), error.status


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(error: ApiError) -> tuple[Response, int]:
        return error_response(error)

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Any:
        if not request.path.startswith("/api/"):
            return error
        code = (error.name or "error").lower().replace(" ", "_")
        return error_response(
            ApiError(code, error.description or error.name, status=error.code or 500)
        )

    for kind in DATABASE_UNAVAILABLE:
        app.register_error_handler(kind, _database_unavailable)


def _database_unavailable(error: Exception) -> tuple[Any, int, dict[str, str]]:
    """503 with Retry-After while the database cannot be reached: the request changed
    nothing (its transaction is gone with its connection), and the caller may retry."""
    db.discard_session()
    cause = getattr(error, "orig", None) or error
    # The class only: the message can carry the statement and its parameters.
    log.warning("database unavailable (%s): %s answered 503", type(cause).__name__, request.path)
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if request.path.startswith("/api/"):
        body = ApiError(
            "unavailable",
            "the service is briefly unavailable; try again shortly",
            status=503,
        ).to_json()
        return jsonify(body), 503, headers
    return render_template("unavailable.html", retry_after=RETRY_AFTER_SECONDS), 503, headers
