"""The preference centre (server-rendered, complete without JavaScript) and its JSON API."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

from flask import (
    Blueprint,
    Response,
    abort,
    flash,
    g,
    get_flashed_messages,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask import session as signed_session
from sqlalchemy.orm.attributes import set_committed_value

from portal import ratelimit
from portal.api import check_same_origin, json_body
from portal.campaigns.local_time import parse_local_time
from portal.clock import day_in
from portal.consent import catalogue, receipts, tree
from portal.consent.accounts import link_account, link_manages
from portal.consent.log import Context
from portal.consent.models import (
    PreferenceState,
    Source,
    TopicPreference,
)
from portal.consent.preferences import (
    Choice,
    Decision,
    apply_decisions,
    choices_to_reconfirm,
    chosen_topics,
    form_decisions,
    last_agreed_version,
    marketing_off_decisions,
    require_not_superseded,
    subscriber_with_preferences,
    topic_views,
)
from portal.consent.sources import source_for
from portal.db import db
from portal.delivery import quiet
from portal.errors import NotFound, ValidationError
from portal.identity import (
    Assertion,
    InvalidLink,
    device_from_cookie,
    set_subscriber_cookie,
    subscriber_from_cookie,
    subscriber_from_link_token,
    verify_assertion,
)
from portal.origins import public_origin
from portal.ratelimit import limit_endpoint
from portal.seams import current_portal
from portal.subscriptions import services as subscription_services
from portal.subscriptions.models import PushSubscription, Subscriber
from portal.subscriptions.possession import proof_from
from portal.subscriptions.reference import display as display_reference
from portal.subscriptions.reference import reference_for
from portal.subscriptions.validation import require_object, require_string
from portal.useragent import family

bp = Blueprint("preferences", __name__)
bp.add_app_template_filter(day_in, "day_in")
# The flash category of a message that says choices were saved: the page offers their
# receipt beside it.
SAVED = "saved"
api = Blueprint("consent_api", __name__, url_prefix="/api/push")


def _secure() -> bool:
    return request.is_secure or current_portal().settings.is_production


def _context(screen: str) -> Context:
    return Context(screen=screen, client=family(request.headers.get("User-Agent")))


# A preference link (``?token=``) names its person for the preference centre of the
# browser that opens it, for this visit only: the person is kept in the signed session,
# never in the subscriber cookie. Whoever sends a link chooses the person it names, so a
# link opened in someone else's browser must not make that browser theirs: a device
# subscribed there afterwards joins the browser's own subscriber, not the link's.
LINK_VISITOR = "preference_link_visitor"
LINK_VISIT_SECONDS = 3600


def _link_visitor() -> uuid.UUID | None:
    visit = signed_session.get(LINK_VISITOR)
    if not isinstance(visit, dict):
        return None
    until = visit.get("until")
    if not isinstance(until, int | float) or until < time.time():
        signed_session.pop(LINK_VISITOR, None)
        return None
    try:
        return uuid.UUID(str(visit.get("id")))
    except ValueError:
        return None


def _visitor_id() -> uuid.UUID | None:
    """Whose preference centre this is: the person of a preference link opened in this
    visit, else the browser's own subscriber."""
    return _link_visitor() or subscriber_from_cookie(request)


def forget_link_visit() -> None:
    signed_session.pop(LINK_VISITOR, None)


def _still_theirs(
    subscriber: Subscriber | None, linked: uuid.UUID | None, *, has_devices: bool | None = None
) -> bool:
    """Whether the visitor found has a preference centre: not erased, and, when a link
    named them, one the link still manages (an identity merged into an account during
    the visit ends the visit)."""
    if subscriber is None or subscriber.erased_at is not None:
        return False
    if linked is not None and not link_manages(db.session, subscriber, has_devices=has_devices):
        forget_link_visit()
        return False
    return True


def _visitor(*, to_decide: bool = False) -> tuple[Subscriber | None, dict[int, TopicPreference]]:
    """The subscriber at the browser and their stored preferences, in one query.

    ``to_decide``: a form that records decisions takes the person's row lock first and
    then reads, so the preferences it answers are the ones its decisions start from
    (``apply_decisions(read_under_lock=...)``) and need no second read; the lock comes
    with the save's count (``RATE_LIMIT_SAVES``), which :func:`_too_many_saves` reads."""
    linked = _link_visitor()
    subscriber_id = linked or subscriber_from_cookie(request)
    if subscriber_id is None:
        return None, {}
    if to_decide:
        g.save_verdict = ratelimit.count_save_and_lock(subscriber_id)
    subscriber, rows, has_devices = subscriber_with_preferences(
        db.session, subscriber_id, devices=linked is not None, fresh=to_decide
    )
    theirs = _still_theirs(subscriber, linked, has_devices=has_devices)
    return (subscriber, rows) if theirs else (None, {})


def _current_subscriber(*, browser_only: bool = False) -> Subscriber | None:
    """The visitor (see ``_visitor_id``); with ``browser_only``, the browser's own
    subscriber whatever link was opened (what account linking moves)."""
    linked = None if browser_only else _link_visitor()
    subscriber_id = linked or subscriber_from_cookie(request)
    if subscriber_id is None:
        return None
    subscriber = db.session.get(Subscriber, subscriber_id)
    return subscriber if _still_theirs(subscriber, linked) else None


def _write_basis() -> catalogue.WriteBasis:
    """The current policy version and the active topics a save may decide, read in the
    save's own transaction, not the shared copy: a decision is recorded against the
    notice in force when it is saved (a newer one than the shared copy refreshes it, so
    the next page shows it), and a topic retired since the page was shown gets none."""
    return catalogue.write_basis(db.session)


def _devices(subscriber: Subscriber) -> list[PushSubscription]:
    """The person's devices the preference centre lists (and linking would move)."""
    return (
        db.session.query(PushSubscription)
        .filter(
            PushSubscription.subscriber_id == subscriber.id,
            PushSubscription.deleted_at.is_(None),
            PushSubscription.state.in_(["pending", "active", "stale"]),
        )
        .all()
    )


def _this_device(subscriber: Subscriber, device_id: uuid.UUID | None) -> tuple[bool, bool]:
    """Whether the server's record of this browser (its device cookie) says it gets this
    person's notifications — the page's wording without JavaScript, until the browser's
    own subscription is asked about — and whether that record is someone else's (a
    preference link opened in another person's browser: its subscription is not this
    person's to show or stop, so the browser is not asked about it here)."""
    if device_id is None:
        return False, False
    sub = db.session.get(PushSubscription, device_id)
    if sub is None:
        return False, False
    if sub.subscriber_id != subscriber.id:
        return False, True
    now = current_portal().clock.now()
    status = subscription_services.status_of(sub, now=now)
    return status is subscription_services.DeviceStatus.RECEIVING, False


def _render(
    subscriber: Subscriber | None,
    *,
    errors: list[tuple[str, str]] | None = None,
    status: int = 200,
    checked: set[str] | None = None,
    ack_error: str | None = None,
    rows: dict[int, TopicPreference] | None = None,
    opened_under: str | None = None,
    frequency_error: str | None = None,
    quiet_errors: dict[str, str] | None = None,
    quiet_typed: dict[str, str] | None = None,
) -> tuple[str, int]:
    session = db.session
    shown = catalogue.current(session)
    policy = shown.policy
    if subscriber is None:
        return render_template(
            "preferences/unknown.html",
            policy=policy,
            messages=get_flashed_messages(with_categories=True),
        ), status
    views = topic_views(session, subscriber, shown.topics, rows)
    devices = _devices(subscriber)
    this_device = device_from_cookie(request)
    this_device_receiving, this_device_elsewhere = _this_device(subscriber, this_device)
    # What changed: since the notice this form was opened under (a stale save), else
    # since the notice of the person's latest choice made under an older one.
    diff = None
    compared = opened_under or (last_agreed_version(views, policy.version) if policy else None)
    if policy is not None and compared and compared != policy.version:
        earlier = catalogue.policy(session, compared)
        if earlier is not None:
            diff = catalogue.policy_diff(earlier, policy)
    return render_template(
        "preferences/centre.html",
        categories=catalogue.by_category([v.topic for v in views]),
        views={v.topic.slug: v for v in views},
        policy=policy,
        errors=errors or [],
        messages=get_flashed_messages(with_categories=True),
        devices=devices,
        this_device=this_device,
        this_device_receiving=this_device_receiving,
        this_device_elsewhere=this_device_elsewhere,
        family=family,
        checked=checked,
        ack_required=checked is not None,
        ack_error=ack_error,
        diff=diff,
        confirm_offered=diff is not None and opened_under is None,
        reference=display_reference(subscriber.reference) if subscriber.reference else None,
        one_a_day=subscriber.one_a_day,
        caps=current_portal().settings.frequency_caps,
        frequency_error=frequency_error,
        portal_quiet=current_portal().settings.quiet_hours.window,
        my_quiet=quiet.window(subscriber.quiet_from, subscriber.quiet_until),
        time_zone=subscriber.time_zone,
        quiet_errors=quiet_errors or {},
        quiet_typed=quiet_typed,
    ), status


@bp.get("/preferences")
def centre() -> Any:
    token = request.args.get("token")
    assertion = request.args.get("assertion")
    if token or assertion:
        return _identify(token, assertion)
    subscriber, rows = _visitor()
    if subscriber is not None and subscriber.reference is None:
        # Given once, the first time the page shows it, and kept from then on.
        given = reference_for(db.session, subscriber.id)
        db.session.commit()
        set_committed_value(subscriber, "reference", given)
    return _render(subscriber, rows=rows)


def _identify(token: str | None, assertion: str | None) -> Any:
    settings = current_portal().settings
    session = db.session
    try:
        if not token:
            claims = verify_assertion(
                assertion or "", secrets=settings.identity_assertion_secrets, now=time.time()
            )
            return _ask_to_link(claims)
        subscriber_id = subscriber_from_link_token(token, max_age=settings.preference_link_max_age)
        subscriber = session.get(Subscriber, subscriber_id)
        if subscriber is None or not link_manages(session, subscriber):
            raise InvalidLink("This link is no longer valid.")
    except InvalidLink as problem:
        session.rollback()
        return render_template("preferences/link_error.html", message=problem.message), 400
    signed_session[LINK_VISITOR] = {
        "id": str(subscriber.id),
        "until": time.time() + LINK_VISIT_SECONDS,
    }
    # A clean address: the token leaves the URL bar and the history.
    return redirect(url_for("preferences.centre"), code=303)


# Linking an account ---------------------------------------------------------------------
#
# Whoever sends a sign-in link chooses the account it names: opened, a link only asks.
# The browser joins the account when the person confirms, on a page that names it, by a
# POST carrying that page's CSRF token (a cross-site form cannot). Until then the checked
# claims, never the assertion itself, wait in the signed session for a few minutes.

PENDING_LINK = "pending_account_link"
PENDING_LINK_SECONDS = 600


def _ask_to_link(claims: Assertion) -> Any:
    browser = _current_subscriber(browser_only=True)
    if browser is not None and browser.external_user_id == claims.external_user_id:
        return redirect(url_for("preferences.centre"), code=303)  # already this account
    signed_session[PENDING_LINK] = {
        "sub": claims.external_user_id,
        "region": claims.region_code,
        "locale": claims.locale,
        "until": time.time() + PENDING_LINK_SECONDS,
    }
    return redirect(url_for("preferences.link_account_page"), code=303)


def _pending_link(*, take: bool = False) -> Assertion | None:
    """The account this browser was asked to join, while the question stands."""
    pending = signed_session.pop(PENDING_LINK, None) if take else signed_session.get(PENDING_LINK)
    if not isinstance(pending, dict):
        return None
    until = pending.get("until")
    if not isinstance(until, int | float) or until < time.time():
        signed_session.pop(PENDING_LINK, None)
        return None
    return Assertion(pending["sub"], pending.get("region"), pending.get("locale"))


@bp.get("/preferences/link")
def link_account_page() -> Any:
    claims = _pending_link()
    if claims is None:
        return redirect(url_for("preferences.centre"), code=303)
    browser = _current_subscriber(browser_only=True)
    return render_template(
        "preferences/link.html",
        account=claims.external_user_id,
        devices=len(_devices(browser)) if browser is not None else 0,
        other_account=browser.external_user_id if browser is not None else None,
    )


@bp.post("/preferences/link")
def link_account_confirmed() -> Any:
    claims = _pending_link(take=True)
    if claims is None or request.form.get("action") != "link":
        flash("Nothing was linked.", "info")
        return redirect(url_for("preferences.centre"), code=303)
    session = db.session
    subscriber = link_account(
        session,
        claims,
        browser_subscriber_id=subscriber_from_cookie(request),
        now=current_portal().clock.now(),
        context=_context("account-link"),
    )
    session.commit()
    forget_link_visit()  # from now on the centre is the account's, through the cookie
    flash("This browser is now linked to your account.", "success")
    response = redirect(url_for("preferences.centre"), code=303)
    set_subscriber_cookie(response, subscriber.id, secure=_secure())
    return response


@bp.post("/preferences")
def save() -> Any:
    subscriber, rows = _visitor(to_decide=True)
    if subscriber is None:
        return _render(None, status=403)
    if (refused := _too_many_saves(subscriber)) is not None:
        return refused
    session = db.session
    version = request.form.get("policy_version", "")
    basis = _write_basis()
    visible = set(request.form.getlist("visible"))
    checked = set(request.form.getlist("topics"))
    if basis.policy_version is None:
        abort(409)
    stale = version != basis.policy_version
    unconfirmed = request.form.get("ack_required") == "1" and request.form.get("policy_ack") != "1"
    if stale or unconfirmed:
        # Keep what they ticked; ask them to read the notice they are agreeing to.
        message = "Confirm you have read the updated notice before saving"
        return _render(
            subscriber,
            errors=[("policy-ack", message)],
            status=409 if stale else 400,
            checked=checked,
            ack_error=message,
            rows=rows,
            opened_under=version if stale else None,
        )
    # The topics as committed now, not the page's copy: a topic retired since the page
    # was shown gets no decision, and the person is told so.
    active = basis.active
    views = [v for v in topic_views(session, subscriber, active, rows) if v.topic.slug in visible]
    gone = catalogue.retired_labels(session, visible - basis.topics.keys())
    now = current_portal().clock.now()
    changes = apply_decisions(
        session,
        subscriber.id,
        form_decisions(views, checked),
        source=Source.PREFERENCE_CENTRE.value,
        policy_version=basis.policy_version,
        decided_at=now,
        recorded_at=now,
        context=_context("preference-centre"),
        read_under_lock=rows,
    )
    session.commit()
    message = (
        "Your choices are saved."
        if changes
        else "Your choices are saved. Nothing needed to change."
    )
    if gone:
        message += (
            f" {_and(gone)} {'is' if len(gone) == 1 else 'are'} no longer offered,"
            " so nothing was saved for "
            f"{'it' if len(gone) == 1 else 'them'}."
        )
    flash(message, SAVED)
    return redirect(url_for("preferences.centre"), code=303)


def _too_many_saves(subscriber: Subscriber) -> Response | None:
    """The page a form save gets past ``RATE_LIMIT_SAVES`` a window: nothing changed,
    and when to save again. Counted with the person's lock by a form that records
    decisions (``_visitor(to_decide=True)``), else here."""
    verdict = (
        g.pop("save_verdict") if "save_verdict" in g else ratelimit.save_verdict(subscriber.id)
    )
    if verdict is None or verdict.allowed:
        return None
    return _try_again_later(
        429,
        "Too many changes at once",
        "You have changed your choices many times in a short time, so nothing was changed "
        "this time. You can save again in "
        f"{_duration(dt.timedelta(seconds=verdict.retry_after))}.",
        retry_after=verdict.retry_after,
    )


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


@bp.post("/preferences/confirm-notice")
def confirm_notice() -> Any:
    """The person keeps their choices under the current notice: each choice made under
    an older one is recorded again, unchanged, under the version the page showed."""
    subscriber, rows = _visitor(to_decide=True)
    if subscriber is None:
        return _render(None, status=403)
    if (refused := _too_many_saves(subscriber)) is not None:
        return refused
    session = db.session
    version = request.form.get("policy_version", "")
    basis = _write_basis()
    current = basis.policy_version
    if current is None:
        abort(409)
    if version != current:
        # Confirming a notice that is no longer the current one (or none at all).
        known = bool(version) and catalogue.policy(session, version) is not None
        return _render(
            subscriber,
            errors=[
                (
                    "notice-changes",
                    "The notice changed again since you opened this page. "
                    "Read what changed and confirm again."
                    if known
                    else "We could not tell which notice you confirmed. Confirm again below.",
                )
            ],
            status=409 if known else 400,
            rows=rows,
        )
    # The topics as committed now (see save): a retired one is not confirmed again.
    views = topic_views(session, subscriber, basis.active, rows)
    now = current_portal().clock.now()
    changes = apply_decisions(
        session,
        subscriber.id,
        choices_to_reconfirm(views, current),
        source=Source.PREFERENCE_CENTRE.value,
        policy_version=current,
        decided_at=now,
        recorded_at=now,
        context=_context("preference-centre:confirm-notice"),
        reconfirm=True,
        read_under_lock=rows,
    )
    session.commit()
    flash(
        f"Your choices are kept under notice version {current}."
        if changes
        else "Your choices were already made under the current notice.",
        SAVED,
    )
    return redirect(url_for("preferences.centre"), code=303)


@bp.post("/preferences/marketing-off")
def marketing_off() -> Any:
    subscriber, rows = _visitor(to_decide=True)
    if subscriber is None:
        return _render(None, status=403)
    if (refused := _too_many_saves(subscriber)) is not None:
        return refused
    session = db.session
    basis = _write_basis()
    now = current_portal().clock.now()
    apply_decisions(
        session,
        subscriber.id,
        marketing_off_decisions(topic_views(session, subscriber, basis.active, rows)),
        source=Source.PREFERENCE_CENTRE.value,
        policy_version=basis.policy_version,
        decided_at=now,
        recorded_at=now,
        context=_context("preference-centre:marketing-off"),
        read_under_lock=rows,
    )
    session.commit()
    flash("All marketing notifications are off. Account messages stay as they were.", SAVED)
    return redirect(url_for("preferences.centre"), code=303)


# The "How often" choice: its form values, and what saving each says.
HOW_OFTEN = {
    "as-sent": (False, "Saved: your marketing notifications come as we send them."),
    "one-a-day": (True, "Saved: at most one marketing notification a day."),
}


@bp.post("/preferences/frequency")
def frequency() -> Any:
    """The person's own frequency cap: "at most one a day" or as we send them
    (portal/delivery/caps.py applies it). Account messages are never capped."""
    subscriber, rows = _visitor()
    if subscriber is None:
        return _render(None, status=403)
    if (refused := _too_many_saves(subscriber)) is not None:
        return refused
    choice = HOW_OFTEN.get(request.form.get("how_often", ""))
    if choice is None:
        message = "Choose how often you want marketing notifications"
        return _render(
            subscriber,
            errors=[("how-often-as-sent", message)],
            status=400,
            rows=rows,
            frequency_error=message,
        )
    one_a_day, message = choice
    changed = subscription_services.choose_one_a_day(
        db.session,
        subscriber.id,
        one_a_day,
        now=current_portal().clock.now(),
        source=Source.PREFERENCE_CENTRE.value,
        context=_context("preference-centre:how-often"),
    )
    db.session.commit()
    flash(message if changed else f"{message} Nothing needed to change.", "success")
    return redirect(url_for("preferences.centre"), code=303)


@bp.post("/preferences/quiet-hours")
def quiet_hours() -> Any:
    """The person's own quiet hours: "Do not send between …", or none
    (portal/delivery/quiet.py applies them). Account messages always come."""
    subscriber, rows = _visitor()
    if subscriber is None:
        return _render(None, status=403)
    if (refused := _too_many_saves(subscriber)) is not None:
        return refused
    action = request.form.get("action", "")
    typed = {name: request.form.get(name, "") for name in ("quiet_from", "quiet_until")}
    window: quiet.Window | None = None
    if action == "save":
        start = parse_local_time(typed["quiet_from"])
        end = parse_local_time(typed["quiet_until"])
        problems: dict[str, str] = {}
        if start is None:
            problems["quiet-from"] = "Enter the time quiet hours start, like 22:00"
        if end is None:
            problems["quiet-until"] = "Enter the time quiet hours end, like 07:00"
        if start is not None and start == end:
            problems["quiet-until"] = "Enter an end time different from the start time"
        window = quiet.window(start, end)
        if problems or window is None:
            return _render(
                subscriber,
                errors=list(problems.items()),
                status=400,
                rows=rows,
                quiet_errors=problems,
                quiet_typed=typed,
            )
    elif action != "remove":
        message = "Choose to save quiet hours or to remove them"
        return _render(
            subscriber,
            errors=[("quiet-from", message)],
            status=400,
            rows=rows,
            quiet_errors={"quiet-from": message},
            quiet_typed=typed,
        )
    changed = subscription_services.choose_quiet_hours(
        db.session,
        subscriber.id,
        window,
        now=current_portal().clock.now(),
        source=Source.PREFERENCE_CENTRE.value,
        context=_context("preference-centre:quiet-hours"),
    )
    db.session.commit()
    said = (
        f"Saved: no marketing notifications between {window.start:%H:%M} and "
        f"{window.end:%H:%M} where you are."
        if window is not None
        else "Saved: you have no quiet hours of your own."
    )
    flash(said if changed else f"{said} Nothing needed to change.", "success")
    return redirect(url_for("preferences.centre"), code=303)


def _stop(sub: PushSubscription, message: str) -> Any:
    """Unsubscribe one of the person's devices, logged, and say so on the next page."""
    session = db.session
    subscription_services.unsubscribe(
        session,
        now=current_portal().clock.now(),
        subscription_id=sub.id,
        source=Source.PREFERENCE_CENTRE.value,
        context=_context("preference-centre:stop-device"),
    )
    session.commit()
    flash(message, "success")
    return redirect(url_for("preferences.centre"), code=303)


@bp.post("/preferences/stop-device")
def stop_device() -> Any:
    subscriber = _current_subscriber()
    if subscriber is None:
        return _render(None, status=403)
    session = db.session
    device = device_from_cookie(request)
    sub = session.get(PushSubscription, device) if device else None
    if sub is None or sub.subscriber_id != subscriber.id:
        return _render(
            subscriber,
            errors=[
                (
                    "devices",
                    "We cannot tell which device this is. Use the Stop button next to it below.",
                )
            ],
            status=400,
        )
    return _stop(sub, "Notifications are stopped on this device.")


@bp.post("/preferences/devices/<uuid:subscription_id>/stop")
def stop_other_device(subscription_id: uuid.UUID) -> Any:
    subscriber = _current_subscriber()
    if subscriber is None:
        return _render(None, status=403)
    session = db.session
    sub = session.get(PushSubscription, subscription_id)
    if sub is None or sub.subscriber_id != subscriber.id:
        abort(404)
    return _stop(sub, "Notifications are stopped on that device.")


@bp.get("/preferences/receipt")
def receipt() -> Any:
    """The signed receipt of the visitor's choices, as a JSON download."""
    visitor_id = _visitor_id()
    if visitor_id is not None and request.method != "HEAD":
        # Counted before this request reads anything: on SQLite the count's own write
        # transaction would wait behind the request's open one.
        verdict = ratelimit.receipt_verdict(visitor_id)
        if verdict is not None and not verdict.allowed:
            return _try_again_later(
                429,
                "Too many receipts at once",
                "You have asked for many receipts in a short time. Nothing about your "
                "choices has changed; you can download a receipt again in "
                f"{_duration(dt.timedelta(seconds=verdict.retry_after))}.",
                retry_after=verdict.retry_after,
            )
    subscriber, _rows = _visitor()
    if subscriber is None:
        return _render(None, status=403)
    portal = current_portal()
    settings = portal.settings
    if not settings.consent_log_signing_key:
        raise NotFound("no_log_key", "this deployment has no consent log key to sign receipts")
    if request.method == "HEAD":  # a look at the link builds and signs nothing
        return Response(mimetype="application/json", headers={"Cache-Control": "no-store"})
    now = portal.clock.now()
    origin = public_origin()
    try:
        document = receipts.build_receipt(
            db.session,
            subscriber,
            catalogue.active_topics(db.session),
            key=tree.signing_key(settings.consent_log_signing_key),
            controller=receipts.Controller.from_settings(settings, origin),
            # From PUBLIC_URL (public_origin), never the request's Host: it is signed.
            policy_url=lambda version: origin + url_for("preferences.policy_text", version=version),
            now=now,
            gap_grace_seconds=settings.consent_log_gap_grace_seconds,
        )
    except receipts.NotYetInTheLog:
        return _try_again_later(
            503,
            "Your receipt is nearly ready",
            "Your latest choice is still being added to our consent log. "
            "Try again in a few seconds.",
            retry_after=2,
        )
    response = Response(receipts.receipt_bytes(document), mimetype="application/json")
    response.headers["Content-Disposition"] = (
        f'attachment; filename="consent-receipt-{now:%Y-%m-%d}.json"'
    )
    response.headers["Cache-Control"] = "no-store"
    return response


def _try_again_later(status: int, title: str, message: str, *, retry_after: int) -> Response:
    """A page saying why not now, and when to ask again (``Retry-After``)."""
    response = Response(
        render_template("errors/error.html", code=status, title=title, message=message),
        status=status,
    )
    response.headers["Retry-After"] = str(retry_after)
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/policy/<version>")
def policy_text(version: str) -> Any:
    found = catalogue.policy(db.session, version)
    if found is None:
        abort(404)
    return render_template("preferences/policy.html", policy=found)


# JSON API ------------------------------------------------------------------------------

api.before_request(check_same_origin)


def _parse_decided_at(value: object, now: dt.datetime, skew: dt.timedelta) -> dt.datetime:
    """The client's time of the decision: ISO 8601 with a zone, within ``skew`` of the
    server clock either way (a clock that far off, or a time made up, is refused)."""
    text = require_string(value, "decidedAt")
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(
            "invalid_datetime", "decidedAt must be an ISO 8601 time", "decidedAt"
        ) from None
    if when.tzinfo is None:
        raise ValidationError("invalid_datetime", "decidedAt must include a time zone", "decidedAt")
    try:
        when = when.astimezone(dt.UTC)
    except OverflowError:  # "0001-01-01T00:00:00+14:00" is before year 1 in UTC
        raise ValidationError(
            "invalid_datetime", "decidedAt is out of range", "decidedAt"
        ) from None
    if abs(when - now) > skew:
        raise ValidationError(
            "invalid_datetime",
            f"decidedAt must be within {_duration(skew)} of the server's clock",
            "decidedAt",
        )
    return when


def _duration(span: dt.timedelta) -> str:
    seconds = int(span.total_seconds())
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} second{'' if seconds == 1 else 's'}"


@api.post("/preferences")
def api_preferences() -> Response:
    body = json_body()
    session = db.session
    portal = current_portal()
    now = portal.clock.now()
    endpoint = require_string(body.get("endpoint"), "endpoint")
    limit_endpoint(endpoint)
    proof = proof_from(device_from_cookie(request), body.get("auth"), "auth")
    raw = body.get("decisions")
    if raw is None:
        raise ValidationError("missing_field", "decisions is required", "decisions", status=400)
    if not isinstance(raw, list):
        raise ValidationError("invalid_type", "decisions must be a list", "decisions", status=400)
    if not raw:
        raise ValidationError("invalid_value", "decisions must not be empty", "decisions")
    version = require_string(body.get("policyVersion"), "policyVersion")
    decided_at = _parse_decided_at(
        body.get("decidedAt"),
        now,
        dt.timedelta(seconds=portal.settings.decided_at_max_skew_seconds),
    )
    source = source_for("preferences", body)
    named: list[tuple[Choice, PreferenceState]] = []
    for index, item in enumerate(raw):
        field = f"decisions[{index}]"
        entry = require_object(item, field)
        slug = require_string(entry.get("slug"), f"{field}.slug")
        state = require_string(entry.get("state"), f"{field}.state")
        if state not in {s.value for s in PreferenceState}:
            raise ValidationError(
                "invalid_state", "state is opt_in, opt_out or unset", f"{field}.state"
            )
        named.append((Choice(slug, f"{field}.slug"), PreferenceState(state)))
    topics = chosen_topics(session, policy_version=version, choices=[choice for choice, _ in named])
    require_not_superseded(session, version, decided_at)
    decisions = [Decision(topics[choice.slug], state) for choice, state in named]
    # The browser that holds the subscription, and no one else, speaks for its person.
    sub = subscription_services.held_by_endpoint(session, endpoint, proof, keys=portal.keys)
    if sub.deleted_at is not None or sub.subscriber_id is None:
        raise NotFound("unknown_endpoint", "no subscription has this endpoint", "endpoint")
    subscriber = session.get(Subscriber, sub.subscriber_id)
    if subscriber is None or subscriber.erased_at is not None:
        raise NotFound("unknown_endpoint", "no subscription has this endpoint", "endpoint")
    apply_decisions(
        session,
        subscriber.id,
        decisions,
        source=source,
        policy_version=version,
        decided_at=decided_at,
        recorded_at=now,
        context=_context("api"),
        subscription_id=sub.id,
    )
    session.commit()
    return jsonify({"preferences": preferences_json(subscriber)})


def preferences_json(subscriber: Subscriber) -> list[dict[str, Any]]:
    return [
        {
            "slug": view.topic.slug,
            "state": view.effective.state,
            "effective": "on" if view.effective.on else "off",
            "reason": view.effective.reason.value,
            "decidedAt": view.decided_at.isoformat() if view.decided_at else None,
            "policyVersion": view.policy_version,
        }
        for view in topic_views(db.session, subscriber)
    ]


# The form saves' counts commit with the save (ratelimit.save_verdict).
for _form_save in (save, confirm_notice, marketing_off, frequency, quiet_hours):
    ratelimit.count_in_the_request(f"{bp.name}.{_form_save.__name__}")
