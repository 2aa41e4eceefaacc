"""Drafts: a campaign form kept as typed, edited until launch, and clones of campaigns.

A draft is a row of its own (:class:`~portal.campaigns.models.Draft`), never a campaign:
the engine's queries read only ``campaign``, so a draft has no deliveries and sends
nothing. Launching one goes through the campaign form's review and launch, which check
every rule again, and :func:`mark_launched` records the campaign it became.

Every save and the launch are one conditional UPDATE (``WHERE version = :seen AND
launched_campaign_id IS NULL``): a save from a tab opened before someone else's save or
launch changes nothing and says why, so an edit never undoes a launch and a launch never
goes out with text its launcher did not review.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign, Draft
from portal.consent.models import Topic
from portal.db import affected_rows, uuid7
from portal.errors import Conflict, NotFound, ValidationError
from portal.inputs import text_problem

# The campaign form's fields a draft keeps (the form's names, in its page order, which
# forms.FIELD_ORDER follows; every value a string).
FIELDS = (
    "topic",
    "title",
    "body",
    "url",
    "icon",
    "image",
    "badge",
    "action1_title",
    "action1_url",
    "action2_title",
    "action2_url",
    "require_interaction",
    "silent",
    "variant_b_title",
    "variant_b_body",
    "variant_b_image",
    "variant_c_title",
    "variant_c_body",
    "variant_c_image",
    "test_share",
    "winner_after_hours",
    "urgency",
    "ttl",
    "collapse_key",
    "schedule",
    "send_at",
    "timezone",
    "local_time",
    "fallback_zone",
    "deliver_until",
)
_MULTILINE = {"body", "variant_b_body", "variant_c_body"}
MAX_FIELD = 8192  # far above what a campaign can hold; a draft is not a file store
_t = cast(sa.Table, Draft.__table__)


def _clean(fields: dict[str, str | None]) -> dict[str, str]:
    return {name: str(fields.get(name) or "") for name in FIELDS}


def problems(fields: dict[str, str | None]) -> list[ValidationError]:
    """What stops a draft from being kept: unreadable text, no title, an absurd size.
    Every other rule waits for the review (a draft may be unfinished)."""
    found: list[ValidationError] = []
    kept = _clean(fields)
    for name, value in kept.items():
        problem = text_problem(value, multiline=name in _MULTILINE) if value else None
        if problem:
            found.append(ValidationError("invalid_text", f"This field {problem}", name))
        elif len(value) > MAX_FIELD:
            found.append(
                ValidationError("too_long", f"At most {MAX_FIELD} characters in a draft", name)
            )
    if not kept["title"].strip():
        found.append(ValidationError("missing_field", "Enter a title to save a draft", "title"))
    elif len(kept["title"]) > 200:
        found.append(
            ValidationError("too_long", "The title must be 200 characters or fewer", "title")
        )
    return found


def _first(found: list[ValidationError]) -> None:
    if found:
        raise found[0]


def create(
    session: Session,
    fields: dict[str, str | None],
    *,
    by: str,
    now: dt.datetime,
    cloned_from: uuid.UUID | None = None,
) -> Draft:
    _first(problems(fields))
    kept = _clean(fields)
    draft = Draft(
        id=uuid7(),
        fields=kept,
        title=kept["title"].strip(),
        version=1,
        created_by=by,
        created_at=now,
        updated_by=by,
        updated_at=now,
        cloned_from=cloned_from,
    )
    session.add(draft)
    session.flush()
    return draft


def get(session: Session, draft_id: uuid.UUID) -> Draft:
    draft = session.get(Draft, draft_id)
    if draft is None:
        raise NotFound("unknown_draft", "no such draft", "draft")
    return draft


def _refusal(session: Session, draft_id: uuid.UUID) -> Conflict | NotFound:
    """Why a conditional write of ``draft_id`` touched no row."""
    session.expire_all()
    draft = session.get(Draft, draft_id)
    if draft is None:
        return NotFound("unknown_draft", "no such draft", "draft")
    if draft.launched_campaign_id is not None:
        return Conflict(
            "draft_launched",
            f"This draft was launched by {draft.launched_by} meanwhile: it can no longer "
            "be changed. Clone the campaign to start a new draft from it",
            "draft",
        )
    return Conflict(
        "draft_changed",
        f"{draft.updated_by} saved this draft after you opened it: open it again to see "
        "their changes (yours are still in the form, not saved)",
        "draft",
    )


def save(
    session: Session,
    draft_id: uuid.UUID,
    seen_version: int,
    fields: dict[str, str | None],
    *,
    by: str,
    now: dt.datetime,
) -> Draft:
    """Replace a draft's fields, if it is still at ``seen_version`` and not launched."""
    _first(problems(fields))
    kept = _clean(fields)
    changed = affected_rows(
        session,
        sa.update(_t)
        .where(
            _t.c.id == draft_id,
            _t.c.version == seen_version,
            _t.c.launched_campaign_id.is_(None),
        )
        .values(
            fields=kept,
            title=kept["title"].strip(),
            version=_t.c.version + 1,
            updated_by=by,
            updated_at=now,
        ),
    )
    if changed != 1:
        raise _refusal(session, draft_id)
    session.expire_all()
    return get(session, draft_id)


def mark_launched(
    session: Session,
    draft_id: uuid.UUID,
    seen_version: int,
    campaign_id: uuid.UUID,
    *,
    by: str,
    now: dt.datetime,
) -> None:
    """Record that ``draft_id`` became ``campaign_id``: once, and only from the version
    the launcher reviewed. Call it in the transaction that creates the campaign."""
    changed = affected_rows(
        session,
        sa.update(_t)
        .where(
            _t.c.id == draft_id,
            _t.c.version == seen_version,
            _t.c.launched_campaign_id.is_(None),
        )
        .values(launched_campaign_id=campaign_id, launched_by=by, launched_at=now),
    )
    if changed != 1:
        raise _refusal(session, draft_id)


def variant_fields(kept: list[dict[str, str | None]] | None) -> dict[str, str | None]:
    """A campaign's variants B and C as the form's fields (empty where there is none)."""
    fields: dict[str, str | None] = {}
    for index, letter in enumerate("bc", start=1):
        variant = (kept or [])[index] if kept and index < len(kept) else {}
        for part in ("title", "body", "image"):
            fields[f"variant_{letter}_{part}"] = variant.get(part) or ""
    return fields


def fields_of(campaign: Campaign, topic: Topic) -> dict[str, str]:
    """A campaign's content as the form's fields: what a clone starts from. The schedule
    is "send now" and there is no "don't deliver after": the old times have passed."""
    actions = list(campaign.actions or [])
    pairs = [(a.get("title", ""), a.get("url", "")) for a in actions[:2]]
    pairs += [("", "")] * (2 - len(pairs))
    return _clean(
        {
            "topic": topic.slug,
            "title": campaign.title,
            "body": campaign.body,
            "url": campaign.url,
            "icon": campaign.icon,
            "image": campaign.image,
            "badge": campaign.badge,
            "action1_title": pairs[0][0],
            "action1_url": pairs[0][1],
            "action2_title": pairs[1][0],
            "action2_url": pairs[1][1],
            "require_interaction": "y" if campaign.require_interaction else "",
            "silent": "y" if campaign.silent else "",
            **variant_fields(campaign.variants),
            "test_share": str(campaign.test_share) if campaign.test_share else "",
            "winner_after_hours": (
                str(campaign.winner_after // 3600) if campaign.winner_after else ""
            ),
            "urgency": campaign.urgency,
            "ttl": str(campaign.ttl),
            "collapse_key": campaign.collapse_key,
            "schedule": "now",
            "send_at": "",
            "timezone": campaign.time_zone or "UTC",
            "local_time": campaign.local_time.strftime("%H:%M") if campaign.local_time else "",
            "fallback_zone": campaign.fallback_zone or "",
            "deliver_until": "",
        }
    )


def clone(session: Session, campaign_id: uuid.UUID, *, by: str, now: dt.datetime) -> Draft:
    """A new draft with ``campaign_id``'s content (any campaign, in any state)."""
    campaign = session.get(Campaign, campaign_id)
    if campaign is None:
        raise NotFound("unknown_campaign", "no such campaign", "campaign")
    topic = session.get(Topic, campaign.topic_id)
    assert topic is not None
    fields = fields_of(campaign, topic)
    if len(fields["title"]) > 200:  # cannot happen: a campaign's title is at most 200
        fields["title"] = fields["title"][:200]
    return create(session, dict(fields), by=by, now=now, cloned_from=campaign.id)


@dataclass(frozen=True)
class DraftRow:
    draft: Draft
    topic_label: str | None


def open_drafts(session: Session, *, limit: int = 50) -> list[DraftRow]:
    """Drafts not launched, the most recently saved first, with their topic's label."""
    found = session.scalars(
        sa.select(Draft)
        .where(Draft.launched_campaign_id.is_(None))
        .order_by(Draft.updated_at.desc(), Draft.id.desc())
        .limit(limit)
    ).all()
    slugs = {d.fields.get("topic", "") for d in found}
    labels = dict(
        session.execute(sa.select(Topic.slug, Topic.label).where(Topic.slug.in_(slugs))).all()
    )
    return [DraftRow(d, labels.get(d.fields.get("topic", ""))) for d in found]
