"""Public pages and the service worker."""

from __future__ import annotations

import json
from pathlib import Path

from flask import Blueprint, Response, current_app, render_template, request

from portal.consent import catalogue
from portal.db import db
from portal.identity import device_from_cookie
from portal.seams import current_portal
from portal.subscriptions.services import status_of_device

bp = Blueprint("pages", __name__)


@bp.get("/")
def index() -> str:
    settings = current_portal().settings
    session = db.session
    topics = catalogue.active_topics(session)
    return render_template(
        "index.html",
        vapid_public_key=settings.vapid_public_key,
        # Only marketing topics are chosen here; account messages come with the
        # permission grant and are explained, not offered.
        optional_topics=[t for t in topics if not t.is_transactional],
        account_topics=[t for t in topics if t.is_transactional],
        policy=catalogue.current_policy(session),
        # What the server knows of this browser, for the page without JavaScript and for
        # a browser that no longer holds its subscription; the script asks with the
        # subscription itself when there is one.
        device_status=status_of_device(
            session, device_from_cookie(request), now=current_portal().clock.now()
        ).value,
    )


_LINK_ORIGINS_LINE = "\nvar LINK_ORIGINS = [];\n"


def service_worker_source(link_origins: tuple[str, ...]) -> str:
    """``static/sw.js`` with the sites campaign links may lead to written in, so the
    worker's own check agrees with the form's (``CAMPAIGN_LINK_ORIGINS``)."""
    source = (Path(current_app.static_folder or "static") / "sw.js").read_text("utf-8")
    if _LINK_ORIGINS_LINE not in source:
        raise RuntimeError("static/sw.js has lost its LINK_ORIGINS line")
    line = f"\nvar LINK_ORIGINS = {json.dumps(list(link_origins))};\n"
    return source.replace(_LINK_ORIGINS_LINE, line, 1)


@bp.get("/sw.js")
def service_worker() -> Response:
    # Served from the root so its scope can be "/"; never cached long, so an update
    # (of the script, or of the sites it may open) reaches browsers on their next visit.
    settings = current_portal().settings
    response = Response(service_worker_source(settings.campaign_link_origins))
    response.add_etag()
    response.make_conditional(request)
    response.headers["Content-Type"] = "text/javascript; charset=utf-8"
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Service-Worker-Allowed"] = "/"
    return response
