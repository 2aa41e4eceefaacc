"""The topic catalogue and policy versions as admins change them: every change audited.

The rules live in :mod:`portal.consent.catalogue`; this adds who did it, in the same
transaction, and the line diff an admin reads before publishing a new notice text.
"""

from __future__ import annotations

import datetime as dt
import difflib
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from portal.consent import catalogue
from portal.consent.models import PolicyVersion, Topic
from portal.staff import audit


class Action:
    TOPIC_CREATED = "topic.created"
    TOPIC_EDITED = "topic.edited"
    TOPIC_RETIRED = "topic.retired"
    POLICY_PUBLISHED = "policy.published"


audit.register_action(Action.TOPIC_CREATED, "Topic created")
audit.register_action(Action.TOPIC_EDITED, "Topic edited")
audit.register_action(Action.TOPIC_RETIRED, "Topic retired")
audit.register_action(Action.POLICY_PUBLISHED, "Policy version published")


def topic_target(slug: str) -> str:
    return f"topic:{slug}"


def create_topic(
    session: Session,
    *,
    actor: audit.AnyActor,
    slug: str,
    category: str,
    label: str,
    description: str,
    transactional: bool,
    default_state: str,
    new_category: bool,
    now: dt.datetime,
) -> Topic:
    """Add a topic (the rules: :func:`portal.consent.catalogue.check_new_topic`)."""
    topic = catalogue.add_topic(
        session,
        slug=slug,
        category=category,
        label=label,
        description=description,
        transactional=transactional,
        default_state=default_state,
        new_category=new_category,
        now=now,
    )
    audit.record(
        session,
        actor,
        Action.TOPIC_CREATED,
        topic_target(topic.slug),
        {
            "category": topic.category,
            "label": topic.label,
            "class": "transactional" if topic.is_transactional else "marketing",
            "default": topic.default_state,
        },
        at=now,
    )
    return topic


def edit_topic(
    session: Session,
    *,
    actor: audit.AnyActor,
    slug: str,
    label: str,
    description: str,
    now: dt.datetime,
) -> bool:
    """Change a topic's wording; False (and no audit row) when nothing changed."""
    topic = catalogue.topic_by_slug(session, slug)
    before = {"label": topic.label, "description": topic.description}
    catalogue.edit_topic(session, slug, label=label, description=description)
    after = {"label": topic.label, "description": topic.description}
    changes = {
        name: {"from": before[name], "to": after[name]}
        for name in before
        if before[name] != after[name]
    }
    if not changes:
        return False
    audit.record(session, actor, Action.TOPIC_EDITED, topic_target(slug), changes, at=now)
    return True


def retire_topic(session: Session, *, actor: audit.AnyActor, slug: str, now: dt.datetime) -> bool:
    """Retire (never delete); False when it was retired already."""
    topic = catalogue.topic_by_slug(session, slug)
    if topic.retired_at is not None:
        return False
    catalogue.retire_topic(session, slug, now=now)
    audit.record(session, actor, Action.TOPIC_RETIRED, topic_target(slug), at=now)
    return True


# -- policy versions ------------------------------------------------------------------------


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "same" | "added" | "removed"
    old_number: int | None
    new_number: int | None
    text: str


@dataclass(frozen=True)
class DiffHunk:
    lines: list[DiffLine]
    skipped_before: int  # unchanged lines left out before this hunk


@dataclass(frozen=True)
class LineDiff:
    hunks: list[DiffHunk] = field(default_factory=list)
    added: int = 0
    removed: int = 0
    skipped_after: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


def line_diff(old: str, new: str, *, context: int = 3) -> LineDiff:
    """A line diff (difflib) in hunks with ``context`` unchanged lines around changes."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    hunks: list[DiffHunk] = []
    added = removed = 0
    shown_through = 0  # old lines up to here are shown or accounted for
    for group in matcher.get_grouped_opcodes(context):
        lines: list[DiffLine] = []
        first_old = group[0][1]
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines.extend(
                    DiffLine("same", i + 1, j + 1, old_lines[i])
                    for i, j in zip(range(i1, i2), range(j1, j2), strict=True)
                )
                continue
            if tag in ("replace", "delete"):
                lines.extend(DiffLine("removed", i + 1, None, old_lines[i]) for i in range(i1, i2))
                removed += i2 - i1
            if tag in ("replace", "insert"):
                lines.extend(DiffLine("added", None, j + 1, new_lines[j]) for j in range(j1, j2))
                added += j2 - j1
        hunks.append(DiffHunk(lines, first_old - shown_through))
        shown_through = group[-1][2]
    if not hunks:
        return LineDiff()
    return LineDiff(hunks, added, removed, len(old_lines) - shown_through)


def publish_policy(
    session: Session,
    *,
    actor: audit.AnyActor,
    version: str,
    text: str,
    now: dt.datetime,
) -> PolicyVersion:
    previous = catalogue.current_policy(session)
    policy = catalogue.publish_policy(session, version=version, text=text, now=now)
    detail: dict[str, Any] = {"sha256": policy.text_sha256, "previous": None}
    if previous is not None:
        diff = line_diff(previous.text, text)
        detail = {
            **detail,
            "previous": previous.version,
            "lines_added": diff.added,
            "lines_removed": diff.removed,
        }
    audit.record(
        session, actor, Action.POLICY_PUBLISHED, f"policy:{policy.version}", detail, at=now
    )
    return policy


def normalise_text(text: str) -> str:
    """Browsers submit textarea line breaks as CRLF; the stored text uses LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")
