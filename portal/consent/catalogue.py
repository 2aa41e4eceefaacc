"""The topic catalogue (two levels: category, topic) and the policy versions."""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import re
import threading
import time
import unicodedata
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from portal.consent.models import PolicyVersion, Topic
from portal.errors import Conflict, NotFound, ValidationError
from portal.inputs import text_problem

SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")


def add_topic(
    session: Session,
    *,
    slug: str,
    category: str,
    label: str,
    description: str = "",
    transactional: bool = False,
    default_state: str = "opt_out",
    new_category: bool | None = None,
    now: dt.datetime,
) -> Topic:
    """Add a topic after :func:`check_new_topic` (see it for ``new_category``)."""
    draft = check_new_topic(
        session,
        slug=slug,
        category=category,
        label=label,
        description=description,
        transactional=transactional,
        default_state=default_state,
        new_category=new_category,
    )
    position = session.execute(
        sa.select(sa.func.coalesce(sa.func.max(Topic.position), 0))
    ).scalar_one()
    topic = Topic(
        slug=draft.slug,
        category=draft.category,
        label=draft.label,
        description=draft.description,
        is_transactional=draft.transactional,
        default_state=draft.default_state,
        position=position + 1,
        created_at=now,
    )
    session.add(topic)
    session.flush()
    return topic


@dataclass(frozen=True)
class TopicDraft:
    """A topic as :func:`add_topic` would store it, every rule checked; nothing written."""

    slug: str
    category: str
    category_is_new: bool
    label: str
    description: str
    transactional: bool
    default_state: str


def check_new_topic(
    session: Session,
    *,
    slug: str,
    category: str,
    label: str,
    description: str = "",
    transactional: bool = False,
    default_state: str = "opt_out",
    new_category: bool | None = None,
) -> TopicDraft:
    """Every rule a new topic must meet, read in the caller's transaction; writes nothing.

    ``new_category``: True, the category is a new one (refused when one in use has the
    same name, whatever its capitals or spaces); False, it is one in use, named as the
    catalogue names it; None (seeds and fixtures), either. A name that is a category in
    use written differently ("news" beside "News") is refused in every case
    (:func:`category_for_new_topic`).
    """
    if not SLUG.fullmatch(slug) or len(slug) > 64:
        raise ValidationError(
            "invalid_slug",
            "a slug is lowercase words joined by hyphens, at most 64 characters",
            "slug",
        )
    if default_state not in ("opt_in", "opt_out"):
        raise ValidationError("invalid_default", "the default is opt_in or opt_out", "default")
    if not label.strip():
        raise ValidationError("missing_field", "the label is required", "label")
    _check_text(label=label, description=description)
    _check_lengths(label=label)
    _serialise_catalogue_writes(session)
    if session.scalars(sa.select(Topic).where(Topic.slug == slug)).first() is not None:
        raise Conflict(
            "slug_taken", f"topic {slug!r} exists already (slugs are never reused)", "slug"
        )
    known = category_names(all_topics(session))
    chosen = category_for_new_topic(category, known, new=new_category)
    return TopicDraft(
        slug=slug,
        category=chosen,
        category_is_new=category_key(chosen) not in known,
        label=label.strip(),
        description=description.strip(),
        transactional=transactional,
        default_state=default_state,
    )


# Any constant; names the advisory lock that orders topic creations on PostgreSQL, so two
# admins cannot both add "news" and "News" as new categories, or take one position. SQLite
# holds its write lock from BEGIN (portal.db), which orders them already.
_CATALOGUE_LOCK = 0x746F706963  # "topic"


def _serialise_catalogue_writes(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.select(sa.func.pg_advisory_xact_lock(_CATALOGUE_LOCK)))


# -- categories -----------------------------------------------------------------------------


def category_key(name: str) -> str:
    """What two category names are compared by: the same words, whatever their capitals,
    spacing, Unicode compatibility form or invisible format characters ("News", " news ",
    "NEWS", "News\u200b", "Ne\u00adws" are one category)."""
    visible = "".join(
        c for c in unicodedata.normalize("NFKC", name) if unicodedata.category(c) != "Cf"
    )
    return " ".join(visible.split()).casefold()


def category_names(topics: Sequence[Topic]) -> dict[str, str]:
    """Each category's key and the name it goes by, in page order.

    A database may hold near-duplicates written before categories were compared (topics
    under "News" and under "news"); their category cannot change, so nothing is rewritten:
    they are one category, named as its first active topic (in page order) spells it, or
    its first retired one when none is active. People see one heading by that name
    (:func:`by_category`), new topics can only choose that name, and the staff topic list
    warns of the other spellings (:func:`categories_in_use`).
    """
    names: dict[str, str] = {}
    ordered = sorted(topics, key=lambda t: (t.retired_at is not None, t.position, t.id or 0))
    for topic in ordered:
        names.setdefault(category_key(topic.category), topic.category)
    # Keep page order (first appearance), whatever the active-first choice of names.
    order = {category_key(t.category): i for i, t in reversed(list(enumerate(topics)))}
    return dict(sorted(names.items(), key=lambda item: order[item[0]]))


def category_for_new_topic(name: str, known: dict[str, str], *, new: bool | None) -> str:
    """The category a new topic goes under, as stored: the rule every caller uses (the
    staff form, ``portal topic add``, seeds). ``known`` is :func:`category_names` of every
    topic; ``new`` as in :func:`check_new_topic`."""
    field = "new_category" if new else "category"
    spelled = " ".join(name.split())
    if not spelled:
        raise ValidationError(
            "missing_field",
            "name the new category" if new else "choose a category",
            field,
        )
    problem = text_problem(name)
    if problem:
        raise ValidationError(
            "invalid_text", f"the {'new category' if new else 'category'} {problem}", field
        )
    _check_lengths(category=spelled, field=field)
    found = known.get(category_key(spelled))
    if new:
        if found is None:
            return spelled
        if found == spelled:
            raise Conflict(
                "category_exists",
                f'there is a category "{found}" already: choose it rather than adding it again',
                field,
            )
        raise Conflict(
            "category_exists",
            f'there is a category "{found}" already: choose "{found}" rather than adding '
            f'"{spelled}"',
            field,
        )
    if found is None:
        if new is None:
            return spelled
        raise ValidationError(
            "unknown_category",
            f'there is no category "{spelled}": choose one in use, or add it as a new category',
            field,
        )
    if found != spelled:
        raise Conflict(
            "category_near_duplicate",
            f'"{spelled}" is the category "{found}" written differently: choose "{found}"',
            field,
        )
    return found


@dataclass(frozen=True)
class CategoryInUse:
    """A category as the staff pages list it."""

    name: str
    topics: int  # every topic under it, retired ones included
    active: int
    other_spellings: tuple[str, ...]  # near-duplicates stored on some of its topics


def categories_in_use(session: Session) -> list[CategoryInUse]:
    """Every category of every topic (retired ones included), in page order."""
    topics = all_topics(session)
    found = []
    for key, name in category_names(topics).items():
        under = [t for t in topics if category_key(t.category) == key]
        spellings = tuple(dict.fromkeys(t.category for t in under if t.category != name))
        active = sum(1 for t in under if t.retired_at is None)
        found.append(CategoryInUse(name, len(under), active, spellings))
    return found


# The columns' sizes: refused here with a message rather than by the database.
CATEGORY_MAX = 64
LABEL_MAX = 120


def _check_text(**fields: str | None) -> None:
    """Words people read: no control characters (a description keeps its line breaks)."""
    for name, value in fields.items():
        problem = value and text_problem(value, multiline=name in _MULTILINE)
        if problem:
            raise ValidationError("invalid_text", f"the {name} {problem}", name)


_MULTILINE = frozenset({"description", "text"})


def _check_lengths(
    *, category: str | None = None, label: str | None = None, field: str = "category"
) -> None:
    if category is not None and len(category.strip()) > CATEGORY_MAX:
        raise ValidationError("too_long", f"a category is at most {CATEGORY_MAX} characters", field)
    if label is not None and len(label.strip()) > LABEL_MAX:
        raise ValidationError("too_long", f"a label is at most {LABEL_MAX} characters", "label")


def edit_topic(session: Session, slug: str, *, label: str, description: str) -> Topic:
    """Only the wording changes. Slug, category, class and default are fixed at creation:
    people agreed to a topic as it was defined, so a different one is a new topic."""
    topic = topic_by_slug(session, slug)
    if topic.retired_at is not None:
        raise Conflict("topic_retired", f"topic {slug!r} is retired and cannot change", "slug")
    if not label.strip():
        raise ValidationError("missing_field", "the label is required", "label")
    _check_text(label=label, description=description)
    _check_lengths(label=label)
    topic.label = label.strip()
    topic.description = description.strip()
    session.flush()
    return topic


def topic_by_slug(session: Session, slug: str) -> Topic:
    topic = session.scalars(sa.select(Topic).where(Topic.slug == slug)).first()
    if topic is None:
        raise NotFound("unknown_topic", f"no topic {slug!r}", "slug")
    return topic


def retire_topic(session: Session, slug: str, *, now: dt.datetime) -> Topic:
    """Retiring hides the topic from pages and audiences; every row about it stays."""
    topic = topic_by_slug(session, slug)
    if topic.retired_at is None:
        topic.retired_at = now
    return topic


def active_topics(session: Session) -> Sequence[Topic]:
    return session.scalars(
        sa.select(Topic).where(Topic.retired_at.is_(None)).order_by(Topic.position, Topic.id)
    ).all()


# Built once: read by every consent write (see topics_for_write).
_TOPICS_FOR_WRITE = (
    sa.select(Topic)
    .where(Topic.retired_at.is_(None))
    .order_by(Topic.position, Topic.id)
    .with_for_update(read=True)
    .execution_options(populate_existing=True)
)


# The current policy's version alone (not its text): what a page's consent write records.
_CURRENT_VERSION = (
    sa.select(PolicyVersion.version)
    .order_by(PolicyVersion.published_at.desc(), PolicyVersion.version.desc())
    .limit(1)
)
# Built once: _TOPICS_FOR_WRITE, each row carrying the current policy's version, so that
# a page's save reads both in one statement (the subquery's table is not locked).
_WRITE_BASIS = _TOPICS_FOR_WRITE.add_columns(
    _CURRENT_VERSION.scalar_subquery().label("current_version")
)


@dataclass(frozen=True)
class WriteBasis:
    """What a consent write from a page decides against, as committed now."""

    policy_version: str | None  # the current policy's; None before any is published
    topics: dict[str, Topic]  # the active topics by slug (see topics_for_write)

    @property
    def active(self) -> list[Topic]:
        """The active topics in page order."""
        return list(self.topics.values())


def write_basis(session: Session) -> WriteBasis:
    """The current policy version and the active topics, read (and the topics locked) as
    :func:`current_policy` and :func:`topics_for_write` do, in one statement when any
    topic is active. A shared copy of :func:`current` that differs is forgotten."""
    rows = session.execute(_WRITE_BASIS).all()
    version = rows[0][1] if rows else session.scalar(_CURRENT_VERSION)
    topics = {topic.slug: topic for topic, _ in rows}
    _forget_if_behind(session, topics, version)
    return WriteBasis(version, topics)


_UNREAD = object()  # a policy version not read by the caller


def _forget_if_behind(
    session: Session, topics: dict[str, Topic], policy_version: object = _UNREAD
) -> None:
    """Forget the pages' shared copy of :func:`current` when the topics just read as
    committed (and the policy version, when read) are not the ones it holds: the next
    page reads the catalogue afresh."""
    shown = _cached.get(session.get_bind())  # type: ignore[arg-type]
    if shown is not None and (
        {t.slug for t in shown.topics} != topics.keys()
        or (
            policy_version is not _UNREAD
            and (shown.policy and shown.policy.version) != policy_version
        )
    ):
        forget(session)


def topics_for_write(session: Session) -> dict[str, Topic]:
    """The active topics by slug as committed now, read in the caller's transaction: the
    topics a consent write may name. Never the shared copy of :func:`current`, which may be
    a few seconds old.

    On PostgreSQL the rows stay locked FOR SHARE until the transaction ends, so a retire
    in another process either committed before this read (and the topic is not here) or
    waits until this write has committed; on SQLite every transaction holds the write lock
    from its start (``portal.db``), so no retire can commit in between either way.
    """
    rows = session.scalars(_TOPICS_FOR_WRITE).all()
    found = {topic.slug: topic for topic in rows}
    _forget_if_behind(session, found)
    return found


def retired_labels(session: Session, slugs: set[str]) -> list[str]:
    """The labels of the retired topics among ``slugs``, in page order (a form may name
    anything: slugs of no topic are left out, and text no slug could be, such as a NUL
    byte PostgreSQL refuses, never reaches the query)."""
    wellformed = sorted(slug for slug in slugs if len(slug) <= 64 and SLUG.fullmatch(slug))
    if not wellformed:
        return []
    return list(
        session.scalars(
            sa.select(Topic.label)
            .where(Topic.slug.in_(wellformed), Topic.retired_at.is_not(None))
            .order_by(Topic.position, Topic.id)
        )
    )


def all_topics(session: Session) -> Sequence[Topic]:
    return session.scalars(sa.select(Topic).order_by(Topic.position, Topic.id)).all()


@dataclass(frozen=True)
class Category:
    name: str
    topics: list[Topic]


def by_category(topics: Sequence[Topic]) -> list[Category]:
    """Categories in the order their first topic appears, near-duplicates under one
    heading (:func:`category_names`)."""
    names = category_names(topics)
    groups: dict[str, list[Topic]] = {}
    for topic in topics:
        groups.setdefault(category_key(topic.category), []).append(topic)
    return [Category(names[key], items) for key, items in groups.items()]


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def publish_policy(session: Session, *, version: str, text: str, now: dt.datetime) -> PolicyVersion:
    if not VERSION.fullmatch(version):
        raise ValidationError(
            "invalid_version", "a version is 1–32 letters, digits, '.', '_' or '-'", "version"
        )
    if not text.strip():
        raise ValidationError("missing_field", "the policy text is empty", "text")
    _check_text(text=text)
    if session.get(PolicyVersion, version) is not None:
        raise Conflict(
            "version_taken", f"policy {version!r} is published already and immutable", "version"
        )
    policy = PolicyVersion(
        version=version, published_at=now, text=text, text_sha256=text_digest(text)
    )
    session.add(policy)
    session.flush()
    return policy


# Built once: read by every save (see current_policy).
_CURRENT_POLICY = (
    sa.select(PolicyVersion)
    .order_by(PolicyVersion.published_at.desc(), PolicyVersion.version.desc())
    .limit(1)
)


def current_policy(session: Session) -> PolicyVersion | None:
    return session.scalars(_CURRENT_POLICY).first()


def policy(session: Session, version: str) -> PolicyVersion | None:
    """The published version named, or None; a name no version could have (a NUL byte,
    which PostgreSQL refuses in a query) is None without asking the database."""
    if not VERSION.fullmatch(version):
        return None
    return session.get(PolicyVersion, version)


def policy_in_force(session: Session, at: dt.datetime) -> PolicyVersion | None:
    """The version in force at ``at``: the last one published by then."""
    return session.scalars(
        sa.select(PolicyVersion)
        .where(PolicyVersion.published_at <= at)
        .order_by(PolicyVersion.published_at.desc(), PolicyVersion.version.desc())
        .limit(1)
    ).first()


def all_policies(session: Session) -> Sequence[PolicyVersion]:
    """Newest first, in the order :func:`current_policy` picks the current one."""
    return session.scalars(
        sa.select(PolicyVersion).order_by(
            PolicyVersion.published_at.desc(), PolicyVersion.version.desc()
        )
    ).all()


def previous_policy(session: Session, version: PolicyVersion) -> PolicyVersion | None:
    """The version published just before ``version``."""
    return session.scalars(
        sa.select(PolicyVersion)
        .where(
            sa.or_(
                PolicyVersion.published_at < version.published_at,
                sa.and_(
                    PolicyVersion.published_at == version.published_at,
                    PolicyVersion.version < version.version,
                ),
            )
        )
        .order_by(PolicyVersion.published_at.desc(), PolicyVersion.version.desc())
        .limit(1)
    ).first()


# What changed between two notice texts: a short line diff, for people to read.
DIFF_MAX_LINES = 12
DIFF_LINE_MAX_CHARS = 300


@dataclass(frozen=True)
class ChangedLine:
    added: bool  # False: removed
    text: str


@dataclass(frozen=True)
class PolicyDiff:
    old: PolicyVersion
    new: PolicyVersion
    lines: tuple[ChangedLine, ...]
    more: int  # changed lines left out to keep the summary short


def policy_diff(old: PolicyVersion, new: PolicyVersion) -> PolicyDiff:
    """The lines removed from ``old``'s text and added in ``new``'s, in order, at most
    :data:`DIFF_MAX_LINES` of them and each cut to :data:`DIFF_LINE_MAX_CHARS`
    characters (the full texts are on their own pages). Plain text: the template
    escapes it."""
    before, after = old.text.splitlines(), new.text.splitlines()
    changed: list[ChangedLine] = []
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, old_from, old_to, new_from, new_to in matcher.get_opcodes():
        if tag == "equal":
            continue
        # Within each change, what went before what came in its place.
        changed += [ChangedLine(False, _cut(line)) for line in before[old_from:old_to]]
        changed += [ChangedLine(True, _cut(line)) for line in after[new_from:new_to]]
    changed = [line for line in changed if line.text]
    shown = changed[:DIFF_MAX_LINES]
    return PolicyDiff(old, new, tuple(shown), len(changed) - len(shown))


def _cut(line: str) -> str:
    line = line.strip()
    if len(line) <= DIFF_LINE_MAX_CHARS:
        return line
    return line[: DIFF_LINE_MAX_CHARS - 1].rstrip() + "…"


# The catalogue as the public pages see it --------------------------------------------------

# How long a process may show the catalogue and current policy it read last, when they
# were changed elsewhere (another worker's staff page, the ``portal topic`` CLI, another
# host). A change committed through this process's own sessions shows at once. Pages only:
# a write checks the topics it names with :func:`topics_for_write`.
CATALOGUE_TTL_SECONDS = 5.0


@dataclass(frozen=True)
class Catalogue:
    """The active topics (in page order) and the current policy, read together.

    The objects are copies in no session, shared between requests and threads: read
    them, never change them or add them to a session.
    """

    topics: tuple[Topic, ...]
    policy: PolicyVersion | None
    generation: int
    read_at: float


class _Generation:
    """Counts committed catalogue changes made in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def bump(self) -> None:
        with self._lock:
            self.value += 1


_generation = _Generation()
_cached: weakref.WeakKeyDictionary[Engine, Catalogue] = weakref.WeakKeyDictionary()
_CHANGED = "portal.catalogue_changed"


def current(session: Session) -> Catalogue:
    """The active topics and current policy, read at most every
    :data:`CATALOGUE_TTL_SECONDS` per process (and at once after a change made here)."""
    engine = session.get_bind()
    now = time.monotonic()
    found = _cached.get(engine)  # type: ignore[arg-type]
    if (
        found is not None
        and found.generation == _generation.value
        and now - found.read_at < CATALOGUE_TTL_SECONDS
    ):
        return found
    generation = _generation.value  # before reading: a change during the read shows next time
    policy = current_policy(session)
    found = Catalogue(
        tuple(_copy(t) for t in active_topics(session)),
        None if policy is None else _copy(policy),
        generation,
        now,
    )
    _cached[engine] = found  # type: ignore[index]
    return found


_Row = TypeVar("_Row", Topic, PolicyVersion)


def _copy(item: _Row) -> _Row:
    """A copy in no session: the session's own object stays the session's."""
    columns = sa.inspect(type(item)).column_attrs
    return type(item)(**{column.key: getattr(item, column.key) for column in columns})


def forget(session: Session) -> None:
    """Read the catalogue afresh next time (e.g. a newer policy was seen in the database)."""
    _cached.pop(session.get_bind(), None)  # type: ignore[arg-type]


@event.listens_for(Session, "after_flush")
def _note_catalogue_change(session: Session, _context: Any) -> None:
    if any(
        isinstance(item, Topic | PolicyVersion)
        for item in (*session.new, *session.dirty, *session.deleted)
    ):
        session.info[_CHANGED] = True


@event.listens_for(Session, "after_commit")
def _catalogue_committed(session: Session) -> None:
    if session.info.pop(_CHANGED, False):
        _generation.bump()


@event.listens_for(Session, "after_soft_rollback")
def _catalogue_rolled_back(session: Session, _previous: Any) -> None:
    if not session.in_transaction():
        session.info.pop(_CHANGED, None)
