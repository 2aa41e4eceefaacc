"""The JSON API's OpenAPI 3.1 document, built from the settings it describes.

Limits that come from configuration (body size, endpoint length, the signature header)
are read from :class:`~portal.config.Settings`, so the document served is the contract
of the running instance. ``tests/api`` keeps it true: every ``/api/`` route is described,
and real answers validate against it.
"""

from __future__ import annotations

from enum import EnumType
from typing import Any

from flask import Blueprint, Response, jsonify

from portal.consent.models import PreferenceState
from portal.consent.preferences import Reason
from portal.consent.sources import ROUTE_SOURCES
from portal.delivery.models import ReceiptEvent
from portal.seams import current_portal
from portal.subscriptions.models import SubscriptionState

bp = Blueprint("openapi", __name__, url_prefix="/api")

JsonSchema = dict[str, Any]

# Base64url without padding of 65 and 16 bytes: 87 and 22 characters.
_P256DH = "^[A-Za-z0-9_-]{87}$"
_AUTH = "^[A-Za-z0-9_-]{22}$"
_MAX_EXPIRATION_MS = 32503680000000  # 3000-01-01, as portal.subscriptions.validation
_FEEDBACK_ORGANIZATION_MAX = 128


def _ref(name: str) -> JsonSchema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: JsonSchema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": _json(_ref("Error"))}


def _values(*members: Any) -> list[str]:
    """The string values of an enum's members, or of the members given."""
    if len(members) == 1 and isinstance(members[0], EnumType):
        members = tuple(members[0])
    return [member.value for member in members]


def _object(properties: dict[str, JsonSchema], required: list[str]) -> JsonSchema:
    return {"type": "object", "properties": properties, "required": required}


def _auth(whose: str) -> JsonSchema:
    return {
        "type": "string",
        "pattern": _AUTH,
        "description": f"The auth secret of {whose} (its keys.auth): proof that this "
        "browser holds it, for a browser without its portal_device cookie.",
    }


def _sources(route: str) -> JsonSchema:
    return {"enum": _values(*ROUTE_SOURCES[route]), "description": "Who calls (default api)."}


_BASE64_32: JsonSchema = {"type": "string", "pattern": "^[A-Za-z0-9+/]{43}=$"}
_SIZE_RULE = "a whole number from 0 to 2^64 - 1"


def _size_parameter(name: str, where: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": True,
        "description": description,
        "schema": {"type": "string", "pattern": "^0*[0-9]{1,20}$"},  # leading zeros allowed
    }


def _consent_log_paths() -> dict[str, Any]:
    """The consent log's public evidence (portal/consent/log_api.py): GET only, no cookies."""
    bad = _error(f"A parameter is missing or not {_SIZE_RULE} (invalid_parameter).")
    return {
        "/api/consent-log/tree-head": {
            "get": {
                "summary": "The consent log's latest signed tree head.",
                "responses": {
                    "200": _ok("The latest head.", "TreeHead"),
                    "404": _error("No head has been signed yet (no_tree_head)."),
                },
            }
        },
        "/api/consent-log/tree-head/{size}": {
            "get": {
                "summary": "The signed tree head of a past size (every size the log had).",
                "parameters": [_size_parameter("size", "path", "The tree size.")],
                "responses": {
                    "200": _ok("The head of that size.", "TreeHead"),
                    "400": bad,
                    "404": _error("The log never had a head of that size (unknown_tree_size)."),
                },
            }
        },
        "/api/consent-log/consistency": {
            "get": {
                "summary": "A consistency proof between two tree sizes (RFC 9162 §2.1.4).",
                "parameters": [
                    _size_parameter("from", "query", "The first tree size, at least 1."),
                    _size_parameter(
                        "to", "query", "The second tree size: at least from, at most the latest."
                    ),
                ],
                "responses": {
                    "200": _ok("The proof.", "ConsistencyProof"),
                    "400": bad,
                    "404": _error("to is beyond the latest signed head (unknown_tree_size)."),
                },
            }
        },
        "/api/consent-log/inclusion": {
            "get": {
                "summary": "The inclusion proof of a leaf in a tree size (RFC 9162 §2.1.3).",
                "parameters": [
                    {
                        "name": "leaf",
                        "in": "query",
                        "required": True,
                        "description": "The RFC 9162 leaf hash: SHA-256(0x00 ‖ the event's "
                        "canonical bytes), base64 ('+' sent as %2B), base64url or hex.",
                        "schema": {"type": "string"},
                    },
                    _size_parameter("size", "query", "The tree size, at most the latest."),
                ],
                "responses": {
                    "200": _ok("The proof.", "InclusionProof"),
                    "400": bad,
                    "404": _error(
                        "size is beyond the latest signed head (unknown_tree_size), or the "
                        "leaf is not in the tree of that size (unknown_leaf)."
                    ),
                },
            }
        },
        "/api/consent-log/key": {
            "get": {
                "summary": "The consent log's public key, to check tree head signatures.",
                "responses": {
                    "200": _ok("The key.", "LogKey"),
                    "404": _error("This deployment has no log key (no_log_key)."),
                },
            }
        },
    }


def _schemas(endpoint_max: int, decided_at_skew: int) -> dict[str, JsonSchema]:
    endpoint = {"type": "string", "minLength": 1, "maxLength": endpoint_max}
    states = _values(SubscriptionState)
    return {
        "Error": {
            "type": "object",
            "description": "Every refusal: a machine-readable code, a message, and the "
            "field at fault when there is one.",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "pattern": "^[a-z0-9_]+$"},
                        "message": {"type": "string", "minLength": 1},
                        "field": {"type": "string", "minLength": 1},
                    },
                    "required": ["code", "message"],
                    "additionalProperties": False,
                }
            },
            "required": ["error"],
            "additionalProperties": False,
        },
        "PushSubscription": {
            "type": "object",
            "description": "A browser PushSubscription's toJSON() form. The endpoint must "
            "be an https:// URL on an allowed push service with a registration path; it is "
            "stored in its canonical spelling (scheme and host lower-case, no default port, "
            "fragment or empty query).",
            "properties": {
                "endpoint": {**endpoint, "pattern": "^[Hh][Tt][Tt][Pp][Ss]://"},
                "expirationTime": {
                    "type": ["number", "null"],
                    "minimum": 0,
                    "exclusiveMaximum": _MAX_EXPIRATION_MS,
                    "description": "Unix time in milliseconds, or null.",
                },
                "keys": {
                    "type": "object",
                    "properties": {
                        "p256dh": {
                            "type": "string",
                            "pattern": _P256DH,
                            "description": "Canonical base64url (no padding) of an "
                            "uncompressed P-256 point (65 bytes, first byte 0x04).",
                        },
                        "auth": {
                            "type": "string",
                            "pattern": _AUTH,
                            "description": "Canonical base64url (no padding) of 16 bytes.",
                        },
                    },
                    "required": ["p256dh", "auth"],
                },
            },
            "required": ["endpoint", "keys"],
        },
        "SubscribeRequest": _object(
            {
                "subscription": _ref("PushSubscription"),
                "source": _sources("subscribe"),
                "topics": {
                    "type": ["array", "null"],
                    "items": {"type": "string"},
                    "uniqueItems": True,
                    "description": "Active topic slugs chosen on the subscribe page; "
                    "needs policyVersion.",
                },
                "policyVersion": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "description": "The published notice version the page showed; the "
                    "permission grant and the subscription are recorded against it.",
                },
                "timeZone": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "maxLength": 64,
                    "description": "The browser's time zone (Intl.DateTimeFormat()."
                    "resolvedOptions().timeZone): a zone of the IANA database; an old name "
                    "is stored as its canonical zone, anything else is 422 "
                    "invalid_time_zone and nothing is written.",
                },
            },
            ["subscription"],
        ),
        "Subscription": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "state": {"enum": states},
                "inserted": {"type": "boolean"},
            },
            "required": ["id", "state", "inserted"],
            "additionalProperties": False,
        },
        "EndpointRequest": _object(
            {"endpoint": endpoint, "auth": _auth("the subscription at endpoint")}, ["endpoint"]
        ),
        "UnsubscribeRequest": _object(
            {
                "endpoint": endpoint,
                "auth": _auth("the subscription at endpoint"),
                "source": _sources("unsubscribe"),
            },
            ["endpoint"],
        ),
        "Heartbeat": {
            "type": "object",
            "properties": {
                "state": {"enum": ["unknown", *states]},
                "action": {"enum": ["none", "resubscribe", "unsubscribe"]},
            },
            "required": ["state", "action"],
            "additionalProperties": False,
        },
        "DeviceStatus": {
            "type": "object",
            "properties": {
                "status": {"enum": ["receiving", "stopped", "erased", "expired", "unknown"]},
                "action": {"enum": ["none", "resubscribe", "unsubscribe"]},
            },
            "required": ["status", "action"],
            "additionalProperties": False,
        },
        "ChangeRequest": _object(
            {
                "oldEndpoint": endpoint,
                "oldAuth": _auth("the old subscription (event.oldSubscription)"),
                "subscription": _ref("PushSubscription"),
            },
            ["oldEndpoint", "subscription"],
        ),
        "Change": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "state": {"enum": states},
                "inserted": {"type": "boolean"},
                "moved": {"type": "boolean"},
            },
            "required": ["id", "state", "inserted", "moved"],
            "additionalProperties": False,
        },
        "Unsubscribed": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "state": {"enum": states},
            },
            "required": ["id", "state"],
            "additionalProperties": False,
        },
        "PreferencesRequest": _object(
            {
                "endpoint": {"type": "string", "minLength": 1},
                "auth": _auth("the subscription at endpoint"),
                "decisions": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {
                            "slug": {"type": "string", "minLength": 1},
                            "state": {"enum": _values(PreferenceState)},
                        },
                        ["slug", "state"],
                    ),
                    "description": "Active topic slugs, each at most once.",
                },
                "policyVersion": {"type": "string", "minLength": 1},
                "decidedAt": {
                    "type": "string",
                    "format": "date-time",
                    "description": "ISO 8601 with a time zone, at most "
                    f"{decided_at_skew} seconds before or after the server's clock.",
                },
                "source": _sources("preferences"),
            },
            ["endpoint", "decisions", "policyVersion", "decidedAt"],
        ),
        "Preferences": {
            "type": "object",
            "properties": {
                "preferences": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "slug": {"type": "string"},
                            "state": {"enum": _values(PreferenceState)},
                            "effective": {"enum": ["on", "off"]},
                            "reason": {"enum": _values(Reason)},
                            "decidedAt": {"type": ["string", "null"], "format": "date-time"},
                            "policyVersion": {"type": ["string", "null"]},
                        },
                        "required": [
                            "slug",
                            "state",
                            "effective",
                            "reason",
                            "decidedAt",
                            "policyVersion",
                        ],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["preferences"],
            "additionalProperties": False,
        },
        "ReceiptRequest": _object(
            {
                "deliveryId": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "event": {"enum": _values(ReceiptEvent)},
                "endpoint": {"type": ["string", "null"], "minLength": 1, "maxLength": endpoint_max},
                "auth": _auth("the subscription the delivery went to"),
            },
            ["deliveryId", "event"],
        ),
        "Receipt": {
            "type": "object",
            "properties": {
                "deliveryId": {"type": "string"},
                "event": {"enum": _values(ReceiptEvent)},
                "recorded": {"type": "boolean"},
            },
            "required": ["deliveryId", "event", "recorded"],
            "additionalProperties": False,
        },
        "FeedbackDigest": _object(
            {
                "organization": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": _FEEDBACK_ORGANIZATION_MAX,
                },
                "events": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "description": "Only reason INVALID_TARGET events are applied; they "
                        "need provider, token or endpoint, and deliveryId or an integer at.",
                    },
                },
                "truncated": {"type": "boolean"},
                "eventsOmitted": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": 2**31 - 1,
                },
            },
            ["organization", "events"],
        ),
        "FeedbackReport": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "organization": {"type": "string"},
                "events": {"type": "integer", "minimum": 0},
                "applied": {"type": "integer", "minimum": 0},
                "revoked": {"type": "integer", "minimum": 0},
                "duplicates": {"type": "integer", "minimum": 0},
                "ignored": {"type": "integer", "minimum": 0},
                "truncated": {"type": "boolean"},
                "eventsOmitted": {"type": ["integer", "null"]},
            },
            "required": [
                "id",
                "organization",
                "events",
                "applied",
                "revoked",
                "duplicates",
                "ignored",
                "truncated",
                "eventsOmitted",
            ],
            "additionalProperties": False,
        },
        "TreeHead": {
            "type": "object",
            "description": "A signed tree head of the consent log (RFC 6962 §4.3). The "
            "signature is Ed25519, raw 64 bytes base64, over the 50 bytes 0x00 ‖ 0x01 ‖ "
            "timestamp (8, big-endian) ‖ tree_size (8, big-endian) ‖ root (32).",
            "properties": {
                "tree_size": {"type": "integer", "minimum": 0},
                "timestamp": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Milliseconds since the epoch.",
                },
                "sha256_root_hash": _BASE64_32,
                "tree_head_signature": {
                    "type": "string",
                    "pattern": "^[A-Za-z0-9+/]{86}==$",
                },
            },
            "required": ["tree_size", "timestamp", "sha256_root_hash", "tree_head_signature"],
            "additionalProperties": False,
        },
        "ConsistencyProof": {
            "type": "object",
            "description": "RFC 6962 §4.4 / RFC 9162 §2.1.4: the hashes, base64.",
            "properties": {"consistency": {"type": "array", "items": _BASE64_32}},
            "required": ["consistency"],
            "additionalProperties": False,
        },
        "InclusionProof": {
            "type": "object",
            "description": "RFC 6962 §4.5 / RFC 9162 §2.1.3: the leaf's index (its event's "
            "seq - 1) and its audit path, base64.",
            "properties": {
                "leaf_index": {"type": "integer", "minimum": 0},
                "audit_path": {"type": "array", "items": _BASE64_32},
            },
            "required": ["leaf_index", "audit_path"],
            "additionalProperties": False,
        },
        "LogKey": {
            "type": "object",
            "description": "The consent log's Ed25519 public key: the raw 32 bytes, base64.",
            "properties": {"key": _BASE64_32},
            "required": ["key"],
            "additionalProperties": False,
        },
        "VapidPublicKey": {
            "type": "object",
            "properties": {"publicKey": {"type": "string"}},
            "required": ["publicKey"],
            "additionalProperties": False,
        },
        "Health": {
            "type": "object",
            "properties": {
                "status": {"enum": ["ok", "unavailable"]},
                "database": {"enum": ["ok", "unreachable"]},
            },
            "required": ["status", "database"],
            "additionalProperties": False,
        },
    }


_SAME_ORIGIN_PARAMETERS = [
    {"$ref": "#/components/parameters/SecFetchSite"},
    {"$ref": "#/components/parameters/Origin"},
]


def _json_post(
    summary: str,
    request: str,
    answers: dict[str, dict[str, Any]],
    *,
    max_body: int,
    not_found: str | None = None,
    refused: str | None = None,
) -> dict[str, Any]:
    """A browser-facing JSON POST: same-origin, application/json, size-limited;
    ``refused`` names the other 403 the route gives."""
    responses: dict[str, Any] = dict(answers)
    responses["400"] = _error("Not a JSON object, or a field missing or of the wrong type.")
    forbidden = "A cross-site or cross-origin request (cross_origin)."
    responses["403"] = _error(f"{forbidden[:-1]}, or {refused}" if refused else forbidden)
    if not_found is not None:
        responses["404"] = _error(not_found)
    responses["413"] = _error(f"The body is over {max_body} bytes.")
    responses["415"] = _error("The body is not sent as application/json.")
    responses["422"] = _error("Well-formed but not acceptable; the field names the culprit.")
    return {
        "summary": summary,
        "parameters": _SAME_ORIGIN_PARAMETERS,
        "requestBody": {"required": True, "content": _json(_ref(request))},
        "responses": dict(sorted(responses.items())),
    }


def _ok(description: str, schema: str, *, cookies: bool = False) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description, "content": _json(_ref(schema))}
    if cookies:
        answer["headers"] = {
            "Set-Cookie": {
                "description": "The signed, HttpOnly subscriber "
                "cookie; and the device cookie naming the subscription.",
                "schema": {"type": "string"},
            }
        }
    return answer


def _retrying(description: str) -> dict[str, Any]:
    answer = _error(description)
    answer["headers"] = {
        "Retry-After": {
            "required": True,
            "description": "Whole seconds to wait before trying again.",
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        }
    }
    return answer


def _add_shared_answers(paths: dict[str, Any], settings: Any) -> None:
    """What every /api/ route can answer whatever its body: the rate limits' 429 (when
    a limit is on) and 503 while the database cannot be reached."""
    limits = settings.rate_limit
    for path, operations in paths.items():
        if not path.startswith("/api/"):
            continue
        for operation in operations.values():
            responses = operation["responses"]
            if limits.per_address or limits.per_endpoint:
                responses.setdefault(
                    "429", _retrying("Too many requests in this window (rate_limited).")
                )
            responses.setdefault(
                "503", _retrying("The database cannot be reached (unavailable); nothing changed.")
            )
            operation["responses"] = dict(sorted(responses.items()))


# The refusal of every endpoint-keyed route to a browser that does not hold the
# subscription (portal/subscriptions/possession.py).
_NOT_HELD = (
    "this browser has not shown that it holds the subscription — neither its portal_device "
    "cookie nor its auth secret — the same answer as for an endpoint nobody registered "
    "(not_your_subscription); nothing written."
)


def build(settings: Any) -> dict[str, Any]:
    """The OpenAPI document for an instance configured by ``settings``."""
    max_body = settings.api_max_body_bytes
    signature_header = settings.feedback_signature_header
    paths: dict[str, Any] = {
        "/healthz": {
            "get": {
                "summary": "Liveness for load balancers.",
                "responses": {
                    "200": _ok("The database answers.", "Health"),
                    "503": _ok("The database does not answer.", "Health"),
                },
            }
        },
        "/api/openapi.json": {
            "get": {
                "summary": "This document.",
                "responses": {
                    "200": {
                        "description": "The OpenAPI document.",
                        "content": _json({"type": "object"}),
                    }
                },
            }
        },
        "/api/push/vapid-public-key": {
            "get": {
                "summary": "The application-server (VAPID) public key.",
                "parameters": _SAME_ORIGIN_PARAMETERS,
                "responses": {
                    "200": _ok("The key, base64url.", "VapidPublicKey"),
                    "403": _error("A cross-site or cross-origin request (cross_origin)."),
                },
            }
        },
        "/api/push/subscribe": {
            "post": _json_post(
                "Register (or refresh) a browser's push subscription.",
                "SubscribeRequest",
                {
                    "200": _ok(
                        "Already known; refreshed, never downgraded.", "Subscription", cookies=True
                    ),
                    "201": _ok("A new subscription.", "Subscription", cookies=True),
                    "410": _error(
                        "Sent by the service worker (source service-worker) from a browser "
                        "whose portal_device cookie names a subscription its person ended "
                        "(unsubscribed, or erased): nothing is registered (subscription_ended)."
                    ),
                },
                max_body=max_body,
                refused="the endpoint is registered and this browser has not shown that it "
                "holds it: neither its portal_device cookie nor the registered auth secret "
                "(not_your_subscription); nothing written.",
            )
        },
        "/api/push/heartbeat": {
            "post": _json_post(
                "The browser still holds this subscription; what should it do next?",
                "EndpointRequest",
                {
                    "200": _ok(
                        "The subscription's state and the next action. For an endpoint "
                        "this browser has not shown it holds (or nobody registered): state "
                        "unknown, nothing written, and resubscribe when the subscriber "
                        "cookie names a live subscriber, else unsubscribe.",
                        "Heartbeat",
                    )
                },
                max_body=max_body,
            )
        },
        "/api/push/status": {
            "post": _json_post(
                "What the server holds for the subscription this browser holds, for a page "
                "to show on load.",
                "EndpointRequest",
                {
                    "200": _ok(
                        "receiving (action none), stopped or erased (unsubscribe: the "
                        "browser drops its subscription now), expired (resubscribe). For "
                        "an endpoint this browser has not shown it holds (its "
                        "portal_device cookie or the auth secret), or that nobody "
                        "registered: unknown and unsubscribe, nothing written; no person "
                        "or topic is ever named.",
                        "DeviceStatus",
                    )
                },
                max_body=max_body,
            )
        },
        "/api/push/change": {
            "post": _json_post(
                "pushsubscriptionchange: a new endpoint takes over the old one.",
                "ChangeRequest",
                {
                    "200": _ok("The new subscription was already known.", "Change", cookies=True),
                    "201": _ok("The new subscription.", "Change", cookies=True),
                    "410": _error(
                        "The browser holds the old subscription, but its person ended it "
                        "(unsubscribed, or erased): nothing is registered "
                        "(subscription_ended)."
                    ),
                },
                max_body=max_body,
                refused="for oldEndpoint: " + _NOT_HELD,
            )
        },
        "/api/push/unsubscribe": {
            "post": _json_post(
                "Stop notifications for one endpoint (revoked, logged).",
                "UnsubscribeRequest",
                {"200": _ok("The subscription, now revoked.", "Unsubscribed")},
                max_body=max_body,
                refused=_NOT_HELD,
            )
        },
        "/api/push/preferences": {
            "post": _json_post(
                "Record topic decisions for the subscriber behind an endpoint.",
                "PreferencesRequest",
                {
                    "200": _ok("The subscriber's effective preferences.", "Preferences"),
                    "409": _error(
                        "The decision names a notice that a newer one had replaced by "
                        "decidedAt (policy_superseded): nothing is written; show the person "
                        "the notice in force."
                    ),
                },
                max_body=max_body,
                not_found="The browser holds this subscription, but it ended as a tombstone "
                "or its person was erased (unknown_endpoint).",
                refused=_NOT_HELD,
            )
        },
        "/api/push/receipt": {
            "post": _json_post(
                "The service worker showed a delivery, or the person clicked it.",
                "ReceiptRequest",
                {
                    "200": _ok("Already recorded; nothing changed.", "Receipt"),
                    "201": _ok("Recorded.", "Receipt"),
                },
                max_body=max_body,
                refused="no delivery to this browser has this id: not a delivery of ours, or "
                "one sent to a subscription this browser has not shown it holds (its "
                "portal_device cookie or that subscription's auth secret) "
                "(not_your_delivery); nothing written.",
            )
        },
        "/api/push/feedback": {
            "post": {
                "summary": "The signed delivery-feedback digest (server to server).",
                "description": "The HMAC-SHA256 signature over the raw body is verified "
                "before anything is parsed. A signed digest that is refused is recorded "
                "(reason and counts, never the body) for the operations page.",
                "parameters": [
                    {
                        "name": signature_header,
                        "in": "header",
                        "required": True,
                        "description": "t=<unix-millis>,v1=<hex HMAC-SHA256 of '<t>.<body>'>",
                        "schema": {"type": "string"},
                    }
                ],
                "requestBody": {"required": True, "content": _json(_ref("FeedbackDigest"))},
                "responses": {
                    "200": _ok("Applied and committed.", "FeedbackReport"),
                    "400": _error("The signed body is not a JSON object."),
                    "401": {
                        "description": "Unsigned, badly signed, expired, or no secret set.",
                        "headers": {
                            "WWW-Authenticate": {
                                "required": True,
                                "schema": {"type": "string"},
                            }
                        },
                        "content": _json(_ref("Error")),
                    },
                    "413": _error(f"The body is over {settings.feedback_max_body_bytes} bytes."),
                    "422": _error("The digest is not valid; nothing of it was applied."),
                    "503": _error("The database refused; send the digest again later."),
                },
            }
        },
    }
    paths.update(_consent_log_paths())
    _add_shared_answers(paths, settings)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Push consent portal API",
            "version": "1",
            "description": "Same-origin JSON API of the push consent portal. Refusals "
            'answer {"error": {"code", "message", "field"}} and change nothing.',
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(settings.endpoint_max_length, settings.decided_at_max_skew_seconds),
            "parameters": {
                "SecFetchSite": {
                    "name": "Sec-Fetch-Site",
                    "in": "header",
                    "required": False,
                    "description": "cross-site and same-site are refused (403).",
                    "schema": {"enum": ["same-origin", "same-site", "none", "cross-site"]},
                },
                "Origin": {
                    "name": "Origin",
                    "in": "header",
                    "required": False,
                    "description": "When present, it must be the portal's public origin "
                    "(PUBLIC_URL: scheme, host and port), or the request is refused (403); "
                    "'null' is refused on every route that changes state.",
                    "schema": {"type": "string"},
                },
            },
        },
    }


@bp.get("/openapi.json")
def document() -> Response:
    return jsonify(build(current_portal().settings))
