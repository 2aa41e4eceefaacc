"""Who may see what: the signed-in member of staff, the role check, safe redirects.

Roles are strict: a route names the roles that may use it and nothing else does —
``admin`` opens the staff and audit pages, not the compliance or campaign ones. An
admin who needs those grants themselves the role, and that grant is in the audit trail.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

from flask import current_app, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from portal.staff.models import Role
from portal.staff.services import SignedIn

STAFF_COOKIE = "portal_staff"

ROLE_DESCRIPTIONS = {
    Role.ADMIN: "Add staff, change their roles, disable accounts, read the audit trail.",
    Role.COMPLIANCE: (
        "Look up and export consent histories, process erasure requests, read the audit trail."
    ),
    Role.CAMPAIGNS: "Create, test, launch and follow campaigns.",
}

F = TypeVar("F", bound=Callable[..., Any])


def current_staff() -> SignedIn | None:
    return g.get("staff")


def staff_required(*roles: Role) -> Callable[[F], F]:
    """Refuse the view to anyone not signed in, and to anyone without one of ``roles``
    (no roles: any signed-in member of staff).

    Anonymous: a page (GET) redirects to sign-in and comes back afterwards; a form post
    redirects to sign-in (303) without replaying it. Signed in without the role: 403.
    """
    required = frozenset(roles)

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            staff = current_staff()
            if staff is None:
                return redirect_to_sign_in()
            if required and not staff.has_any(required):
                return render_template("staff/forbidden.html", required=sorted(required)), 403
            return view(*args, **kwargs)

        guarded.staff_roles = required  # type: ignore[attr-defined]
        return guarded  # type: ignore[return-value]

    return decorate


def redirect_to_sign_in() -> Response:
    if request.method in {"GET", "HEAD"}:
        here = request.path + (f"?{request.query_string.decode()}" if request.query_string else "")
        return redirect(url_for("staff.login") + "?" + urlencode({"next": here}))
    return redirect(url_for("staff.login"), 303)


# Browsers drop tabs and newlines anywhere in a URL and read "\" as "/", so "/\t/evil"
# and "/\evil" both mean //evil: any control character or backslash is refused.
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")


def safe_next(value: str | None) -> str | None:
    """``value`` when it is a path on this site, else None (never an open redirect)."""
    if not value or len(value) > 2048 or _UNSAFE.search(value):
        return None
    if not value.startswith("/") or value.startswith("//"):
        return None
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return None
    return value


@dataclass(frozen=True)
class StaffPage:
    """A staff page listed on the dashboard and in the staff navigation. Who may see it
    is read from the view's own :func:`staff_required`, so the two cannot disagree."""

    endpoint: str
    title: str
    description: str


STAFF_PAGES: list[StaffPage] = [
    StaffPage(
        "staff.staff_list",
        "Staff accounts",
        "Add staff, change their roles, disable or enable accounts.",
    ),
    StaffPage(
        "staff.audit_trail",
        "Audit trail",
        "What staff did and when: sign-ins, account changes and every other staff action.",
    ),
    StaffPage(
        "staff.password",
        "Change your password",
        "Choose a new password; your other signed-in browsers are signed out.",
    ),
]


def register_page(page: StaffPage) -> None:
    """List a page on the dashboard. create_app registers each staff page module's
    ``PAGES`` here, in the order of its list."""
    if all(existing.endpoint != page.endpoint for existing in STAFF_PAGES):
        STAFF_PAGES.append(page)


def view_roles(endpoint: str) -> frozenset[Role] | None:
    """The roles a staff view admits (empty: any staff), or None if it is unguarded."""
    view = current_app.view_functions.get(endpoint)
    return getattr(view, "staff_roles", None)


def may_use(staff: SignedIn, endpoint: str) -> bool:
    roles = view_roles(endpoint)
    return roles is not None and (not roles or staff.has_any(roles))


def pages_for(staff: SignedIn) -> list[StaffPage]:
    return [p for p in STAFF_PAGES if may_use(staff, p.endpoint)]


def not_found_page(what: str, endpoint: str, listing: str) -> tuple[str, int]:
    """The console's 404: what was not found, and a way back to where such things are listed."""
    return (
        render_template(
            "staff/not_found.html", what=what, back_url=url_for(endpoint), back_label=listing
        ),
        404,
    )
