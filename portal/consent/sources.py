"""Which ``source`` each JSON route may record: only the callers that really reach it.

The consent log says where every decision came from; a caller must not be able to file
a decision as made on a screen that never calls the route. The table is the contract
(docs/api.md; the OpenAPI document reads it too).
"""

from __future__ import annotations

from typing import Any

from portal.consent.models import Source
from portal.errors import ValidationError

ROUTE_SOURCES: dict[str, tuple[Source, ...]] = {
    # The subscribe page, the service worker's renewal, other pages' renewal and the
    # host product's own calls.
    "subscribe": (Source.API, Source.SUBSCRIBE_PAGE, Source.SERVICE_WORKER),
    # Only the host product: the preference centre posts its forms, the subscribe page
    # sends its topics with the subscription.
    "preferences": (Source.API,),
    # The subscribe page's "stop notifications in this browser", and the host product.
    "unsubscribe": (Source.API, Source.SUBSCRIBE_PAGE),
}


def source_for(route: str, body: dict[str, Any]) -> str:
    """The body's ``source`` (default ``api``), when the route accepts it; else 422."""
    allowed = [source.value for source in ROUTE_SOURCES[route]]
    source = body.get("source", Source.API.value)
    if source not in allowed:
        raise ValidationError(
            "invalid_value", f"source is one of {', '.join(allowed)} on this route", "source"
        )
    return str(source)
