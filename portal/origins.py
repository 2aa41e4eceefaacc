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

from flask import has_request_context, request

from portal.config import canonical_origin
from portal.seams import current_portal

__all__ = [
    "DEVELOPMENT_ORIGIN",
    "LinkOrigins",
    "campaign_link_origins",
    "canonical_origin",  # parsed with the settings; the rest of the portal asks here
    "public_origin",
]

DEVELOPMENT_ORIGIN = "http://127.0.0.1:5000"


def public_origin() -> str:
    """The origin people reach the portal at."""
    configured: str | None = current_portal().settings.public_url
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
    others: tuple[str, ...] = current_portal().settings.campaign_link_origins
    return LinkOrigins(public_origin(), others)
