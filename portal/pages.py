"""Public pages and the service worker."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, render_template, send_from_directory

from portal.consent import catalogue
from portal.db import db

bp = Blueprint("pages", __name__)


@bp.get("/")
def index() -> str:
    settings = current_app.extensions["portal.settings"]
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
    )


@bp.get("/sw.js")
def service_worker() -> Response:
    # Served from the root so its scope can be "/"; never cached long, so an update
    # reaches browsers on their next visit.
    response = send_from_directory(current_app.static_folder or "static", "sw.js", max_age=0)
    response.headers["Content-Type"] = "text/javascript; charset=utf-8"
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Service-Worker-Allowed"] = "/"
    return response
