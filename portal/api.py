"""What every JSON endpoint shares: strict body parsing and the error shape."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from flask import Flask, Response, current_app, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from portal.accesslog import loggable_path
from portal.db import DATABASE_UNAVAILABLE, db
from portal.errors import ApiError
from portal.origins import canonical_origin, public_origin
from portal.seams import current_portal
from portal.security import body_within

log = logging.getLogger("portal")
RETRY_AFTER_SECONDS = 30

_LOCALE = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,3}$")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_body() -> dict[str, Any]:
    """The request's JSON object, or an :class:`ApiError` saying precisely what is wrong."""
    if request.mimetype != "application/json":
        raise ApiError("unsupported_media_type", "send the body as application/json", status=415)
    raw = body_within(current_portal().settings.api_max_body_bytes)
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise ApiError("invalid_json", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError("invalid_json", "the body must be a JSON object")
    return data


def check_same_origin() -> None:
    """The API is same-origin only: a browser's cross-site POST is refused outright.

    An ``Origin`` header must name the public origin exactly — scheme, host and port
    (:func:`portal.origins.public_origin`), never whatever the Host header claims — and
    ``Origin: null`` (a sandboxed frame, a ``data:`` or ``file:`` page) is never us on a
    route that changes state. No ``Origin`` at all is a client that is not a browser page
    (or one too old to send it), which a cross-site form cannot be."""
    if request.headers.get("Sec-Fetch-Site") in ("cross-site", "same-site"):
        raise ApiError("cross_origin", "cross-site requests are not accepted", status=403)
    origin = request.headers.get("Origin")
    if origin is None:
        return
    if origin == "null" and request.method in ("GET", "HEAD", "OPTIONS"):
        return
    if canonical_origin(origin) != public_origin():
        raise ApiError("cross_origin", "cross-origin requests are not accepted", status=403)


def request_origin() -> str:
    """The origin recorded with what a request registers: the public one."""
    return public_origin()


def request_locale() -> str | None:
    best = request.accept_languages.best
    if best and _LOCALE.fullmatch(best):
        return best
    return None


# What an error page says, by status: our own words, never the exception's.
ERROR_PAGES = {
    400: ("Bad request", "The request could not be understood. Go back and try again."),
    403: ("Access denied", "You do not have permission to open this page."),
    404: ("Page not found", "There is no page at this address. Check the address or start again."),
    405: ("Method not allowed", "This page cannot be used that way. Go back and try again."),
    409: ("Not possible right now", "This cannot be done at the moment. Try again later."),
    413: ("Request too large", "What you sent is larger than this site accepts."),
    429: ("Too many requests", "You have sent too many requests. Wait a moment and try again."),
    500: ("Something went wrong", "The problem is ours, not yours. Try again in a few minutes."),
}


_KEPT_HEADERS = frozenset({"Allow", "Retry-After", "WWW-Authenticate"})


def error_response(error: ApiError) -> tuple[Response, int]:
    response = jsonify(error.to_json())
    response.headers.update(error.headers)
    return response, error.status


def error_page(status: int) -> Response:
    """A plain HTML error page for people, without any detail of the failure."""
    title, message = ERROR_PAGES.get(status, ERROR_PAGES[500 if status >= 500 else 400])
    try:
        body = render_template("errors/error.html", title=title, message=message)
    except Exception:  # a broken template must not turn one error page into another
        current_app.logger.exception("error page %d could not be rendered", status)
        body = f"{title}. {message}"
        return Response(body, status, mimetype="text/plain")
    return Response(body, status)


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(error: ApiError) -> tuple[Response, int]:
        return error_response(error)

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Any:
        # Unhandled exceptions arrive here as a 500, after Flask has logged them.
        if error.code is None or error.code < 400:
            return error
        if request.path.startswith("/api/"):
            code = (error.name or "error").lower().replace(" ", "_")
            response, status = error_response(
                ApiError(code, error.description or error.name, status=error.code)
            )
        else:
            response, status = error_page(error.code), error.code
        # Keep what the protocol needs: Allow on 405, Retry-After on 429 and 503.
        for name, value in error.get_headers():
            if name in _KEPT_HEADERS:
                response.headers[name] = value
        return response, status

    for kind in DATABASE_UNAVAILABLE:
        app.register_error_handler(kind, _database_unavailable)


def _database_unavailable(error: Exception) -> tuple[Any, int, dict[str, str]]:
    """503 with Retry-After while the database cannot be reached: the request changed
    nothing (its transaction is gone with its connection), and the caller may retry."""
    db.discard_session()
    cause = getattr(error, "orig", None) or error
    # The class only: the message can carry the statement and its parameters.
    log.warning(
        "database unavailable (%s): %s answered 503",
        type(cause).__name__,
        loggable_path(request.path),
    )
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if request.path.startswith("/api/"):
        body = ApiError(
            "unavailable",
            "the service is briefly unavailable; try again shortly",
            status=503,
        ).to_json()
        return jsonify(body), 503, headers
    return render_template("unavailable.html", retry_after=RETRY_AFTER_SECONDS), 503, headers
