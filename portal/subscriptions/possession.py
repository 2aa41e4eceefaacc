"""An endpoint is an address, not a password (SPEC §4): who may act on a subscription.

An endpoint travels through push services, logs and feedback digests; knowing it must
reveal and change nothing. A request acts on a subscription only for the browser that
holds it, which shows one of two things:

- its device cookie (signed ``portal_device``) naming that very row, set when the
  browser registered it;
- the subscription's own ``auth`` secret — known only to the browser and to this portal,
  never to the push service — for a browser whose cookies were cleared. It is compared in
  constant time with the row's unsealed secret.

A tombstone has no secret left, so only its device cookie speaks for it. Every
endpoint-keyed route asks :func:`holds`; a request that cannot show either gets
:class:`NotYourSubscription`, the same answer whether or not the endpoint is known.
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass

from portal.errors import ApiError
from portal.subscriptions.sealing import KeyRing, SealBroken, UnknownKeyVersion
from portal.subscriptions.validation import validate_auth


@dataclass(frozen=True)
class Proof:
    """What a request shows: the subscription its device cookie names, an auth secret."""

    device_id: uuid.UUID | None = None
    auth: bytes | None = None


def proof_from(device_id: uuid.UUID | None, auth: object, field: str) -> Proof:
    """The proof a request carries; ``auth`` (optional) must be a well-formed secret."""
    return Proof(device_id, None if auth is None else validate_auth(auth, field))


def holds(
    proof: Proof,
    *,
    subscription_id: uuid.UUID,
    auth_sealed: bytes | None,
    auth_key_version: int,
    keys: KeyRing,
) -> bool:
    """True when the request holds this subscription (the one rule; see the module)."""
    if proof.device_id is not None and proof.device_id == subscription_id:
        return True
    if proof.auth is None or auth_sealed is None:
        return False
    try:
        stored = keys.open(bytes(auth_sealed), auth_key_version)
    except (UnknownKeyVersion, SealBroken):
        # A secret that cannot be opened proves nothing either way: refuse.
        return False
    return hmac.compare_digest(stored, proof.auth)


class NotYourSubscription(ApiError):
    """The request did not show that it holds the subscription it names (403). The
    answer for an endpoint nobody registered is the same, so it tells nothing."""

    status = 403

    def __init__(self, field: str) -> None:
        super().__init__(
            "not_your_subscription",
            "this browser has not shown that it holds this subscription",
            field,
        )
