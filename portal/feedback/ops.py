"""The delivery-feedback operations page: recent digests, and a signed test digest.

Admins only. The routes sit on the staff console's blueprint, which signs staff in and
checks roles and CSRF for every page under ``/staff``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import current_app, flash, redirect, render_template, url_for
from werkzeug.wrappers import Response

from portal.db import db
from portal.feedback import services
from portal.seams import current_portal
from portal.staff import audit
from portal.staff.access import StaffPage, current_staff, staff_required
from portal.staff.blueprint import bp
from portal.staff.forms import ConfirmForm
from portal.staff.models import Role

if TYPE_CHECKING:
    from portal.config import Settings

TEST_SENT = "feedback.test_sent"
RECENT = 50

audit.register_action(TEST_SENT, "Feedback test digest sent")
# Its pages on the staff dashboard (create_app lists them, in its order).
PAGES = (
    StaffPage(
        "staff.feedback_ops",
        "Delivery feedback",
        "Digests the push provider sent, what they removed, and a signed test digest.",
    ),
)


@bp.get("/ops/feedback")
@staff_required(Role.ADMIN)
def feedback_ops() -> str:
    settings: Settings = current_portal().settings
    return render_template(
        "staff/ops/feedback.html",
        settings=settings,
        secrets=len(settings.feedback_secrets),  # how many, never what
        digests=services.recent_digests(db.session, RECENT),
        form=ConfirmForm(),
        recent=RECENT,
    )


@bp.post("/ops/feedback/test")
@staff_required(Role.ADMIN)
def feedback_test() -> Response:
    form = ConfirmForm()
    if not form.validate():
        return redirect(url_for("staff.feedback_ops"), 303)
    # Nothing may hold the database while the receiver runs (SQLite: its write lock).
    db.session.commit()
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    status, body = services.send_test_digest(app)
    # A proxy in front of a configured receiver may answer with any JSON: only an object
    # under "error" is the API's error shape.
    answered = body.get("error")
    error: dict[str, Any] = answered if isinstance(answered, dict) else {}
    audit.record(
        db.session,
        current_staff(),
        TEST_SENT,
        "feedback:receiver",
        {"status": status, "code": error.get("code")},
    )
    db.session.commit()
    message, category = _summary(status, body, error)
    flash(message, category)
    return redirect(url_for("staff.feedback_ops"), 303)


def _summary(status: int, body: dict[str, Any], error: dict[str, Any]) -> tuple[str, str]:
    counted = ("applied", "ignored", "revoked")
    if status == 200 and all(isinstance(body.get(k), int) for k in counted):
        counts = ", ".join(f"{body[k]} {k}" for k in counted)
        return f"Test digest accepted: {counts}.", "message"
    if status == 200:
        # Something answered that is not the receiver (a proxy's page, a wrong URL).
        return (
            "The address answered 200 but not as the feedback receiver does: "
            "check FEEDBACK_TEST_URL.",
            "error",
        )
    if status == 0:
        return f"The receiver did not answer: {error.get('message', 'no answer')}.", "error"
    reason = f" ({error.get('code')}: {error.get('message')})" if error else ""
    return f"The receiver answered {status}{reason}.", "error"
