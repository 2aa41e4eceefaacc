"""Security headers on every response: pages, the JSON API, static files, errors.

Every script and style is a same-origin file (no inline ``<script>``, ``<style>`` or
``style=`` attributes), so the policy allows nothing inline. The service worker's own
fetches (receipts, re-subscription, the VAPID key) go to this origin, which
``connect-src 'self'`` covers; the policy served with ``/sw.js`` governs the worker.

Answers that show a person's choices — the preference centre and its states, the account
link and erasure pages and the erasure receipt (``/preferences…``), the JSON API's answers
(``/api/…``) and the staff console (``/staff…``, its blueprint says so too) — are never
stored by a cache or kept for the back button (``Cache-Control: no-store``), unless the view
chose its own caching (the service worker's public key).
"""

from __future__ import annotations

from flask import Flask, Response, request
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.middleware.proxy_fix import ProxyFix

from portal.seams import current_portal

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "font-src 'self'",
        "connect-src 'self'",
        "worker-src 'self'",
        "manifest-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)

# Powerful features the portal never uses. Notifications and push are permissions, not
# Permissions-Policy features, so denying these leaves the subscribe flow untouched.
PERMISSIONS_POLICY = ", ".join(
    f"{feature}=()"
    for feature in (
        "accelerometer",
        "camera",
        "display-capture",
        "fullscreen",
        "geolocation",
        "gyroscope",
        "magnetometer",
        "microphone",
        "midi",
        "payment",
        "usb",
    )
)

HSTS = "max-age=31536000"

HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # Preference links carry their token in the query string: the address must never
    # leave the site. "same-origin" rather than "no-referrer" because CSRF checks on
    # HTTPS compare the Referer of same-origin form posts.
    "Referrer-Policy": "same-origin",
    "Permissions-Policy": PERMISSIONS_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "Cross-Origin-Opener-Policy": "same-origin",
}


def security_headers(*, production: bool) -> dict[str, str]:
    headers = dict(HEADERS)
    if production:
        # Only where the site is served over HTTPS: a development server on plain
        # HTTP must not teach a browser to refuse it.
        headers["Strict-Transport-Security"] = HSTS
    return headers


PRIVATE_PREFIXES = ("/preferences", "/api/", "/staff")


def is_private(path: str) -> bool:
    """Whether an answer at ``path`` may show a person's choices or data."""
    return path.startswith(PRIVATE_PREFIXES)


def body_within(limit: int) -> bytes:
    """The request's body; 413 past ``limit`` bytes, however it is sent.

    With a Content-Length, Werkzeug refuses a longer body before reading it. Without one
    (chunked: the server ends the stream, ``wsgi.input_terminated``), it reads ``limit``
    bytes and stops there without a word, and the request would be acted on with its
    tail cut off: so a body that fills the limit is looked past by one byte, read from
    the server's own stream."""
    request.max_content_length = limit
    raw = request.get_data(cache=True)
    if len(raw) > limit:  # read whole before (_whole_body), under a larger limit
        raise RequestEntityTooLarge()
    if (
        request.content_length is None
        and len(raw) >= limit
        and request.environ.get("wsgi.input_terminated")
        and request.environ["wsgi.input"].read(1)
    ):
        raise RequestEntityTooLarge()
    return raw


def init_app(app: Flask) -> None:
    settings = current_portal(app).settings
    headers = security_headers(production=settings.is_production)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    if settings.trusted_proxies:
        # Behind N proxies, the client address and scheme are the ones the nearest N
        # proxies recorded; without a proxy X-Forwarded-* is anyone's to forge.
        count = settings.trusted_proxies
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=count, x_proto=count)  # type: ignore[method-assign]

    def _whole_body() -> None:
        # A body sent without a Content-Length (chunked) is read whole here, 413 past the
        # limit, before anything (the CSRF check among them) parses a form from it:
        # Werkzeug would cut it at the limit without a word. The JSON API's smaller limit
        # is applied again by its routes.
        if request.content_length is None and request.environ.get("wsgi.input_terminated"):
            body_within(app.config["MAX_CONTENT_LENGTH"])

    app.before_request_funcs.setdefault(None, []).insert(0, _whole_body)

    @app.after_request
    def _add_security_headers(response: Response) -> Response:
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        if is_private(request.path):
            response.headers.setdefault("Cache-Control", "no-store")
        return response
