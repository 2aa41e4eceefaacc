"""Campaign pages for staff with the ``campaigns`` role: list, form, review, launch, follow.

The routes sit on the staff console's blueprint, which signs staff in and checks roles
and CSRF for every page under ``/staff``. Views stay thin: the form turns input into a
draft, the services hold the rules, and every change is audited in its own transaction.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flask import (
    Response,
    abort,
    current_app,
    flash,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from sqlalchemy.exc import IntegrityError

from portal.campaigns import (
    drafts,
    funnel,
    funnel_chart,
    local_time,
    media,
    outcome,
    presentation,
    services,
    testdevices,
    variants,
    zones,
)
from portal.campaigns.actions import (
    CANCELLED,
    CLONED,
    DEVICE_TEST_SENT,
    DRAFT_CHANGED,
    DRAFT_SAVED,
    LAUNCHED,
    PAUSED,
    PICTURE_UPLOADED,
    RESUMED,
    TEST_SENT,
)
from portal.campaigns.forms import (
    FIELD_ORDER,
    SCHEDULE_CHOICES,
    UPLOAD_CHOICES,
    URGENCY_CHOICES,
    CampaignForm,
    CancelForm,
    TestSendForm,
    check,
)
from portal.campaigns.models import Campaign, Draft
from portal.campaigns.readings import CostlyReadings, Reading
from portal.campaigns.services import CampaignDraft, payload_size
from portal.consent.catalogue import topic_by_slug
from portal.consent.models import Topic
from portal.consent.recipients import AudienceCounts, audience_counts, by_reason, by_zone
from portal.db import db, uuid7
from portal.delivery.models import DeliveryStatus
from portal.errors import ApiError
from portal.identity import device_from_cookie, subscriber_from_cookie
from portal.inputs import error_list
from portal.origins import campaign_link_origins, public_origin
from portal.seams import current_portal
from portal.security import CONTENT_SECURITY_POLICY
from portal.staff import audit
from portal.staff.access import StaffPage, current_staff, staff_required
from portal.staff.blueprint import bp
from portal.staff.forms import ConfirmForm
from portal.staff.models import Role
from portal.useragent import family

if TYPE_CHECKING:
    from portal.staff.services import SignedIn

# Its pages on the staff dashboard (create_app lists them, in its order).
PAGES = (
    StaffPage(
        "staff.campaign_list",
        "Campaigns",
        "Create, test, launch and follow campaigns; pause, resume or cancel them.",
    ),
)

_CONTROLS = {"pause": PAUSED, "resume": RESUMED, "cancel": CANCELLED}
_DONE = {"pause": "paused", "resume": "resumed", "cancel": "cancelled"}
# After a test send: the session keeps the form's fields that a campaign has no column for.
_TESTED = "campaign_test_send"
_KEPT = (
    "schedule",
    "send_at",
    "timezone",
    "local_time",
    "fallback_zone",
    "deliver_until",
    "campaign_id",
    "draft_id",
    "draft_version",
)
# The A/B test: a test goes with variant A's text alone, so its campaign keeps no
# variants. Kept in the (cookie) session too, while they fit in it with room to spare;
# longer, the page says so rather than launch without them.
_KEPT_VARIANTS = drafts.FIELDS[
    drafts.FIELDS.index("variant_b_title") : drafts.FIELDS.index("winner_after_hours") + 1
]
_KEPT_VARIANTS_MAX = 1500  # characters of their JSON: the cookie holds about 4,000


def _now() -> dt.datetime:
    return current_portal().clock.now()


@bp.app_template_filter("zoned")
def _zoned(at: dt.datetime, zone: str | None) -> presentation.ZonedTime:
    return presentation.zoned_time(at, zone)


@bp.app_template_filter("local_schedule")
def _local_schedule(at: dt.time | None, fallback: str | None) -> str | None:
    return presentation.local_schedule(at, fallback)


def _signed_in() -> SignedIn:
    staff = current_staff()
    assert staff is not None  # staff_required ran first
    return staff


def _uuid(text: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(text or "")
    except ValueError:
        return None


def _site_name() -> str:
    """The site a notification names (its origin's host), from PUBLIC_URL."""
    return urlsplit(public_origin()).netloc


def _preview(form: CampaignForm) -> dict[str, Any]:
    """What the notification shows, from the fields as typed (valid or not)."""
    draft = CampaignDraft(
        topic="",
        title=form.title.data or "",
        body=form.body.data or "",
        url=form.url.data or None,
        icon=form.icon.data or None,
        image=form.image.data or None,
        badge=form.badge.data or None,
        actions=form.actions(),
        require_interaction=bool(form.require_interaction.data),
        silent=bool(form.silent.data),
    )
    ttl = form.ttl_seconds()
    origins = campaign_link_origins()
    image = services.drawable(draft.image, origins)
    return {
        "title": draft.title,
        "body": draft.body,
        "url": draft.url,
        "icon": draft.icon,
        "icon_src": services.drawable(draft.icon, origins),
        "image": draft.image,
        "image_src": image,
        "actions": [title for title, _ in draft.actions if title],
        "require_interaction": draft.require_interaction,
        "silent": draft.silent,
        "platforms": presentation.platform_previews(
            draft.title, draft.body, image, [title for title, _ in draft.actions if title]
        ),
        "size": payload_size(draft),
        "limit": services.MAX_PLAINTEXT,
        "ttl_words": presentation.ttl_in_words(ttl) if ttl is not None else None,
        "origin": _site_name(),
    }


def _drawing_images(html: str, status: int = 200) -> Response:
    """A composer page, allowed to draw images from the sites campaign links may lead to
    (CAMPAIGN_LINK_ORIGINS) as well as this one: the preview shows the icon and image
    from where the notification will load them. Every other rule of the site's policy
    stays."""
    response = make_response(html, status)
    others = " ".join(current_portal().settings.campaign_link_origins)
    if others:
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY.replace(
            "img-src 'self'", f"img-src 'self' {others}"
        )
    return response


def _form_page(form: CampaignForm, *, status: int = 200, previewed: bool = False) -> Any:
    editing = form.draft()
    return _drawing_images(
        render_template(
            "staff/campaigns/new.html",
            form=form,
            editing=db.session.get(Draft, editing[0]) if editing else None,
            errors=error_list(form, order=FIELD_ORDER),
            topics=form.topic_choices(db.session),
            zones=zones.zones(),
            schedule_choices=SCHEDULE_CHOICES,
            upload_choices=UPLOAD_CHOICES,
            upload_limit=f"{media.MAX_BYTES // 1024} kB",
            upload_side=media.MAX_SIDE,
            urgency_choices=URGENCY_CHOICES,
            urgency_hints={
                value: meaning[:1].upper() + meaning[1:] + "."
                for value, (_, meaning) in presentation.URGENCIES.items()
            },
            preview=_preview(form),
            previewed=previewed,
        ),
        status,
    )


# The audience counts of this process (portal/campaigns/readings.py). A topic's count
# reads every subscription there is, whatever the topic's size: 0.75 s among 1,000,000
# subscribers here, and the review page, each test send from it and the launch counted
# again. A count that took longer than REUSE_ABOVE is answered again for ten times what it
# cost, and the pages say when it was counted; a change to the topic counts afresh.
_AUDIENCES = CostlyReadings()


@dataclass(frozen=True)
class AudienceCount:
    counts: AudienceCounts  # by reason and time zone
    counted_at: dt.datetime
    kept: bool  # a costly count, answered again for a while: the page says when it was

    @property
    def by_reason(self) -> dict[str, int]:
        return by_reason(self.counts)

    @property
    def by_zone(self) -> dict[str | None, int]:
        return by_zone(self.counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _topic_key(topic: Topic) -> tuple[Any, ...]:
    return (topic.id, topic.default_state, topic.is_transactional, topic.retired_at)


def audience_count(topic: Topic) -> AudienceCount:
    """Who consent allows for ``topic``, by reason and time zone: counted, or kept from a
    costly count moments ago."""
    reading = _AUDIENCES.read(
        _topic_key(topic), lambda: (audience_counts(db.session, topic.id), _now())
    )
    counts, at = reading.value
    return AudienceCount(counts, at, _AUDIENCES.seconds_fresh(reading) > 0)


def _audience(count: AudienceCount) -> dict[str, Any]:
    return {
        "total": count.total,
        "counted_at": count.counted_at,
        "kept": count.kept,
        "rows": [
            (label, hint, count.by_reason.get(reason, 0))
            for reason, (label, hint) in presentation.AUDIENCE_LABELS.items()
        ],
    }


@dataclass(frozen=True)
class LocalHours:
    """A local-time campaign's deliveries per hour, as the review page shows them."""

    rows: list[tuple[presentation.ZonedTime, int]]
    unknown_zone: int  # of them, people whose zone is not known (the fallback's hour)


def _local_hours(count: AudienceCount, draft: CampaignDraft) -> LocalHours | None:
    if draft.local_time is None or draft.fallback is None:
        return None
    # The audience's own count, so the hours add up to its total.
    zones = count.by_zone
    start = draft.send_at or _now()
    hours = local_time.per_hour(start, draft.local_time, zones, draft.fallback)
    rows = [(presentation.zoned_time(hour, draft.time_zone), n) for hour, n in hours]
    return LocalHours(rows, zones.get(None, 0))


def _review_page(
    form: CampaignForm,
    draft: CampaignDraft,
    *,
    test_campaign: Campaign | None = None,
    device_test: testdevices.TestSend | None = None,
    chosen: list[int] | None = None,
    device_error: str | None = None,
) -> Any:
    if form.chosen_id() is None:
        form.campaign_id.data = str(uuid7())
    subscriber_id = subscriber_from_cookie(request)
    targets = services.subscriptions_for_tests(db.session, subscriber_id) if subscriber_id else []
    topic = topic_by_slug(db.session, draft.topic)
    count = audience_count(topic)  # one reading for the total and the hours
    return _drawing_images(
        render_template(
            "staff/campaigns/review.html",
            form=form,
            errors=[],
            draft=draft,
            topic=topic,
            audience=_audience(count),
            local_hours=_local_hours(count, draft),
            local_schedule=presentation.local_schedule(draft.local_time, draft.fallback),
            preview=_preview(form),
            ttl_words=presentation.ttl_in_words(draft.ttl),
            urgency=presentation.urgency_text(draft.urgency),
            targets=targets,
            this_device=device_from_cookie(request),
            family=family,
            test_campaign=test_campaign,
            dispatch_every=current_portal().settings.schedule.dispatch,
            caps_note=presentation.frequency_cap_note(
                current_portal().settings.frequency_caps,
                transactional=bool(topic and topic.is_transactional),
            ),
            quiet_note=presentation.quiet_hours_note(
                current_portal().settings.quiet_hours.window,
                transactional=bool(topic and topic.is_transactional),
            ),
            devices=testdevices.devices_of(db.session, _signed_in().id),
            chosen=set(chosen or ()),
            device_test=device_test,
            device_error=device_error,
            result_labels=testdevices.RESULT_LABELS,
            max_devices=testdevices.MAX_DEVICES_PER_SEND,
        )
    )


# -- the list -----------------------------------------------------------------------------


@bp.get("/campaigns")
@staff_required(Role.CAMPAIGNS)
def campaign_list() -> Any:
    include_tests = request.args.get("tests") == "1"
    # The "older" link's campaign: anything else is a bad address, not the first page.
    before = None
    if "before" in request.args:
        before = _uuid(request.args["before"])
        if before is None:
            abort(400)
        if db.session.get(Campaign, before) is None:
            return _not_found()
    page = services.list_campaigns(db.session, include_tests=include_tests, before=before)
    now = _now()
    every = current_portal().settings.schedule.dispatch
    return render_template(
        "staff/campaigns/list.html",
        page=page,
        drafts=drafts.open_drafts(db.session),
        include_tests=include_tests,
        headlines={
            row.campaign.id: outcome.from_counts(
                row.campaign, row.counts, now=now, dispatch_every=every
            )
            for row in page.rows
        },
    )


# -- the form, the review step and launch -------------------------------------------------


@bp.route("/campaigns/new", methods=["GET", "POST"])
@staff_required(Role.CAMPAIGNS)
def campaign_new() -> Any:
    form = CampaignForm()
    if request.method == "GET":
        return _form_page(form)
    if not _take_upload(form):
        return _form_page(form, status=422)
    action = request.form.get("action", "review")
    if action == "edit":
        return _form_page(form)
    if action == "save_draft":
        return _save_draft(form)
    if action == "preview":
        # Drafting: show the notification as typed; the rules are checked on review.
        return _form_page(form, previewed=True)
    draft = check(form, db.session, now=_now())
    if draft is None:
        return _form_page(form, status=422)
    if action == "launch":
        return _launch(form, draft)
    return _review_page(form, draft)


def _take_upload(form: CampaignForm) -> bool:
    """Keep the picture the form carries, if any, and put its address in the field it is
    for; whatever the button, the page then goes on with that address typed in. False,
    with the field's error, when it cannot be kept (nothing is stored then)."""
    for name in ("upload", "upload_as"):
        form[name].errors = []
    upload = request.files.get("upload")
    if upload is None:
        return True
    data = upload.stream.read()  # at most MAX_BODY_BYTES: the request was refused otherwise
    if not data and not upload.filename:
        return True  # the browser's empty part: no file chosen
    use = form.upload_as.data or ""
    if use not in dict(UPLOAD_CHOICES):
        form.upload_as.errors = ["Choose what the uploaded picture is for"]
        return False
    try:
        picture = media.store(
            db.session,
            data,
            uploaded_by=_signed_in().id,
            now=_now(),
            per_day=current_portal().settings.pictures.uploads_per_day,
        )
    except ApiError as problem:
        db.session.rollback()
        form.upload.errors = [problem.message]
        return False
    path = media.path_of(picture)
    form[use].data = path
    audit.record(
        db.session,
        _signed_in(),
        PICTURE_UPLOADED,
        f"picture:{picture.sha256}",
        media.audit_detail(picture, usedAs=use),
    )
    db.session.commit()
    # Said on the form's page; the review page shows the picture itself.
    form.uploaded = (
        f"Uploaded: {picture.width} × {picture.height} pixels, kept at {path}, and now "
        f"{dict(UPLOAD_CHOICES)[use].lower()} of this campaign."
    )
    return True


def _bad_draft_reference(form: CampaignForm) -> bool:
    """A draft id or version sent but not readable: only a changed page sends that."""
    return bool(form.draft_id.data or form.draft_version.data) and form.draft() is None


def _save_draft(form: CampaignForm) -> Any:
    """Keep the form as typed: a new draft, or the one being edited (if nobody saved or
    launched it since this form was filled from it)."""
    for field in form:
        field.errors = []
    if _bad_draft_reference(form):
        form.title.errors = ["This page's draft could not be read: open the draft again"]
        return _form_page(form, status=422)
    typed = form.typed()
    problems = drafts.problems(typed)
    for problem in problems:
        field = getattr(form, problem.field or "", None) or form.title
        if not field.errors:
            field.errors = [problem.message]
    if problems:
        return _form_page(form, status=422)
    staff = _signed_in()
    editing = form.draft()
    try:
        if editing is None:
            saved = drafts.create(db.session, typed, by=staff.email, now=_now())
            action = DRAFT_SAVED
        else:
            saved = drafts.save(
                db.session, editing[0], editing[1], typed, by=staff.email, now=_now()
            )
            action = DRAFT_CHANGED
        audit.record(
            db.session,
            staff,
            action,
            f"draft:{saved.id}",
            {
                "title": saved.title,
                "topic": saved.fields.get("topic", ""),
                "version": saved.version,
            },
        )
        db.session.commit()
    except ApiError as problem:  # launched or saved by someone else meanwhile
        db.session.rollback()
        flash(f"Not saved: {problem.message}.", "error")
        return _form_page(form, status=problem.status)
    flash("Draft saved. It is not sent until you review and launch it.")
    return redirect(url_for("staff.campaign_draft", draft_id=saved.id), 303)


@bp.get("/campaigns/drafts/<uuid:draft_id>")
@staff_required(Role.CAMPAIGNS)
def campaign_draft(draft_id: uuid.UUID) -> Any:
    """A saved draft in the campaign form, to change, save again, review and launch."""
    found = db.session.get(Draft, draft_id)
    if found is None:
        return _not_found()
    if found.launched_campaign_id is not None:
        flash(f"That draft was launched by {found.launched_by}: here is the campaign.")
        return redirect(
            url_for("staff.campaign_detail", campaign_id=found.launched_campaign_id), 303
        )
    form = CampaignForm(
        formdata=None,
        data={**found.fields, "draft_id": str(found.id), "draft_version": str(found.version)},
    )
    return _form_page(form)


@bp.post("/campaigns/<uuid:campaign_id>/clone")
@staff_required(Role.CAMPAIGNS)
def campaign_clone(campaign_id: uuid.UUID) -> Any:
    """A new draft with this campaign's content, whatever its state."""
    staff = _signed_in()
    try:
        draft = drafts.clone(db.session, campaign_id, by=staff.email, now=_now())
    except ApiError:
        db.session.rollback()
        return _not_found()
    audit.record(
        db.session,
        staff,
        CLONED,
        f"draft:{draft.id}",
        {"from": f"campaign:{campaign_id}", "title": draft.title},
    )
    db.session.commit()
    flash("Cloned into a new draft: change what you need, then review and launch it.")
    return redirect(url_for("staff.campaign_draft", draft_id=draft.id), 303)


def _launch(form: CampaignForm, draft: CampaignDraft) -> Any:
    staff = _signed_in()
    chosen = form.chosen_id()
    if chosen is not None:
        existing = db.session.get(Campaign, chosen)
        if existing is not None:
            if existing.created_by == staff.email and not existing.is_test:
                flash("This campaign was launched already: here it is.")
                return redirect(url_for("staff.campaign_detail", campaign_id=existing.id), 303)
            chosen = None
    if _bad_draft_reference(form):
        flash("This page's draft could not be read: open the draft again.", "error")
        return _form_page(form, status=422)
    from_draft = form.draft()
    topic = topic_by_slug(db.session, draft.topic)
    audience = audience_count(topic)
    try:
        campaign = services.create_campaign(
            db.session,
            draft,
            created_by=staff.email,
            now=_now(),
            campaign_id=chosen,
            link_origins=campaign_link_origins(),
        )
        if from_draft is not None:
            # In the campaign's transaction: a draft launched or changed by someone else
            # meanwhile (the UPDATE's condition fails) rolls this campaign back.
            drafts.mark_launched(
                db.session, from_draft[0], from_draft[1], campaign.id, by=staff.email, now=_now()
            )
        audit.record(
            db.session,
            staff,
            LAUNCHED,
            f"campaign:{campaign.id}",
            {
                "topic": topic.slug,
                "title": campaign.title,
                "sendAt": campaign.send_at.isoformat(),
                "audience": audience.total,
                "byReason": audience.by_reason,
                "audienceCountedAt": audience.counted_at.isoformat(),
                **({"draft": f"draft:{from_draft[0]}"} if from_draft else {}),
            },
        )
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        if chosen is None:
            raise
        # The same Launch pressed twice at once: the other request made it.
        flash("This campaign was launched already: here it is.")
        return redirect(url_for("staff.campaign_detail", campaign_id=chosen), 303)
    except ApiError as problem:  # a rule that changed since the review (a retired topic)
        db.session.rollback()
        if problem.field == "draft":  # launched or saved by someone else meanwhile
            flash(f"Not launched: {problem.message}.", "error")
            return _form_page(form, status=problem.status)
        field = getattr(form, problem.field or "", None) or form.topic
        field.errors = [problem.message]
        return _form_page(form, status=422)
    when = (
        "now"
        if campaign.send_at <= _now()
        else f"on {presentation.zoned_time(campaign.send_at, campaign.time_zone).text}"
    )
    flash(f"Campaign launched: it sends {when}.")
    return redirect(url_for("staff.campaign_detail", campaign_id=campaign.id), 303)


@bp.post("/campaigns/test-send")
@staff_required(Role.CAMPAIGNS)
def campaign_test_send() -> Any:
    """Create a test campaign for one of the sender's own subscriptions.

    It is sent by the dispatcher's next run (the scheduler's ``dispatch`` job), like any
    delivery: the request does not send, so it never waits on a push service or runs
    other campaigns' work.
    """
    form = TestSendForm()
    draft = check(form, db.session, now=_now())
    if draft is None:
        return _form_page(form, status=422)
    staff = _signed_in()
    subscriber_id = subscriber_from_cookie(request)
    subscription_id = form.subscription_id()
    if subscriber_id is None or subscription_id is None:
        flash("Choose one of this browser's subscriptions to send the test to.", "error")
        return _review_page(form, draft), 422
    try:
        campaign = services.create_test_campaign(
            db.session,
            draft,
            subscription_id=subscription_id,
            subscriber_id=subscriber_id,
            created_by=staff.email,
            now=_now(),
            link_origins=campaign_link_origins(),
        )
        audit.record(
            db.session,
            staff,
            TEST_SENT,
            f"campaign:{campaign.id}",
            {"topic": draft.topic, "title": campaign.title, "subscription": str(subscription_id)},
        )
        db.session.commit()
    except ApiError as problem:
        db.session.rollback()
        flash(problem.message, "error")
        return _review_page(form, draft), 422
    # Post/redirect/get: reloading the answer shows the test again, never sends another.
    # The test campaign keeps the draft; the session keeps only what it has no column for.
    kept = {"id": str(campaign.id), **{name: form[name].data for name in _KEPT}}
    variant_fields = {name: form[name].data for name in _KEPT_VARIANTS}
    if len(json.dumps(variant_fields)) <= _KEPT_VARIANTS_MAX:
        kept |= variant_fields
    else:
        kept["variants_not_kept"] = True
    session[_TESTED] = kept
    return redirect(url_for("staff.campaign_test_sent", campaign_id=campaign.id), 303)


@bp.get("/campaigns/test-send/<uuid:campaign_id>")
@staff_required(Role.CAMPAIGNS)
def campaign_test_sent(campaign_id: uuid.UUID) -> Any:
    """The review page again after a test send: the draft as the sender left it, the
    test queued, and Launch, Change and another test as before."""
    campaign = db.session.get(Campaign, campaign_id)
    if campaign is None or not campaign.is_test or campaign.created_by != _signed_in().email:
        return _not_found()
    topic = db.session.get(Topic, campaign.topic_id)
    assert topic is not None
    kept = session.get(_TESTED) or {}
    typed = {
        "topic": topic.slug,
        "title": campaign.title,
        "body": campaign.body,
        "url": campaign.url or "",
        "icon": campaign.icon or "",
        "urgency": campaign.urgency,
        "ttl": str(campaign.ttl),
        "collapse_key": campaign.collapse_key or "",
        **{
            name: value
            for name, value in drafts.fields_of(campaign, topic).items()
            if name not in _KEPT
        },
    }
    mine = kept.get("id") == str(campaign.id)  # another tab's test keeps its own schedule
    if mine:
        typed |= {name: kept.get(name) or "" for name in (*_KEPT, *_KEPT_VARIANTS)}
    form = TestSendForm(formdata=None, data=typed)
    if mine and kept.get("variants_not_kept"):
        flash(
            "Your test is queued, with variant A's text. Variants B and C were too long to "
            "keep on this page: type them again before you launch.",
            "error",
        )
        return _form_page(form)
    draft = check(form, db.session, now=_now())
    if draft is None:  # a rule changed since the test (a send time passed): say which
        flash("Your test is queued. Change what the form shows before you launch.")
        return _form_page(form)
    return _review_page(form, draft, test_campaign=campaign)


def _device_form_fields(form: CampaignForm) -> dict[str, Any]:
    """The form as sent to test devices: the draft's fields and the review page's own
    (the launch id, the draft being edited), to show the review page again."""
    return {
        **form.typed(),
        "campaign_id": form.campaign_id.data or "",
        "draft_id": form.draft_id.data or "",
        "draft_version": form.draft_version.data or "",
    }


@bp.post("/campaigns/device-test")
@staff_required(Role.CAMPAIGNS)
def campaign_device_test() -> Any:
    """Send the reviewed campaign's message to some of the sender's test devices, now.

    Nothing is launched and no campaign or delivery is stored: the message goes out in
    this request (:func:`portal.campaigns.testdevices.send_test`) and the answer page
    says what each device's push service answered."""
    form = CampaignForm()
    draft = check(form, db.session, now=_now())
    if draft is None:
        return _form_page(form, status=422)
    staff = _signed_in()
    values = request.form.getlist("device")
    try:
        ids = testdevices.parse_choice(values)
        devices = testdevices.chosen_devices(db.session, staff.id, ids)
    except ApiError as problem:
        kept = [int(v) for v in values if v.isascii() and v.isdigit() and len(v) < 19]
        return _review_page(form, draft, chosen=kept, device_error=problem.message), 422
    now = _now()
    wait = testdevices.next_send_allowed(db.session, staff.id, now)
    if wait is not None:
        message = (
            f"You have sent {testdevices.SENDS_PER_WINDOW} tests in the last "
            f"{int(testdevices.SEND_WINDOW.total_seconds() // 60)} minutes: you can send "
            f"the next one at {wait:%H:%M:%S} UTC"
        )
        refused = _review_page(form, draft, chosen=ids, device_error=message)
        refused.status_code = 429
        refused.headers["Retry-After"] = str(max(1, int((wait - now).total_seconds() + 0.999)))
        return refused
    campaign = services.unsaved_campaign(
        db.session,
        draft,
        created_by=staff.email,
        now=now,
        is_test=True,
        campaign_id=form.chosen_id(),
        link_origins=campaign_link_origins(),
    )
    outcomes = testdevices.send_test(
        db.session,
        devices,
        campaign,
        keys=current_portal().keys,
        transport=testdevices.transport_for(current_app._get_current_object()),  # type: ignore[attr-defined]
        now=now,
    )
    sent = testdevices.record_send(
        db.session, staff.id, _device_form_fields(form), outcomes, now=now
    )
    audit.record(
        db.session,
        staff,
        DEVICE_TEST_SENT,
        f"test-send:{sent.id}",
        {
            "topic": draft.topic,
            "title": campaign.title,
            "devices": [f"{o['name']}: {o['result']}" for o in outcomes],
        },
    )
    db.session.commit()
    # Post/redirect/get: reloading the answer shows these outcomes, never sends again.
    return redirect(url_for("staff.campaign_device_tested", send_id=sent.id), 303)


@bp.get("/campaigns/device-test/<uuid:send_id>")
@staff_required(Role.CAMPAIGNS)
def campaign_device_tested(send_id: uuid.UUID) -> Any:
    """The review page again after a test to devices: the form as it was sent and what
    each device's push service answered. Only the sender sees it."""
    sent = db.session.get(testdevices.TestSend, send_id)
    if sent is None or sent.staff_user_id != _signed_in().id:
        return _not_found()
    form = CampaignForm(formdata=None, data=dict(sent.fields))
    draft = check(form, db.session, now=_now())
    if draft is None:  # a rule changed since (a send time passed): say which
        flash("Your test was sent. Change what the form shows before you launch.")
        return _form_page(form)
    return _review_page(
        form, draft, device_test=sent, chosen=[int(o["device"]) for o in sent.outcomes]
    )


# -- one campaign -------------------------------------------------------------------------


def _find(campaign_id: uuid.UUID) -> tuple[Campaign, Topic] | None:
    campaign = db.session.get(Campaign, campaign_id)
    if campaign is None:
        return None
    topic = db.session.get(Topic, campaign.topic_id)
    assert topic is not None
    return campaign, topic


def _not_found() -> tuple[str, int]:
    return render_template("staff/campaigns/not_found.html"), 404


def _progress(campaign: Campaign) -> dict[str, Any]:
    """Where the campaign is, as the page shows it and its script refreshes it: the
    counts, the headline (:func:`portal.campaigns.outcome.headline`), why deliveries did
    not arrive, the push services slowed down, and the page's live parts as HTML. The
    template context; its ``progress`` is what ``progress.json`` answers."""
    now = _now()
    settings = current_portal().settings
    reading = outcome.read(
        db.session,
        campaign,
        now=now,
        dispatch_every=settings.schedule.dispatch,
        max_attempts=settings.retry.max_attempts,
    )
    facts = reading.facts
    said = outcome.headline(facts)
    circuits = outcome.circuits_seen(db.session, campaign, now=now)
    rows = services.outcome_by_service(db.session, campaign)
    data: dict[str, Any] = {
        "id": str(campaign.id),
        "status": campaign.status,
        "statusLabel": said.label,
        "tone": said.tone.value,
        "finished": said.finished,
        "materialised": facts.materialised,
        "counts": facts.counts,
        "total": facts.total,
        "done": facts.total
        - facts.count(DeliveryStatus.QUEUED)
        - facts.count(DeliveryStatus.SENDING),
        "summary": said.text,
        "parts": [{"label": word, "count": n} for word, n in said.parts],
        "activity": said.activity,
        "retrying": facts.retrying,
        "nextRetryAt": facts.next_retry_at.isoformat() if facts.next_retry_at else None,
        "failures": [
            {"reason": label, "count": n} for label, n in outcome.breakdown(facts.reasons)
        ],
        "slowdowns": outcome.slowdowns(circuits, reading.retries, finished=said.finished),
        "circuits": [
            {
                "pushService": c.push_service,
                "openUntil": c.open_until.isoformat(),
                "reason": c.reason,
                "text": presentation.circuit_sentence(c),
            }
            for c, still_open in circuits
            if still_open
        ],
        "outcome": [
            {"pushService": s, "answer": presentation.answer_label(a), "count": n}
            for s, a, n in rows
        ],
        "at": now.isoformat(),
    }
    context = {
        "campaign": campaign,
        "progress": data,
        "delivery_labels": presentation.DELIVERY_LABELS,
        "no_slowdown": outcome.no_slowdown(finished=said.finished),
        "chart": presentation.outcome_chart(rows),
        "outcome": [(s, presentation.answer_label(a), n) for s, a, n in rows],
        **_funnel(campaign, now),
    }
    data["funnel"] = _funnel_data(context["funnel"])
    data["html"] = {
        "progress": render_template("staff/campaigns/_progress.html", **context),
        "outcome": render_template("staff/campaigns/_outcome.html", **context),
        "funnel": render_template("staff/campaigns/_funnel_figures.html", **context),
    }
    return context


def _funnel(campaign: Campaign, now: dt.datetime) -> dict[str, Any]:
    """The delivery funnel (:func:`portal.campaigns.funnel.read`) and its chart, for
    ``_funnel_figures.html``."""
    read = funnel.read(db.session, campaign, now=now)
    return {
        "funnel": read,
        "funnel_chart": funnel_chart.funnel_chart(read),
        "funnel_periods": funnel_chart.periods(read),
        "period_words": funnel_chart.period_words(read.width) if read.width else "",
        "funnel_day": funnel_chart.one_day(read),
    }


def _funnel_data(read: funnel.Funnel) -> dict[str, Any]:
    def share(value: funnel.Rate | None) -> float | None:
        return round(value.percent, 1) if value is not None else None

    return {
        "accepted": read.accepted,
        "shown": read.shown,
        "clicked": read.clicked,
        "clickedOutsideButtons": read.clicked_body,
        "clickedOnButtons": list(read.clicked_buttons),
        "clickedWithoutShown": read.clicked_unreported,
        "receiptsNotAccepted": read.unaccepted,
        "clickedOfShown": share(read.clicked_of_shown),
        "clickedOfAccepted": share(read.clicked_of_accepted),
    }


# The page's script asks at most this often; a costly reading makes it wait longer.
POLL_SECONDS = 5
# The progress readings of this process (portal/campaigns/readings.py), shared by the
# campaign's page and its script's questions: a campaign of millions of deliveries is
# read at most every ten times what reading it costs, however often either asks.
_READINGS = CostlyReadings()


def _progress_reading(campaign: Campaign) -> Reading:
    """The campaign's progress (:func:`_progress`, without the campaign itself, which
    belongs to the asking request's session) and its variants' results, which also count
    all its deliveries, kept per status: a pause, resume, cancel or finish is read afresh
    at once."""

    def take() -> dict[str, Any]:
        context = _progress(campaign)
        del context["campaign"]
        context["variant_results"] = variants.results(db.session, campaign)
        return context

    return _READINGS.read((campaign.id, campaign.status), take)


def _refresh_after(reading: Reading) -> int:
    """Seconds until a question may get newer numbers than ``reading``'s."""
    return max(POLL_SECONDS, round(_READINGS.seconds_fresh(reading)))


def _detail_page(
    campaign: Campaign, topic: Topic, *, cancel: CancelForm | None = None, status: int = 200
) -> Any:
    cancel = cancel or CancelForm()
    reading = _progress_reading(campaign)
    return render_template(
        "staff/campaigns/detail.html",
        **reading.value,
        campaign=campaign,
        refresh_after=_refresh_after(reading),
        poll_seconds=POLL_SECONDS,
        topic=topic,
        winner_at=variants.winner_due(campaign),
        ttl_words=presentation.ttl_in_words(campaign.ttl),
        urgency=presentation.urgency_text(campaign.urgency),
        confirm=ConfirmForm(),
        cancel=cancel,
        errors=[("confirm", cancel.confirm.errors[0])] if cancel.confirm.errors else [],
        allowed={
            action: campaign.status in {s.value for s in services.allowed_from(action)}
            for action in _CONTROLS
        },
        preview={
            "title": campaign.title,
            "body": campaign.body,
            "url": campaign.url,
            "icon": campaign.icon,
            "origin": _site_name(),
        },
    ), status


@bp.get("/campaigns/<uuid:campaign_id>")
@staff_required(Role.CAMPAIGNS)
def campaign_detail(campaign_id: uuid.UUID) -> Any:
    found = _find(campaign_id)
    if found is None:
        return _not_found()
    return _detail_page(*found)


@bp.get("/campaigns/<uuid:campaign_id>/progress.json")
@staff_required(Role.CAMPAIGNS)
def campaign_progress(campaign_id: uuid.UUID) -> Any:
    campaign = db.session.get(Campaign, campaign_id)
    if campaign is None:
        return jsonify({"error": {"code": "not_found", "message": "no such campaign"}}), 404
    reading = _progress_reading(campaign)
    return jsonify({**reading.value["progress"], "refreshAfter": _refresh_after(reading)})


def _control(campaign_id: uuid.UUID, action: str) -> Any:
    found = _find(campaign_id)
    if found is None:
        return _not_found()
    if action == "cancel":
        form = CancelForm()
        if not form.confirm.data:
            form.confirm.errors = ["Tick the box to confirm that you want to cancel"]
            return _detail_page(*found, cancel=form, status=422)
    staff = _signed_in()
    try:
        campaign = services.control(db.session, campaign_id, action, now=_now())
        audit.record(
            db.session,
            staff,
            _CONTROLS[action],
            f"campaign:{campaign.id}",
            {"status": campaign.status},
        )
        db.session.commit()
    except ApiError as problem:  # the campaign moved on meanwhile (it finished …)
        db.session.rollback()
        flash(f"Not {_DONE[action]}: {problem.message}.", "error")
    else:
        flash(f"Campaign {_DONE[action]}.")
    return redirect(url_for("staff.campaign_detail", campaign_id=campaign_id), 303)


@bp.post("/campaigns/<uuid:campaign_id>/pause")
@staff_required(Role.CAMPAIGNS)
def campaign_pause(campaign_id: uuid.UUID) -> Any:
    return _control(campaign_id, "pause")


@bp.post("/campaigns/<uuid:campaign_id>/resume")
@staff_required(Role.CAMPAIGNS)
def campaign_resume(campaign_id: uuid.UUID) -> Any:
    return _control(campaign_id, "resume")


@bp.post("/campaigns/<uuid:campaign_id>/cancel")
@staff_required(Role.CAMPAIGNS)
def campaign_cancel(campaign_id: uuid.UUID) -> Any:
    return _control(campaign_id, "cancel")
