"""Staff pages: thin views that validate a form, call a service, commit, answer."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

from flask import (
    abort,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.wrappers import Response

from portal.db import db
from portal.inputs import error_list, query_form
from portal.seams import current_portal
from portal.staff import audit, audit_view, services
from portal.staff.access import (
    ROLE_DESCRIPTIONS,
    STAFF_COOKIE,
    StaffPage,
    current_staff,
    not_found_page,
    pages_for,
    safe_next,
    staff_required,
)
from portal.staff.blueprint import bp, clear_cookie, policy, set_cookie
from portal.staff.forms import (
    FIELD_ANCHORS,
    AuditFilterForm,
    ConfirmForm,
    CreateStaffForm,
    PasswordForm,
    RolesForm,
    SignInForm,
)
from portal.staff.models import Role
from portal.staff.passwords import Passwords
from portal.staff.services import Outcome, SignedIn, StaffError

_DIGITS = re.compile(r"[0-9]{1,18}")


def passwords() -> Passwords:
    return current_portal().passwords


def _signed_in() -> SignedIn:
    staff = current_staff()
    assert staff is not None  # staff_required ran first
    return staff


def _refusal(result: services.SignInResult) -> tuple[str, int]:
    if result.outcome in {Outcome.LOCKED, Outcome.THROTTLED}:
        return services.wait_message(result.minutes), 429
    return "Email or password is wrong", 401


# -- signing in and out -------------------------------------------------------------------


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    next_path = safe_next(request.args.get("next"))
    if request.method == "GET" and current_staff() is not None:
        return redirect(next_path or url_for("staff.dashboard"))
    form = SignInForm()
    status = 200
    if request.method == "POST":
        status = 422
        if form.validate():
            portal = current_portal()
            result = services.sign_in(
                db.session,
                email=form.email.data,
                password=form.password.data,
                client_address=request.remote_addr,
                old_token=request.cookies.get(STAFF_COOKIE),
                passwords=passwords(),
                policy=policy(),
                now=portal.clock.now(),
                pepper=current_app.config["SECRET_KEY"].encode(),
            )
            db.session.commit()
            if result.outcome is Outcome.SIGNED_IN and result.token:
                # A fresh CSRF token too: nothing issued before sign-in carries over.
                session.pop("csrf_token", None)
                g.pop("csrf_token", None)
                g.drop_staff_cookie = False
                first = result.user is not None and result.user.must_replace_password
                landing = url_for("staff.password") if first else next_path
                response = redirect(landing or url_for("staff.dashboard"), 303)
                set_cookie(response, result.token)
                return response
            message, status = _refusal(result)
            form.email.errors = [message]
    response = current_app.make_response(
        (
            render_template(
                "staff/login.html",
                form=form,
                errors=error_list(form, anchors=FIELD_ANCHORS),
                next_path=next_path,
            ),
            status,
        )
    )
    if status == 429:
        response.headers["Retry-After"] = "60"
    return response


@bp.post("/logout")
@staff_required()
def logout() -> Response:
    services.sign_out(db.session, _signed_in(), now=current_portal().clock.now())
    db.session.commit()
    flash("You have signed out.")
    response = redirect(url_for("staff.login"), 303)
    clear_cookie(response)
    return response


# -- every member of staff ----------------------------------------------------------------


@bp.get("/")
@staff_required()
def dashboard() -> str:
    staff = _signed_in()
    return render_template(
        "staff/dashboard.html",
        pages=pages_for(staff),
        roles=[(role, ROLE_DESCRIPTIONS[role]) for role in Role if role in staff.roles],
    )


@bp.route("/password", methods=["GET", "POST"])
@staff_required()
def password() -> Any:
    form = PasswordForm()
    status = 200
    if request.method == "POST":
        status = 422
        if form.validate():
            try:
                token = services.change_password(
                    db.session,
                    actor=_signed_in(),
                    current=form.current_password.data,
                    new=form.new_password.data,
                    passwords=passwords(),
                    policy=policy(),
                    now=current_portal().clock.now(),
                )
            except services.RecordedRefusal as error:
                db.session.commit()  # the failed attempt counts, and is audited
                _field(form, error).errors = [error.message]
                if error.minutes:
                    status = 429
            except StaffError as error:
                db.session.rollback()
                _field(form, error).errors = [error.message]
            else:
                db.session.commit()
                flash("Your password has been changed. Your other browsers are signed out.")
                changed = redirect(url_for("staff.dashboard"), 303)
                set_cookie(changed, token)  # a new session: the old cookie opens nothing
                return changed
    response = current_app.make_response(
        (
            render_template(
                "staff/password.html", form=form, errors=error_list(form, anchors=FIELD_ANCHORS)
            ),
            status,
        )
    )
    if status == 429:
        response.headers["Retry-After"] = "60"
    return response


def _field(form: Any, error: StaffError) -> Any:
    return getattr(form, error.field or "", None) or next(iter(form))


# -- staff administration -----------------------------------------------------------------


@bp.route("/admin/staff", methods=["GET", "POST"])
@staff_required(Role.ADMIN)
def staff_list() -> Any:
    form = CreateStaffForm()
    status = 200
    if request.method == "POST":
        status = 422
        if form.validate():
            try:
                user = services.create_staff(
                    db.session,
                    email=form.email.data,
                    password=form.password.data,
                    roles=services.parse_roles(form.roles.data),
                    actor=_signed_in(),
                    passwords=passwords(),
                    now=current_portal().clock.now(),
                    must_replace_password=True,
                )
            except StaffError as error:
                db.session.rollback()
                _field(form, error).errors = [error.message]
            else:
                db.session.commit()
                flash(
                    f"Staff user {user.email} added. They will be asked to choose a new "
                    "password when they first sign in."
                )
                return redirect(url_for("staff.staff_list"), 303)
    return render_template(
        "staff/admin/staff_list.html",
        form=form,
        errors=error_list(form, anchors=FIELD_ANCHORS),
        staff=services.list_staff(db.session),
        now=current_portal().clock.now(),
    ), status


def _detail(
    user_id: uuid.UUID,
    roles_form: RolesForm | None = None,
    status: int = 200,
    *,
    access_error: str | None = None,
) -> Any:
    user = services.get_staff(db.session, user_id)
    # Not from the request: a refused disable posts no roles, and the boxes must show the
    # roles the person has.
    form = roles_form or RolesForm(formdata=None, data={"roles": sorted(user.roles)})
    extra = [("access-heading", access_error)] if access_error else []
    return render_template(
        "staff/admin/staff_detail.html",
        user=user,
        form=form,
        errors=error_list(form, extra, anchors=FIELD_ANCHORS),
        access_error=access_error,
        confirm=ConfirmForm(),
        is_self=user.id == _signed_in().id,
        now=current_portal().clock.now(),
    ), status


@bp.get("/admin/staff/<uuid:staff_id>")
@staff_required(Role.ADMIN)
def staff_detail(staff_id: uuid.UUID) -> Any:
    try:
        return _detail(staff_id)
    except services.NotFound:
        return not_found_page("staff user", "staff.staff_list", "the staff list")


@bp.post("/admin/staff/<uuid:staff_id>/roles")
@staff_required(Role.ADMIN)
def staff_roles(staff_id: uuid.UUID) -> Any:
    form = RolesForm()
    try:
        if not form.validate():
            return _detail(staff_id, form, 422)
        changed = services.set_roles(
            db.session,
            staff_id,
            services.parse_roles(form.roles.data),
            actor=_signed_in(),
            now=current_portal().clock.now(),
        )
    except services.NotFound:
        return not_found_page("staff user", "staff.staff_list", "the staff list")
    except StaffError as error:
        db.session.rollback()
        form.roles.errors = [error.message]
        return _detail(staff_id, form, 422)
    db.session.commit()
    flash("Roles saved." if changed else "The roles were already as chosen.")
    return redirect(url_for("staff.staff_detail", staff_id=staff_id), 303)


def _toggle(staff_id: uuid.UUID, *, enable: bool) -> Any:
    change = services.enable_staff if enable else services.disable_staff
    try:
        user = services.get_staff(db.session, staff_id)
        changed = change(db.session, staff_id, actor=_signed_in(), now=current_portal().clock.now())
    except services.NotFound:
        return not_found_page("staff user", "staff.staff_list", "the staff list")
    except StaffError as error:
        # Refused (your own account): the page again with why, as a refused role change.
        db.session.rollback()
        return _detail(staff_id, status=409, access_error=error.message)
    db.session.commit()
    state = "enabled" if enable else "disabled"
    flash(f"{user.email} is {state}." if changed else f"{user.email} was already {state}.")
    return redirect(url_for("staff.staff_detail", staff_id=staff_id), 303)


@bp.post("/admin/staff/<uuid:staff_id>/disable")
@staff_required(Role.ADMIN)
def staff_disable(staff_id: uuid.UUID) -> Any:
    return _toggle(staff_id, enable=False)


@bp.post("/admin/staff/<uuid:staff_id>/enable")
@staff_required(Role.ADMIN)
def staff_enable(staff_id: uuid.UUID) -> Any:
    return _toggle(staff_id, enable=True)


# -- the audit trail ----------------------------------------------------------------------


def _keyset(name: str) -> int | None:
    """The audit row a page starts after or before (the page links'), or none; anything
    else is a bad address, not the first page. ASCII digits only: "²".isdigit() is
    true, and int("²") fails."""
    value = request.args.get(name)
    if value is None:
        return None
    if not _DIGITS.fullmatch(value):
        abort(400)
    return int(value)


@bp.get("/admin/audit")
@staff_required(Role.ADMIN, Role.COMPLIANCE)
@query_form
def audit_trail() -> Any:
    form = AuditFilterForm(request.args)
    status = 200
    page = audit.AuditPage([], None, None)
    filters: dict[str, str] = {}
    if form.validate():
        start, end = form.dates()
        where = audit.AuditFilter(
            action=form.action.data or None,
            actor_email=form.actor.data or None,
            start=start,
            end=end,
        )
        page = audit.search(db.session, where, before=_keyset("before"), after=_keyset("after"))
        filters = {
            name: value
            for name, value in (
                ("action", form.action.data),
                ("actor", form.actor.data),
                ("date_from", form.date_from.data),
                ("date_to", form.date_to.data),
            )
            if value
        }
    else:
        status = 422
    return render_template(
        "staff/admin/audit.html",
        form=form,
        errors=error_list(form, anchors=FIELD_ANCHORS),
        page=page,
        entries=audit_view.describe(db.session, page.rows, _signed_in()),
        filters=filters,
        labels=audit.action_labels(),
    ), status


@bp.context_processor
def _staff_context() -> dict[str, Any]:
    def staff_pages() -> list[StaffPage]:
        staff = current_staff()
        # Nothing else opens until a password someone else chose is replaced.
        return pages_for(staff) if staff and not staff.must_replace_password else []

    return {
        "staff_pages": staff_pages,
        "role_hints": {role.value: text for role, text in ROLE_DESCRIPTIONS.items()},
        "lockout": current_portal().settings.staff,
    }


@bp.app_template_filter("utc")
def _utc(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""
