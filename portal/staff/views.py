"""Staff pages: thin views that validate a form, call a service, commit, answer."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import TYPE_CHECKING, Any

from flask import (
    Blueprint,
    Flask,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_wtf.csrf import CSRFError
from werkzeug.wrappers import Response

from portal.db import db
from portal.inputs import query_form
from portal.staff import audit, services
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
from portal.staff.forms import (
    AuditFilterForm,
    ConfirmForm,
    CreateStaffForm,
    PasswordForm,
    RolesForm,
    SignInForm,
    error_list,
)
from portal.staff.models import Role
from portal.staff.passwords import Passwords
from portal.staff.services import Outcome, SignedIn, StaffError, StaffPolicy

if TYPE_CHECKING:
    from portal import Portal
    from portal.config import Settings

bp = Blueprint("staff", __name__, url_prefix="/staff")

PASSWORDS_EXTENSION = "portal.staff.passwords"
_UNPROTECTED = {"staff.login"}
_DIGITS = re.compile(r"[0-9]{1,18}")


def register(app: Flask) -> None:
    """Attach the staff console to the application."""
    app.extensions.setdefault(PASSWORDS_EXTENSION, Passwords())
    # Pages of other modules hang on this blueprint (its sign-in check, headers and
    # CSRF page apply to them); importing them adds their routes before registration.
    from portal.compliance import views as _compliance_views  # noqa: F401
    from portal.staff import catalogue_views as _catalogue_views  # noqa: F401

    app.register_blueprint(bp)


def _portal() -> Portal:
    return current_app.extensions["portal"]


def _settings() -> Settings:
    return current_app.extensions["portal.settings"]


def _policy() -> StaffPolicy:
    return StaffPolicy.from_settings(_settings().staff)


def passwords() -> Passwords:
    return current_app.extensions[PASSWORDS_EXTENSION]


def _signed_in() -> SignedIn:
    staff = current_staff()
    assert staff is not None  # staff_required ran first
    return staff


@bp.before_request
def _load_signed_in() -> Response | None:
    g.staff = None
    token = request.cookies.get(STAFF_COOKIE)
    if token:
        g.staff = services.authenticate(db.session, token, policy=_policy(), clock=_portal().clock)
        db.session.commit()
        g.drop_staff_cookie = g.staff is None
    # A safety net under the decorator: a staff view that forgot @staff_required is
    # refused outright rather than served to anyone.
    endpoint = request.endpoint or ""
    view = current_app.view_functions.get(endpoint)
    if view is not None and endpoint not in _UNPROTECTED and not hasattr(view, "staff_roles"):
        return Response("This staff page has no access rule.", 500)
    return None


@bp.after_request
def _headers(response: Response) -> Response:
    # Staff pages show personal data and carry CSRF tokens: never cache them.
    response.headers["Cache-Control"] = "no-store"
    if g.get("drop_staff_cookie"):
        _clear_cookie(response)
    return response


@bp.errorhandler(CSRFError)
def _csrf_error(error: CSRFError) -> tuple[str, int]:
    return render_template("staff/csrf_error.html", reason=error.description), 400


def _set_cookie(response: Response, token: str) -> None:
    response.set_cookie(
        STAFF_COOKIE,
        token,
        max_age=int(_policy().session_max.total_seconds()),
        path="/staff",
        secure=request.is_secure or _settings().is_production,
        httponly=True,
        samesite="Lax",
    )


def _clear_cookie(response: Response) -> None:
    response.delete_cookie(
        STAFF_COOKIE,
        path="/staff",
        secure=request.is_secure or _settings().is_production,
        httponly=True,
        samesite="Lax",
    )


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
            portal = _portal()
            result = services.sign_in(
                db.session,
                email=form.email.data,
                password=form.password.data,
                client_address=request.remote_addr,
                old_token=request.cookies.get(STAFF_COOKIE),
                passwords=passwords(),
                policy=_policy(),
                clock=portal.clock,
                pepper=current_app.config["SECRET_KEY"].encode(),
            )
            db.session.commit()
            if result.outcome is Outcome.SIGNED_IN and result.token:
                # A fresh CSRF token too: nothing issued before sign-in carries over.
                session.pop("csrf_token", None)
                g.pop("csrf_token", None)
                g.drop_staff_cookie = False
                response = redirect(next_path or url_for("staff.dashboard"), 303)
                _set_cookie(response, result.token)
                return response
            message, status = _refusal(result)
            form.email.errors = [message]
    response = current_app.make_response(
        (
            render_template(
                "staff/login.html", form=form, errors=error_list(form), next_path=next_path
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
    services.sign_out(db.session, _signed_in(), clock=_portal().clock)
    db.session.commit()
    flash("You have signed out.")
    response = redirect(url_for("staff.login"), 303)
    _clear_cookie(response)
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
                services.change_password(
                    db.session,
                    actor=_signed_in(),
                    current=form.current_password.data,
                    new=form.new_password.data,
                    passwords=passwords(),
                    policy=_policy(),
                    clock=_portal().clock,
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
                return redirect(url_for("staff.dashboard"), 303)
    response = current_app.make_response(
        (render_template("staff/password.html", form=form, errors=error_list(form)), status)
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
                    clock=_portal().clock,
                )
            except StaffError as error:
                db.session.rollback()
                _field(form, error).errors = [error.message]
            else:
                db.session.commit()
                flash(f"Staff user {user.email} added.")
                return redirect(url_for("staff.staff_list"), 303)
    return render_template(
        "staff/admin/staff_list.html",
        form=form,
        errors=error_list(form),
        staff=services.list_staff(db.session),
        now=_portal().clock.now(),
    ), status


def _detail(user_id: uuid.UUID, roles_form: RolesForm | None = None, status: int = 200) -> Any:
    user = services.get_staff(db.session, user_id)
    form = roles_form or RolesForm(data={"roles": sorted(user.roles)})
    return render_template(
        "staff/admin/staff_detail.html",
        user=user,
        form=form,
        errors=error_list(form),
        confirm=ConfirmForm(),
        is_self=user.id == _signed_in().id,
        now=_portal().clock.now(),
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
            clock=_portal().clock,
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
        changed = change(db.session, staff_id, actor=_signed_in(), clock=_portal().clock)
    except services.NotFound:
        return not_found_page("staff user", "staff.staff_list", "the staff list")
    except StaffError as error:
        db.session.rollback()
        flash(error.message, "error")
        return redirect(url_for("staff.staff_detail", staff_id=staff_id), 303)
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
    value = request.args.get(name, "")
    # ASCII digits only: "²".isdigit() is true, and int("²") fails.
    return int(value) if _DIGITS.fullmatch(value) else None


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
        errors=error_list(form),
        page=page,
        filters=filters,
        labels=audit.action_labels(),
    ), status


@bp.context_processor
def _staff_context() -> dict[str, Any]:
    def staff_pages() -> list[StaffPage]:
        staff = current_staff()
        return pages_for(staff) if staff else []

    return {
        "staff_pages": staff_pages,
        "role_hints": {role.value: text for role, text in ROLE_DESCRIPTIONS.items()},
        "lockout": _settings().staff,
    }


@bp.app_template_filter("utc")
def _utc(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""
