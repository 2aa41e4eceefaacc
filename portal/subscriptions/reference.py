"""A person's short reference: eight characters of Crockford base32, shown as ``K7QM-3XPA``
on their own preference centre, for them to quote when they write to us.

It is a look-up key for staff and nothing more: random (it says nothing about the person),
stored once and never changed, unique (a unique index; a clash is drawn again), and never
accepted as proof of who anyone is — no route takes it in place of a cookie, link or
assertion. A person gets theirs the first time their preference centre shows it; erasure
removes it with the rest of their identifiers.

What people type back is read leniently, as Crockford meant: any case, dashes and spaces
anywhere, ``O`` for ``0`` and ``I`` or ``L`` for ``1``.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from typing import cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from portal.subscriptions.models import Subscriber

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford: no I, L, O or U
LENGTH = 8  # 40 bits: a clash is rare, and drawn again
ATTEMPTS = 8
_CONFUSED = str.maketrans({"O": "0", "I": "1", "L": "1"})
_SEPARATORS = str.maketrans("", "", "- \t_.")


def random_reference() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(LENGTH))


def normalise(text: str) -> str | None:
    """The stored form of a typed reference (``k7qm 3xpa`` → ``K7QM3XPA``), or None when
    the text cannot be one."""
    value = text.strip().upper().translate(_SEPARATORS).translate(_CONFUSED)
    if len(value) != LENGTH or any(char not in ALPHABET for char in value):
        return None
    return value


def display(reference: str) -> str:
    """``K7QM3XPA`` as people read it: ``K7QM-3XPA``."""
    half = LENGTH // 2
    return f"{reference[:half]}-{reference[half:]}"


def reference_for(
    session: Session,
    subscriber_id: uuid.UUID,
    *,
    draw: Callable[[], str] = random_reference,
) -> str:
    """The person's reference, given them now if they have none yet (in the caller's
    transaction). A drawn value another person holds is drawn again; a reference given by
    a concurrent request first is the one kept."""
    table = cast(sa.Table, Subscriber.__table__)
    for _ in range(ATTEMPTS):
        current = session.execute(
            sa.select(table.c.reference).where(table.c.id == subscriber_id)
        ).scalar_one()
        if current is not None:
            return str(current)
        candidate = draw()
        try:
            with session.begin_nested():
                session.execute(
                    sa.update(table)
                    .where(table.c.id == subscriber_id, table.c.reference.is_(None))
                    .values(reference=candidate)
                )
        except IntegrityError:
            continue  # someone else holds it: draw again
    raise RuntimeError(f"no free reference after {ATTEMPTS} draws")


def subscriber_by_reference(session: Session, text: str) -> uuid.UUID | None:
    """Whose reference ``text`` is, however it was typed; None when nobody's."""
    value = normalise(text)
    if value is None:
        return None
    return session.execute(
        sa.select(Subscriber.id).where(Subscriber.reference == value)
    ).scalar_one_or_none()
