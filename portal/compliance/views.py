"""Compliance pages (role compliance), on the staff blueprint: look-up, one person's
history, erasure on request, exports, the dashboard and the export signing key."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import TYPE_CHECKING, Any

from flask import Response, flash, redirect, render_template, request, url_for

from portal.compliance import services
from portal.compliance.charts import weekly_chart
from portal.compliance.export import ExportError, ExportFilter, bundle_name, stream_zip
from portal.compliance.forms import (
    EndpointLookupForm,
    EraseForm,
    ExportForm,
    SearchForm,
    parse_uuid,
)
from portal.compliance.services import REASON_LABELS, LookupKind
from portal.compliance.signing import SigningKey, SigningKeyMissing
from portal.consent import catalogue, merkle, tree
from portal.db import db
from portal.inputs import error_list, query_form
from portal.retention.views import RECEIPT_FLASH, receipt_token
from portal.seams import current_portal
from portal.staff.access import (
    StaffPage,
    current_staff,
    not_found_page,
    staff_required,
)
from portal.staff.blueprint import bp
from portal.staff.forms import ConfirmForm
from portal.staff.models import Role
from portal.subscriptions.models import Subscriber

if TYPE_CHECKING:
    from portal.staff.services import SignedIn


# Its pages on the staff dashboard (create_app lists them, in its order).
PAGES = (
    StaffPage(
        "staff.compliance_dashboard",
        "Compliance dashboard",
        "Opt-ins and opt-outs by week, the consent log's integrity, pending erasures.",
    ),
    StaffPage(
        "staff.compliance_lookup",
        "Consent look-up",
        "One person's consent history, by their reference, account ID or its start, "
        "subscriber ID, erasure receipt ID or endpoint.",
    ),
    StaffPage(
        "staff.compliance_export",
        "Export consent history",
        "A signed bundle of consent events for a period, to verify offline.",
    ),
    StaffPage(
        "staff.signing_key",
        "Export signing key",
        "The public key that checks the signature of every export bundle.",
    ),
    StaffPage(
        "staff.consent_log_key",
        "Consent log key and tree head",
        "The public key that checks the consent log's signed tree heads, and the latest head.",
    ),
)


def _staff() -> SignedIn:
    staff = current_staff()
    assert staff is not None  # staff_required ran first
    return staff


def _exporter(staff: SignedIn) -> dict[str, str]:
    return {"kind": "staff", "id": str(staff.id), "email": staff.email}


# -- look-up --------------------------------------------------------------------------------


@bp.get("/compliance/lookup")
@staff_required(Role.COMPLIANCE)
@query_form
def compliance_lookup() -> Any:
    """The search: ``?q=…&page=N``. No ``q``: the empty form."""
    form = SearchForm(request.args)
    status, result, problems = 200, None, []
    if "q" in request.args or "page" in request.args:
        if not form.validate():
            status = 422
        else:
            try:
                page = services.parse_page(form.page.data)
                result = services.search_subscribers(
                    db.session, form.q.data or "", page, actor=_staff()
                )
            except services.SearchRefused as refused:
                db.session.rollback()
                status, problems = refused.status, [(refused.field, refused.message)]
            else:
                db.session.commit()
    return _lookup_page(form, EndpointLookupForm(formdata=None), status, result, problems)


@bp.post("/compliance/lookup")
@staff_required(Role.COMPLIANCE)
def compliance_lookup_endpoint() -> Any:
    """By push endpoint, posted: found, straight to the person's history."""
    endpoint_form = EndpointLookupForm()
    status = 422
    if endpoint_form.validate():
        found = services.find_subscriber(
            db.session, LookupKind.ENDPOINT, endpoint_form.endpoint.data or "", actor=_staff()
        )
        db.session.commit()
        if found is not None:
            return redirect(url_for("staff.compliance_subscriber", subscriber_id=found), 303)
        status = 404
        endpoint_form.endpoint.errors = ["No subscriber has this push endpoint"]
    return _lookup_page(SearchForm(formdata=None), endpoint_form, status, None, [])


def _lookup_page(
    form: SearchForm,
    endpoint_form: EndpointLookupForm,
    status: int,
    result: services.SearchPage | None,
    problems: list[tuple[str, str]],
) -> Any:
    # The page number has no box of its own: its problems show by the search box.
    messages = [message for _field, message in problems] + list(form.page.errors)
    if messages:
        form.q.errors = [*form.q.errors, *messages]
        form.page.errors = []
    errors = error_list(form) + error_list(endpoint_form)
    return render_template(
        "staff/compliance/lookup.html",
        form=form,
        endpoint_form=endpoint_form,
        errors=errors,
        result=result,
        # An endpoint typed into the search box never comes back in the page.
        keep_query=not services.looks_like_endpoint(form.q.data or ""),
        prefix_minimum=services.PREFIX_MINIMUM,
    ), status


@bp.get("/compliance/subscribers/<uuid:subscriber_id>")
@staff_required(Role.COMPLIANCE)
def compliance_subscriber(subscriber_id: uuid.UUID) -> Any:
    if not services.known_subscriber(db.session, subscriber_id):
        return not_found_page("person", "staff.compliance_lookup", "the compliance look-up")
    record = services.history(db.session, subscriber_id, actor=_staff())
    db.session.commit()
    return render_template(
        "staff/compliance/subscriber.html",
        record=record,
        reasons=REASON_LABELS,
        actors=services.actor_names(db.session, {e.actor for e in record.events}),
        errors=[],
        delivery_months=current_portal().settings.retention.delivery_months,
    )


@bp.route("/compliance/subscribers/<uuid:subscriber_id>/erase", methods=["GET", "POST"])
@staff_required(Role.COMPLIANCE)
def compliance_erase(subscriber_id: uuid.UUID) -> Any:
    subscriber = db.session.get(Subscriber, subscriber_id)
    if subscriber is None:
        return not_found_page("person", "staff.compliance_lookup", "the compliance look-up")
    form = EraseForm()
    status = 200
    if request.method == "POST" and subscriber.erased_at is None:
        status = 422
        if form.validate():
            receipt = services.erase(
                db.session,
                subscriber_id,
                actor=_staff(),
                now=current_portal().clock.now(),
                reference=form.reference.data or None,
            )
            db.session.commit()
            flash(
                f"Erased. {receipt.subscriptions} subscription(s) ended; the consent log "
                f"records it as event {receipt.event_seq}."
            )
            # The subscriber page offers the receipt once, to pass on to the person.
            flash(receipt_token(receipt), RECEIPT_FLASH)
            return redirect(
                url_for("staff.compliance_subscriber", subscriber_id=subscriber_id), 303
            )
    elif request.method == "POST":
        status = 409
    return render_template(
        "staff/compliance/erase.html",
        subscriber=subscriber,
        form=form,
        errors=error_list(form),
    ), status


# -- exports --------------------------------------------------------------------------------


def _signing_key() -> SigningKey | None:
    try:
        return SigningKey.from_setting(current_portal().settings.export_signing_key)
    except SigningKeyMissing:
        return None


@bp.route("/compliance/export", methods=["GET", "POST"])
@staff_required(Role.COMPLIANCE)
def compliance_export() -> Any:
    topics = [(t.slug, t.label) for t in catalogue.all_topics(db.session)]
    form = ExportForm(topics=topics)
    key = _signing_key()
    # The whole history unless the officer narrows it, and the page says what that is.
    period = services.whole_history(
        db.session, current_portal().clock.now().astimezone(dt.UTC).date()
    )
    status = 200
    problems: list[tuple[str, str]] = []
    if request.method == "GET":
        form.date_from.data = period.start.isoformat()
        form.date_to.data = period.end.isoformat()
        form.data_format.data = "csv"
        subscriber = parse_uuid(request.args.get("subscriber"))
        form.subscriber.data = str(subscriber) if subscriber else ""
    else:
        status = 422
        if key is None:
            status = 503
            problems = [("date_from", "Exports are switched off: EXPORT_SIGNING_KEY is not set")]
        elif form.validate():
            start, end = form.dates()
            try:
                filters = ExportFilter(
                    start, end, form.topic.data or None, parse_uuid(form.subscriber.data)
                )
                data_format = form.data_format.data or "csv"
                staff = _staff()
                plan = services.start_export(
                    db.session, filters, data_format=data_format, actor=staff, via="console"
                )
            except ExportError as error:
                db.session.rollback()
                form.date_from.errors = [str(error)[:1].upper() + str(error)[1:]]
            else:
                db.session.commit()  # the audit row is in before any data leaves
                return Response(
                    stream_zip(
                        db.engine,
                        plan,
                        data_format,
                        exporter=_exporter(staff),
                        created_at=current_portal().clock.now(),
                        key=key,
                    ),
                    mimetype="application/zip",
                    headers={
                        "Content-Disposition": (
                            f'attachment; filename="{bundle_name(filters, data_format)}.zip"'
                        ),
                        "X-Content-Type-Options": "nosniff",
                    },
                )
    return render_template(
        "staff/compliance/export.html",
        form=form,
        errors=error_list(form) + problems,
        key=key,
        period=period,
    ), status


@bp.get("/compliance/signing-key")
@staff_required(Role.COMPLIANCE, Role.ADMIN)
def signing_key() -> Any:
    key = _signing_key()
    return render_template(
        "staff/compliance/signing_key.html", public=key.public if key else None, errors=[]
    )


@bp.get("/compliance/consent-log")
@staff_required(Role.COMPLIANCE, Role.ADMIN)
def consent_log_key() -> Any:
    """The log key's public half (as ``GET /api/consent-log/key`` serves it) and the
    latest signed tree head, for staff to hand to an auditor through another channel."""
    text = current_portal().settings.consent_log_signing_key
    public = None
    if text:
        raw = merkle.public_key_bytes(tree.signing_key(text).public_key())
        public = {
            "base64": merkle.log_key_to_json(tree.signing_key(text).public_key())["key"],
            "hex": raw.hex(),
            "fingerprint": hashlib.sha256(raw).hexdigest(),
        }
    head = tree.latest_head(db.session)
    signed_at = (
        dt.datetime.fromtimestamp(head.timestamp / 1000, dt.UTC) if head is not None else None
    )
    return render_template(
        "staff/compliance/consent_log.html",
        public=public,
        head=head.to_json() if head is not None else None,
        signed_at=signed_at,
        errors=[],
    )


# -- the dashboard --------------------------------------------------------------------------


@bp.get("/compliance/")
@staff_required(Role.COMPLIANCE)
def compliance_dashboard() -> Any:
    session = db.session
    now = current_portal().clock.now()
    weeks = services.weekly_decisions(session, now)
    session.commit()  # the past weeks it counted, kept
    return render_template(
        "staff/compliance/dashboard.html",
        topics=weeks,
        charts=[weekly_chart(item, index) for index, item in enumerate(weeks)],
        chain=services.chain_status(session, now),
        pending=services.pending_erasures(session),
        now=now,
        confirm=ConfirmForm(),
        errors=[],
    )


@bp.post("/compliance/verify-log")
@staff_required(Role.COMPLIANCE)
def compliance_verify_log() -> Any:
    """Ask for a full check of the chain now; the scheduler runs it in the background."""
    requested = services.request_verification(
        db.session, actor=_staff(), now=current_portal().clock.now()
    )
    db.session.commit()
    flash(
        "Check requested: the scheduler starts it within half a minute. "
        "Reload this page for the result."
        if requested
        else "A check is already under way: its result will show here."
    )
    return redirect(url_for("staff.compliance_dashboard"), 303)
