"""The staff console's blueprint and the hooks every staff page runs under.

Pages of several packages hang on this one blueprint (``staff.*`` endpoints under
``/staff``): the staff console's own, the catalogue, compliance, campaigns, feedback and
operations. ``create_app`` lists those modules and registers the blueprint once they are
imported. A leaf of the staff console: it imports no page module.
"""

from __future__ import annotations

from flask import Blueprint, current_app, g, redirect, render_template, request, url_for
from flask_wtf.csrf import CSRFError
from werkzeug.wrappers import Response

from portal.db import db
from portal.seams import current_portal
from portal.staff import services
from portal.staff.access import STAFF_COOKIE
from portal.staff.services import StaffPolicy

bp = Blueprint("staff", __name__, url_prefix="/staff")

_UNPROTECTED = {"staff.login"}
# While a member of staff still has a password someone else chose, only these open; every
# other staff page or form redirects to the password page and does nothing.
_OPEN_BEFORE_REPLACING = {"staff.login", "staff.logout", "staff.password"}


def policy() -> StaffPolicy:
    return StaffPolicy.from_settings(current_portal().settings.staff)


@bp.before_request
def _load_signed_in() -> Response | None:
    g.staff = None
    token = request.cookies.get(STAFF_COOKIE)
    if token:
        g.staff = services.authenticate(
            db.session, token, policy=policy(), now=current_portal().clock.now()
        )
        db.session.commit()
        g.drop_staff_cookie = g.staff is None
    # A safety net under the decorator: a staff view that forgot @staff_required is
    # refused outright rather than served to anyone.
    endpoint = request.endpoint or ""
    view = current_app.view_functions.get(endpoint)
    if view is not None and endpoint not in _UNPROTECTED and not hasattr(view, "staff_roles"):
        return Response("This staff page has no access rule.", 500)
    if (
        view is not None
        and g.staff is not None
        and g.staff.must_replace_password
        and endpoint not in _OPEN_BEFORE_REPLACING
    ):
        return redirect(url_for("staff.password"), 303)  # type: ignore[return-value]
    return None


@bp.after_request
def _headers(response: Response) -> Response:
    # Staff pages show personal data and carry CSRF tokens: never cache them.
    response.headers["Cache-Control"] = "no-store"
    if g.get("drop_staff_cookie"):
        clear_cookie(response)
    return response


@bp.errorhandler(CSRFError)
def _csrf_error(error: CSRFError) -> tuple[str, int]:
    return render_template("staff/csrf_error.html", reason=error.description), 400


def set_cookie(response: Response, token: str) -> None:
    response.set_cookie(
        STAFF_COOKIE,
        token,
        max_age=int(policy().session_max.total_seconds()),
        path="/staff",
        secure=request.is_secure or current_portal().settings.is_production,
        httponly=True,
        samesite="Lax",
    )


def clear_cookie(response: Response) -> None:
    response.delete_cookie(
        STAFF_COOKIE,
        path="/staff",
        secure=request.is_secure or current_portal().settings.is_production,
        httponly=True,
        samesite="Lax",
    )
