"""Consent receipts: a person's choices, signed, each with its proof in the consent log.

A receipt carries the fields of ISO/IEC TS 27560 and the Kantara consent receipt that a
push preference centre has: the controller and jurisdiction, the person (their random
subscriber id and the reference they quote), each notice version cited with the SHA-256
of its text, and each topic as a purpose with its state, the time it was chosen, how and
under which notice. Every explicit choice names the consent event that recorded it; the
receipt carries that event's canonical bytes and its RFC 9162 inclusion proof
(``{"leaf_hash", "leaf_index", "audit_path"}``) against a signed tree head in RFC 6962's
shape, so it can be checked without the portal: ``portal.consent.receipt_check`` (also
``tools/verify_receipt.py``). The whole receipt is signed with the consent log's key,
after the domain-separation prefix ``receipt_check.SIGNATURE_CONTEXT`` (a tree head's
signed bytes start with 0x00: the two can never be confused).

What it reveals is the person's own: their events, and hashes of the tree's other nodes.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.orm import Session

from portal.consent import catalogue, merkle, tree
from portal.consent.log import canonical, iso, row_fields
from portal.consent.models import ConsentEvent, ConsentLogState, Topic
from portal.consent.preferences import effective_state, preference_rows
from portal.consent.receipt_check import ALGORITHM, FORMAT, expected_state, signed_bytes
from portal.subscriptions.models import Subscriber
from portal.subscriptions.reference import display as display_reference

_e = cast(sa.Table, ConsentEvent.__table__)
_st = cast(sa.Table, ConsentLogState.__table__)


@dataclass(frozen=True)
class Controller:
    """Who the receipt names as collecting the consent, and under which law."""

    name: str
    contact: str | None
    url: str | None
    jurisdiction: str | None

    @classmethod
    def from_settings(cls, settings: Any, base_url: str) -> Controller:
        public = settings.public_url or base_url.rstrip("/")
        host = urlsplit(public).hostname if public else None
        return cls(
            name=settings.consent_controller_name or host or "the operator of this portal",
            contact=settings.consent_controller_contact,
            url=public or None,
            jurisdiction=settings.consent_jurisdiction,
        )


class NotYetInTheLog(Exception):
    """An event of the person's is committed but not yet in the signed tree (the sequencer
    waits on an earlier number): the receipt can be had a moment later."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _head_covering(
    session: Session,
    seq: int,
    key: ed25519.Ed25519PrivateKey,
    *,
    now: dt.datetime,
    gap_grace_seconds: float,
) -> merkle.TreeHead:
    """The latest signed head, once the tree holds event ``seq`` (integrating now what
    the sequencer would within its merge delay)."""
    size = session.execute(sa.select(_st.c.tree_size).where(_st.c.id == 1)).scalar()
    if size is None or size < seq or tree.latest_head(session) is None:
        # Only as far as this person's events: the sequencer does the rest.
        tree.integrate(
            session,
            key,
            now=now,
            gap_grace_seconds=gap_grace_seconds,
            max_leaves=max(seq - (size or 0), 1),
        )
        session.commit()
    head = tree.latest_head(session)
    if head is None or head.tree_size < seq:
        raise NotYetInTheLog(f"event {seq} is not in the consent log's tree yet")
    return head


def build_receipt(
    session: Session,
    subscriber: Subscriber,
    topics: Sequence[Topic],
    *,
    key: ed25519.Ed25519PrivateKey,
    controller: Controller,
    policy_url: Callable[[str], str],
    now: dt.datetime,
    gap_grace_seconds: float,
) -> dict[str, Any]:
    """The signed receipt of ``subscriber``'s choices on ``topics`` (the centre's topics).

    Commits when it had to bring the tree up to the person's events first.
    """
    rows = preference_rows(session, subscriber.id)
    wanted = [rows[topic.id].event_seq for topic in topics if topic.id in rows]
    # Each event's fields as its canonical bytes spell them: the receipt says the same.
    events = {
        int(row.seq): row_fields(row)
        for row in session.execute(sa.select(_e).where(_e.c.seq.in_(wanted))).all()
    }
    head = _head_covering(
        session,
        max(wanted, default=0),
        key,
        now=now,
        gap_grace_seconds=gap_grace_seconds,
    )
    purposes = []
    for topic in topics:
        row = rows.get(topic.id)
        effective = effective_state(row.state if row else None, topic, subscriber.region_code)
        purpose: dict[str, Any] = {
            "purpose_id": topic.slug,
            "topic_id": topic.id,
            "purpose": topic.label,
            "description": topic.description,
            "category": topic.category,
            "transactional": topic.is_transactional,
            "on": effective.on,
            "basis": effective.reason.value,
        }
        event = events.get(row.event_seq) if row is not None else None
        if row is None or event is None or not effective.explicit:
            purpose.update(
                state="not_given",
                consent_type="none",
                event_seq=None,
                policy_version=None,
                consent_timestamp=None,
            )
        else:
            purpose.update(
                state=expected_state(event["previous_state"], event["new_state"]),
                consent_type="explicit",
                event_seq=event["seq"],
                policy_version=event["policy_version"],
                consent_timestamp=event["decided_at"],
                recorded_at=event["recorded_at"],
                source=event["source"],
            )
        purposes.append(purpose)
    named = sorted({p["event_seq"] for p in purposes if p["event_seq"] is not None})
    proofs = []
    for seq in named:
        text = canonical(events[seq])
        proof = tree.inclusion(session, seq - 1, head.tree_size)
        proofs.append(
            {
                "seq": seq,
                "event": text.decode("ascii"),
                "leaf_hash": _b64(merkle.leaf_hash(text)),
                "leaf_index": proof.leaf_index,
                "audit_path": [_b64(value) for value in proof.audit_path],
            }
        )
    versions = sorted({p["policy_version"] for p in purposes if p["policy_version"]})
    notices = []
    for version in versions:
        policy = catalogue.policy(session, version)
        if policy is None:  # pragma: no cover - an event's notice version always exists
            continue
        notices.append(
            {
                "policy_version": version,
                "sha256": policy.text_sha256,
                "published_at": iso(policy.published_at),
                "url": policy_url(version),
            }
        )
    log_key = merkle.public_key_bytes(key.public_key())
    receipt: dict[str, Any] = {
        "format": FORMAT,
        "receipt_id": str(uuid.uuid4()),
        "issued_at": iso(now),
        "language": "en",
        "jurisdiction": controller.jurisdiction,
        "controller": {
            "name": controller.name,
            "contact": controller.contact,
            "url": controller.url,
        },
        "pii_principal": {
            "subscriber_id": str(subscriber.id),
            "reference": display_reference(subscriber.reference) if subscriber.reference else None,
            "region": subscriber.region_code,
        },
        "collection_method": "web push preference centre and subscribe page",
        "notices": notices,
        "purposes": purposes,
        "events": proofs,
        "tree_head": head.to_json(),
        # The key that signed the head: the log key, or its predecessor when the key
        # changed since the head was signed (this receipt's signature vouches for it).
        "tree_head_key": _b64(tree.head_public_key(session, head.tree_size) or log_key),
        "log_key": _b64(log_key),
        "signature_algorithm": ALGORITHM,
    }
    receipt["signature"] = _b64(key.sign(signed_bytes(receipt)))
    return receipt


def receipt_bytes(receipt: dict[str, Any]) -> bytes:
    """The file a person downloads: readable, and checked from its parsed content."""
    return (json.dumps(receipt, indent=2, ensure_ascii=False, sort_keys=True) + "\n").encode()
