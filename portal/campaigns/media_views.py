"""``/media/<sha256>.<extension>``: the pictures staff uploaded, for anyone (a
notification's icon and image are fetched by the person's browser, signed in or not).

An address names one file's bytes for ever, so browsers may keep it a year without
asking again. The response is never read as anything but the picture it is: its type
is the one checked at upload (SVG, a document that can run scripts, is never taken), the
site's headers say nosniff, and its policy runs nothing."""

from __future__ import annotations

from flask import Blueprint, Response, abort, request

from portal.campaigns import media
from portal.db import db
from portal.errors import NotFound

bp = Blueprint("media", __name__)

# Opened in a tab, the browser shows a picture in a page of its own making, styled inline:
# the site's policy would block that styling. This one allows only it, and runs nothing.
PICTURE_POLICY = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; sandbox"


@bp.get("/media/<sha256>.<extension>")
def picture(sha256: str, extension: str) -> Response:
    try:
        found = media.find(db.session, f"{sha256}.{extension}")
    except NotFound:
        abort(404)
    response = Response(found.data, mimetype=found.content_type)
    response.set_etag(found.sha256)
    response.make_conditional(request)
    response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
    response.headers["Content-Security-Policy"] = PICTURE_POLICY
    return response
