"""Admin pages for the topic catalogue and the policy versions (role admin)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import flash, redirect, render_template, request, url_for

from portal.consent import catalogue as consent_catalogue
from portal.consent.catalogue import text_digest
from portal.db import db
from portal.errors import ApiError
from portal.inputs import error_list
from portal.seams import current_portal
from portal.staff import catalogue
from portal.staff.access import (
    StaffPage,
    current_staff,
    not_found_page,
    staff_required,
)
from portal.staff.blueprint import bp
from portal.staff.catalogue_forms import NEW_CATEGORY, PolicyForm, TopicEditForm, TopicForm
from portal.staff.forms import ConfirmForm
from portal.staff.models import Role

if TYPE_CHECKING:
    import datetime as dt

    from flask_wtf import FlaskForm

    from portal.consent.models import Topic


# Its pages on the staff dashboard (create_app lists them, in its order).
PAGES = (
    StaffPage(
        "staff.topics",
        "Topics",
        "The topic catalogue: add topics, change their wording, retire them.",
    ),
    StaffPage(
        "staff.policies",
        "Policy versions",
        "The notice texts people agree to: read any version, publish a new one.",
    ),
)


def _now() -> dt.datetime:
    return current_portal().clock.now()


def _refuse(form: FlaskForm, error: ApiError) -> None:
    """Put a service's refusal on the field it names (or the first field)."""
    target = getattr(form, error.field or "", None) or next(
        field for field in form if field.name != "csrf_token"
    )
    target.errors = [error.message[:1].upper() + error.message[1:]]


def _topic_or_404(slug: str) -> Topic | None:
    try:
        return consent_catalogue.topic_by_slug(db.session, slug)
    except ApiError:
        return None


# -- topics ---------------------------------------------------------------------------------


@bp.get("/admin/topics")
@staff_required(Role.ADMIN)
def topics() -> Any:
    topics = consent_catalogue.all_topics(db.session)
    return render_template(
        "staff/admin/topics.html",
        categories=consent_catalogue.by_category(topics),
        near_duplicates=[
            c for c in consent_catalogue.categories_in_use(db.session) if c.other_spellings
        ],
        errors=[],
    )


@bp.route("/admin/topics/new", methods=["GET", "POST"])
@staff_required(Role.ADMIN)
def topic_new() -> Any:
    """Fill in, review (nothing written), then create: ``action`` is ``review`` (the
    form's button), ``edit`` (back to the form, values kept) or ``create`` (the review's
    button). Every step checks every field afresh: the review carries them as hidden
    fields, and the final POST redirects (303), so a reload creates nothing."""
    form = TopicForm()
    if request.method == "GET":
        return _new_page(form, 200)
    action = request.form.get("action", "review")
    if action == "edit":
        return _new_page(form, 200)
    if not form.validate():
        return _new_page(form, 422)
    fields = {
        "slug": form.slug.data,
        "category": form.category_name,
        "label": form.label.data,
        "description": form.description.data or "",
        "transactional": form.topic_class.data == "transactional",
        "default_state": form.default_state.data,
        "new_category": form.adds_category,
    }
    if action != "create":
        try:
            draft = consent_catalogue.check_new_topic(db.session, **fields)
        except ApiError as error:
            _refuse(form, error)
            return _new_page(form, 422)
        finally:
            db.session.rollback()  # the review reads only; end its transaction
        return render_template(
            "staff/admin/topic_review.html", form=form, draft=draft, errors=[]
        ), 200
    try:
        topic = catalogue.create_topic(db.session, actor=current_staff(), now=_now(), **fields)
    except ApiError as error:
        db.session.rollback()
        if error.code == "slug_taken" and _created_already(fields):
            # The same Create topic sent again (a reload of the review's POST).
            flash(f"Topic {form.slug.data} was created already: nothing changed.")
            return redirect(url_for("staff.topics"), 303)
        _refuse(form, error)
        return _new_page(form, 422)
    db.session.commit()
    flash(f"Topic {topic.slug} added under {topic.category}.")
    return redirect(url_for("staff.topics"), 303)


def _created_already(fields: dict[str, Any]) -> bool:
    """An active topic exactly as these fields would create it."""
    topic = _topic_or_404(fields["slug"])
    return (
        topic is not None
        and topic.retired_at is None
        and consent_catalogue.category_key(topic.category)
        == consent_catalogue.category_key(fields["category"])
        and (topic.label, topic.description, topic.is_transactional, topic.default_state)
        == (
            fields["label"].strip(),
            fields["description"].strip(),
            fields["transactional"],
            fields["default_state"],
        )
    )


def _new_page(form: TopicForm, status: int) -> Any:
    return render_template(
        "staff/admin/topic_new.html",
        form=form,
        errors=error_list(form),
        categories=consent_catalogue.categories_in_use(db.session),
        new_category=NEW_CATEGORY,
    ), status


@bp.route("/admin/topics/<slug>/edit", methods=["GET", "POST"])
@staff_required(Role.ADMIN)
def topic_edit(slug: str) -> Any:
    topic = _topic_or_404(slug)
    if topic is None:
        return not_found_page("topic", "staff.topics", "the topic list")
    if request.method == "GET" or topic.retired_at is not None:
        form = TopicEditForm(data={"label": topic.label, "description": topic.description})
        # A retired topic keeps the words it had: the page says so and offers no form.
        status = 409 if request.method == "POST" else 200
        return _edit_page(topic, form, status)
    form = TopicEditForm()
    if not form.validate():
        return _edit_page(topic, form, 422)
    try:
        changed = catalogue.edit_topic(
            db.session,
            actor=current_staff(),
            slug=slug,
            label=form.label.data,
            description=form.description.data or "",
            now=_now(),
        )
    except ApiError as error:
        db.session.rollback()
        _refuse(form, error)
        return _edit_page(topic, form, 422)
    db.session.commit()
    flash(f"Topic {slug} saved." if changed else f"Nothing changed on topic {slug}.")
    return redirect(url_for("staff.topics"), 303)


def _edit_page(topic: Topic, form: TopicEditForm, status: int) -> Any:
    return render_template(
        "staff/admin/topic_edit.html", topic=topic, form=form, errors=error_list(form)
    ), status


@bp.route("/admin/topics/<slug>/retire", methods=["GET", "POST"])
@staff_required(Role.ADMIN)
def topic_retire(slug: str) -> Any:
    topic = _topic_or_404(slug)
    if topic is None:
        return not_found_page("topic", "staff.topics", "the topic list")
    form = ConfirmForm()
    if request.method == "POST" and form.validate():
        changed = catalogue.retire_topic(db.session, actor=current_staff(), slug=slug, now=_now())
        db.session.commit()
        flash(f"Topic {slug} is retired." if changed else f"Topic {slug} was already retired.")
        return redirect(url_for("staff.topics"), 303)
    return render_template("staff/admin/topic_retire.html", topic=topic, form=form, errors=[])


# -- policy versions ------------------------------------------------------------------------


@bp.get("/admin/policies")
@staff_required(Role.ADMIN)
def policies() -> Any:
    versions = consent_catalogue.all_policies(db.session)
    return render_template("staff/admin/policies.html", versions=versions, errors=[])


@bp.get("/admin/policies/versions/<version>")
@staff_required(Role.ADMIN)
def policy_version(version: str) -> Any:
    policy = consent_catalogue.policy(db.session, version)
    if policy is None:
        return not_found_page("policy version", "staff.policies", "the policy versions")
    previous = consent_catalogue.previous_policy(db.session, policy)
    current = consent_catalogue.current_policy(db.session)
    return render_template(
        "staff/admin/policy_version.html",
        policy=policy,
        previous=previous,
        is_current=current is not None and current.version == policy.version,
        diff=catalogue.line_diff(previous.text, policy.text) if previous else None,
        errors=[],
    )


@bp.route("/admin/policies/new", methods=["GET", "POST"])
@staff_required(Role.ADMIN)
def policy_new() -> Any:
    """Write, preview (with the diff from the current version), then publish.

    Publishing needs the SHA-256 of the text last previewed, so nobody publishes a text
    they have not seen as people will see it.
    """
    form = PolicyForm()
    current = consent_catalogue.current_policy(db.session)
    publishing = request.form.get("action") == "publish"
    preview = False
    status = 200
    if request.method == "POST":
        status = 422
        if form.validate():
            digest = text_digest(form.text.data)
            if publishing and form.previewed.data == digest:
                try:
                    policy = catalogue.publish_policy(
                        db.session,
                        actor=current_staff(),
                        version=form.version.data,
                        text=form.text.data,
                        now=_now(),
                    )
                except ApiError as error:
                    db.session.rollback()
                    _refuse(form, error)
                else:
                    db.session.commit()
                    flash(f"Policy version {policy.version} is published.")
                    return redirect(url_for("staff.policy_version", version=policy.version), 303)
            else:
                if publishing:
                    form.text.errors = [
                        "The text changed since the preview: read the new preview, then publish"
                        if form.previewed.data
                        else "Preview the text before publishing it"
                    ]
                else:
                    status = 200
                preview = True
                form.previewed.data = digest
                if consent_catalogue.policy(db.session, form.version.data) is not None:
                    form.version.errors = [
                        f"Version {form.version.data} is published already: choose a new one"
                    ]
                    status, preview = 422, False
    return render_template(
        "staff/admin/policy_new.html",
        form=form,
        errors=error_list(form),
        current=current,
        preview=preview,
        diff=(
            catalogue.line_diff(current.text, form.text.data)
            if preview and current is not None
            else None
        ),
    ), status
