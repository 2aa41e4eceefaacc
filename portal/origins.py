"""The site's public origin, and origins compared the way browsers compare them.

``PUBLIC_URL`` names the one origin people reach the portal at (required in production).
The JSON API's same-origin check, the origin recorded with a subscription and the origins
campaign links may open (``CAMPAIGN_LINK_ORIGINS``) are all decided against it, never
against the Host header, which is the client's to choose. In development, without
``PUBLIC_URL``, the request's own origin stands in (``flask run`` on any address works),
and outside a request the development server's default address does.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from flask import current_app, has_request_context, request

DEVELOPMENT_ORIGIN = "http://127.0.0.1:5000"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def canonical_origin(text: str) -> str | None:
    """``scheme://host[:port]`` as a browser serialises it (lower case, punycode, the
    default port dropped), or None when ``text`` is not an http(s) URL with a host —
    ``null`` included. Path, query and fragment are ignored; credentials are refused."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:  # an unclosed IPv6 bracket, a port out of range
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    host = parts.hostname.rstrip(".")
    if not host:
        return None
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def public_origin() -> str:
    """The origin people reach the portal at."""
    configured: str | None = current_app.extensions["portal.settings"].public_url
    if configured:
        return configured
    if has_request_context():
        return canonical_origin(request.host_url) or DEVELOPMENT_ORIGIN
    return DEVELOPMENT_ORIGIN


@dataclass(frozen=True)
class LinkOrigins:
    """Where a link may lead: this site (``site``; None when unknown, paths only) and
    the other sites named in ``CAMPAIGN_LINK_ORIGINS``."""

    site: str | None = None
    others: tuple[str, ...] = ()

    def allows(self, origin: str | None) -> bool:
        return origin is not None and (origin == self.site or origin in self.others)

    def refusal(self) -> str:
        others = sorted(set(self.others) - {self.site})
        return "Links may lead only to this site" + (
            f" or to {', '.join(others)}" if others else ""
        )


def campaign_link_origins() -> LinkOrigins:
    """Where a campaign's link (and icon) may lead: this site, and the sites named in
    ``CAMPAIGN_LINK_ORIGINS``. The form and the command line both ask here."""
    others: tuple[str, ...] = current_app.extensions["portal.settings"].campaign_link_origins
    return LinkOrigins(public_origin(), others)
