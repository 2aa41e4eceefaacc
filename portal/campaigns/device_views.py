"""The "Test devices" page: a member of staff with the ``campaigns`` role registers the
browser they are using, names it, renames and removes their devices.

Each person sees and changes only their own devices: every query names the signed-in
member of staff, so another person's device number answers 404, whatever the role.
The campaign review page sends tests to them (``portal.campaigns.views``).
"""

from __future__ import annotations

import json
from typing import Any

from flask import flash, redirect, render_template, request, url_for

from portal.campaigns import testdevices
from portal.campaigns.actions import DEVICE_REGISTERED, DEVICE_REMOVED, DEVICE_RENAMED
from portal.db import db
from portal.errors import ApiError, ValidationError
from portal.seams import current_portal
from portal.staff import audit
from portal.staff.access import StaffPage, current_staff, not_found_page, staff_required
from portal.staff.blueprint import bp
from portal.staff.models import Role
from portal.subscriptions.validation import HostAllowList, validate_subscription
from portal.useragent import family

PAGES = (
    StaffPage(
        "staff.test_devices",
        "Test devices",
        "Register your own browsers to receive campaign tests; rename or remove them.",
    ),
)

_MAX_SUBSCRIPTION_JSON = 8192


def _staff() -> Any:
    staff = current_staff()
    assert staff is not None  # staff_required ran first
    return staff


def _page(
    *,
    status: int = 200,
    error: str | None = None,
    name: str = "",
    rename: dict[int, str] | None = None,
) -> Any:
    staff = _staff()
    return (
        render_template(
            "staff/campaigns/test_devices.html",
            devices=testdevices.devices_of(db.session, staff.id),
            errors=[("device-name", error)]
            if error
            else [
                (f"rename-{device_id}", message) for device_id, message in (rename or {}).items()
            ],
            error=error,
            name=name,
            rename_errors=rename or {},
            family=family,
            result_labels=testdevices.RESULT_LABELS,
            max_devices=testdevices.MAX_DEVICES_PER_STAFF,
            max_name=testdevices.MAX_NAME,
        ),
        status,
    )


@bp.get("/campaigns/test-devices")
@staff_required(Role.CAMPAIGNS)
def test_devices() -> Any:
    return _page()


def _subscription(text: str) -> Any:
    """The subscription the page's script put in the form (``PushSubscription.toJSON()``)."""
    if not text:
        raise ValidationError(
            "no_subscription",
            "This browser gave no push subscription: the page needs JavaScript and "
            "permission to show notifications",
            "name",
        )
    if len(text) > _MAX_SUBSCRIPTION_JSON:
        raise ValidationError("invalid_subscription", "The subscription is too long", "name")
    try:
        value = json.loads(text)
    except ValueError:
        raise ValidationError(
            "invalid_subscription", "The browser's subscription could not be read", "name"
        ) from None
    settings = current_portal().settings
    try:
        return validate_subscription(
            value,
            allowed=HostAllowList(settings.push_allowed_hosts),
            max_length=settings.endpoint_max_length,
        )
    except ApiError as problem:
        raise ValidationError(
            "invalid_subscription",
            f"The browser's subscription was refused: {problem.message}",
            "name",
        ) from None


@bp.post("/campaigns/test-devices")
@staff_required(Role.CAMPAIGNS)
def test_device_register() -> Any:
    staff = _staff()
    name = request.form.get("name", "")
    try:
        subscription = _subscription(request.form.get("subscription", "").strip())
        registered = testdevices.register(
            db.session,
            staff.id,
            name,
            subscription,
            user_agent=request.headers.get("User-Agent"),
            keys=current_portal().keys,
            now=current_portal().clock.now(),
        )
    except ApiError as problem:
        db.session.rollback()
        return _page(
            status=problem.status if problem.status != 400 else 422,
            error=problem.message,
            name=name[:200],
        )
    device = registered.device
    audit.record(
        db.session,
        staff,
        DEVICE_REGISTERED,
        f"test-device:{device.id}",
        {"name": device.name, "pushService": device.push_service, "again": not registered.created},
    )
    db.session.commit()
    if registered.created:
        flash(f"This browser is registered as “{device.name}”. Campaign tests can go to it now.")
    else:
        flash(
            f"This browser is registered already, as “{device.name}”: its keys are renewed "
            "and it can receive tests. Rename it below to change its name."
        )
    return redirect(url_for("staff.test_devices"), 303)


def _own(device_id: int) -> testdevices.TestDevice | None:
    return testdevices.own_device(db.session, _staff().id, device_id)


def _not_found() -> Any:
    return not_found_page("That test device", "staff.test_devices", "your test devices")


@bp.post("/campaigns/test-devices/<int:device_id>/rename")
@staff_required(Role.CAMPAIGNS)
def test_device_rename(device_id: int) -> Any:
    device = _own(device_id)
    if device is None:
        return _not_found()
    name = request.form.get("name", "")
    try:
        old = testdevices.rename(db.session, device, name)
    except ApiError as problem:
        db.session.rollback()
        return _page(status=422, rename={device_id: problem.message})
    if old == device.name:
        db.session.rollback()
        flash(f"“{device.name}” kept its name.")
        return redirect(url_for("staff.test_devices"), 303)
    audit.record(
        db.session,
        _staff(),
        DEVICE_RENAMED,
        f"test-device:{device.id}",
        {"from": old, "to": device.name},
    )
    db.session.commit()
    flash(f"“{old}” is now “{device.name}”.")
    return redirect(url_for("staff.test_devices"), 303)


@bp.post("/campaigns/test-devices/<int:device_id>/remove")
@staff_required(Role.CAMPAIGNS)
def test_device_remove(device_id: int) -> Any:
    device = _own(device_id)
    if device is None:
        return _not_found()
    name = device.name
    db.session.delete(device)
    audit.record(db.session, _staff(), DEVICE_REMOVED, f"test-device:{device_id}", {"name": name})
    db.session.commit()
    flash(f"“{name}” is removed: tests no longer go to it.")
    return redirect(url_for("staff.test_devices"), 303)
