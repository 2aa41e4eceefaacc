"""Hypothesis strategies for hostile requests to each JSON endpoint.

A request is drawn in three layers: a body *value* whose fields are each either a good
value, a near miss (wrong length, bad base64url, foreign host…) or junk of any JSON type;
an *encoding* of it (plain, non-ASCII, duplicate keys, deep nesting, truncated, binary,
oversized, a JSON constant); and the *headers* (content type, same-origin or not).
"""

from __future__ import annotations

import base64
import json
import string
from typing import Any

from hypothesis import strategies as st

from portal.feedback.signature import header_value
from tests.api.conftest import AUTH, ENDPOINT_BASE, NOW, P256DH_KEYS

SEEDED = tuple(ENDPOINT_BASE + t for t in ("seed-one", "seed-two", "seed-three"))
TOPICS = ("security-alerts", "order-updates", "weekly-digest", "offers")
FEEDBACK_SECRET = "feedback-secret-one"  # what tests.conftest.make_settings configures
NOW_MS = int(NOW.timestamp() * 1000)


class HostileRequest:
    """One request as sent: method, path, raw body bytes and headers."""

    def __init__(
        self, method: str, path: str, data: bytes = b"", headers: dict[str, str] | None = None
    ) -> None:
        self.method = method
        self.path = path
        self.data = data
        self.headers = headers or {}

    def __repr__(self) -> str:
        return f"{self.method} {self.path} {self.headers!r} {self.data[:300]!r}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


# --- junk -------------------------------------------------------------------------------

_SPECIAL_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\u202e",
    "\ufeff",
    "\n\r\t",
    "null",
    "NaN",
    "１２３",
    "é",
    "😀",
    "../../etc/passwd",
    "%00",
    "'; DROP TABLE push_subscription; --",
    "<script>alert(1)</script>",
    "\\",
]


def _repeat(unit: str, count: int) -> str:
    return unit * count


junk_text = st.one_of(
    st.sampled_from(_SPECIAL_TEXT),
    st.text(max_size=40),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1F), max_size=8),
    st.text(st.characters(categories=["Cs", "Co", "Cn", "Zs", "Mn"]), max_size=8),
    st.builds(
        _repeat, st.sampled_from(["a", "é", "😀", "\x00", "\ud800", "%"]), st.integers(60, 6000)
    ),
)
junk_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 10**40, 0, -1]),
    st.floats(),  # NaN and infinities encode as JSON constants the API must refuse
    junk_text,
)
junk = st.recursive(
    junk_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(junk_text, inner, max_size=4),
    max_leaves=8,
)


def field_of(*good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a good or nearly good value, sometimes anything at all."""
    return st.one_of(*good, *good, junk)


def body_of(
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """An object whose fields may each be left out, with a stray key now and then."""
    every = {**required, **(optional or {})}
    body = st.fixed_dictionaries(
        dict(required),
        optional=optional or {},
    )
    dropped = st.fixed_dictionaries({}, optional=every)
    extra = st.dictionaries(st.sampled_from([*every, "id", "__proto__", "state"]), junk, max_size=2)
    return st.one_of(body, body, body, dropped, st.builds(lambda b, e: {**b, **e}, body, extra))


# --- subscriptions ----------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


endpoint_token = st.text(string.ascii_letters + string.digits + "-_:", min_size=1, max_size=30)
_HOSTS = [
    "fcm.googleapis.com",
    "FCM.GOOGLEAPIS.COM",
    "updates.push.services.mozilla.com",
    "web.push.apple.com",
    "wns2-by3p.notify.windows.com",
    "googleapis.com.evil.example",
    "evil.example",
    "fcm.googleapis.com.",
    "xgoogleapis.com",
    ".googleapis.com",
    "127.0.0.1",
    "[::1]",
    "[::1",
    "fcm.googleapis.cöm",
    "user:pw@fcm.googleapis.com",
    "",
]
bogus_endpoint = st.builds(
    lambda scheme, host, port, path, token: f"{scheme}{host}{port}{path}{token}",
    st.sampled_from(["https://", "http://", "HTTPS://", "ftp://", "https:/", "", "https:///"]),
    st.sampled_from(_HOSTS),
    st.sampled_from(["", "", ":443", ":8443", ":0", ":99999", ":abc", ":-1"]),
    st.sampled_from(["/fcm/send/", "/", "", "/wpush/v2/", "/a b/", "/\\/", "/%00/"]),
    st.one_of(endpoint_token, st.just(""), junk_text),
)
endpoint = st.one_of(
    st.sampled_from(SEEDED),
    st.builds(lambda t: ENDPOINT_BASE + t, endpoint_token),
    st.builds(lambda n: ENDPOINT_BASE + "x" * n, st.integers(4000, 4200)),
    bogus_endpoint,
)

p256dh = st.one_of(
    st.sampled_from(P256DH_KEYS),
    st.builds(lambda k, n: k[:n], st.sampled_from(P256DH_KEYS), st.integers(0, 86)),
    st.builds(
        lambda k, tail: k + tail,
        st.sampled_from(P256DH_KEYS),
        st.sampled_from(["A", "=", "==", "AA"]),
    ),
    st.builds(lambda k: k.replace("-", "+").replace("_", "/"), st.sampled_from(P256DH_KEYS)),
    st.builds(lambda raw: _b64(b"\x04" + raw), st.binary(min_size=64, max_size=64)),
    st.builds(lambda raw: _b64(b"\x02" + raw), st.binary(min_size=32, max_size=32)),
    st.builds(_b64, st.binary(max_size=80)),
    st.just(_b64(b"\x04" + b"\x00" * 64)),
    st.builds(lambda k, c: k[:-1] + c, st.sampled_from(P256DH_KEYS), st.sampled_from("BCDQRSw")),
    st.builds(
        lambda k: base64.b64encode(base64.urlsafe_b64decode(k + "=")).decode(),
        st.sampled_from(P256DH_KEYS),
    ),
)
auth = st.one_of(
    st.just(AUTH),
    st.builds(_b64, st.binary(min_size=16, max_size=16)),
    st.builds(_b64, st.binary(max_size=24)),
    st.sampled_from([AUTH + "=", AUTH + "==", AUTH[:-1] + "B", AUTH[:-1], "+" * 22, "/" * 22, "="]),
)
expiration = st.one_of(
    st.none(),
    st.integers(-1, 32503680000001),
    st.floats(),
    st.sampled_from([32503680000000, 1e300, -0.0, True, "1700000000000"]),
)
subscription = st.one_of(
    body_of(
        {
            "endpoint": field_of(endpoint),
            "keys": field_of(body_of({"p256dh": field_of(p256dh), "auth": field_of(auth)})),
        },
        {"expirationTime": expiration},
    ),
    junk,
)
topics = st.one_of(
    st.none(),
    st.lists(st.sampled_from([*TOPICS, "retired", "OFFERS", ""]), max_size=6),
    junk,
)
policy_version = field_of(st.sampled_from(["v1", "v2", "V1", "v1 ", ""]))
source = field_of(
    st.sampled_from(
        ["api", "subscribe-page", "service-worker", "preference-centre", "staff", "system", "API"]
    )
)

valid_subscription = st.fixed_dictionaries(
    {
        "endpoint": st.builds(lambda t: ENDPOINT_BASE + t, endpoint_token),
        "keys": st.fixed_dictionaries(
            {"p256dh": st.sampled_from(P256DH_KEYS), "auth": st.just(AUTH)}
        ),
    },
    optional={"expirationTime": st.one_of(st.none(), st.integers(0, 32503679999999))},
)
subscribe = st.one_of(
    st.fixed_dictionaries(
        {"subscription": valid_subscription},
        optional={"topics": st.just(["offers"]), "policyVersion": st.just("v1")},
    ),
    body_of(
        {"subscription": subscription},
        {"source": source, "topics": topics, "policyVersion": policy_version},
    ),
)
# The seeded subscriptions' auth secret (AUTH) proves possession now and then, so the
# requests a browser that holds the subscription may make are fuzzed too.
heartbeat = body_of({"endpoint": field_of(endpoint)}, {"auth": field_of(auth)})
unsubscribe = body_of({"endpoint": field_of(endpoint)}, {"auth": field_of(auth), "source": source})
change = st.one_of(
    st.fixed_dictionaries(
        {"oldEndpoint": st.sampled_from(SEEDED), "subscription": valid_subscription},
        optional={"oldAuth": st.just(AUTH)},
    ),
    body_of(
        {"oldEndpoint": field_of(endpoint), "subscription": subscription},
        {"oldAuth": field_of(auth)},
    ),
)


# --- consent ----------------------------------------------------------------------------

decided_at = field_of(
    st.sampled_from(
        [
            "2025-12-31T23:59:00Z",
            "2026-01-01T00:00:00+00:00",
            "2026-01-01T00:09:59+00:00",
            "2026-01-01T00:10:01+00:00",
            "2025-12-31T00:00:00Z",
            "2025-12-30T23:59:59Z",
            "2026-01-02T00:00:01Z",
            "2026-01-01T00:00:00",
            "0001-01-01T00:00:00+14:00",
            "0001-01-01T00:00:00-14:00",
            "9999-12-31T23:59:59-14:00",
            "2026-02-30T00:00:00Z",
            "2026-01-01",
            "yesterday",
            "2026-01-01T00:00:00+24:00",
            "2026-01-01T00:00:00.123456789Z",
        ]
    ),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
)
decision = field_of(
    body_of(
        {
            "slug": field_of(st.sampled_from([*TOPICS, "retired", "", "Offers"])),
            "state": field_of(st.sampled_from(["opt_in", "opt_out", "unset", "OPT_IN", "on"])),
        }
    )
)
# Now and then a request that should be accepted, so refusals also meet rows it wrote.
valid_preferences = st.fixed_dictionaries(
    {
        "endpoint": st.sampled_from(SEEDED),
        "decisions": st.lists(
            st.fixed_dictionaries(
                {
                    "slug": st.sampled_from(TOPICS),
                    "state": st.sampled_from(["opt_in", "opt_out", "unset"]),
                }
            ),
            min_size=1,
            max_size=4,
            unique_by=lambda d: d["slug"],
        ),
        "policyVersion": st.just("v1"),
        "decidedAt": st.sampled_from(["2025-12-31T23:59:00Z", "2026-01-01T00:05:00+01:00"]),
    },
    optional={
        "source": st.sampled_from(["api", "preference-centre", "subscribe-page"]),
        "auth": st.just(AUTH),
    },
)
preferences = st.one_of(
    valid_preferences,
    body_of(
        {
            "endpoint": field_of(endpoint),
            "decisions": st.one_of(st.lists(decision, max_size=6), junk),
            "policyVersion": policy_version,
            "decidedAt": decided_at,
        },
        {"source": source, "auth": field_of(auth)},
    ),
)


# --- delivery receipts ------------------------------------------------------------------

delivery_id = field_of(
    st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=64),
    st.sampled_from(["x" * 65, "a b", "a/b", "é", "1" * 64, "-", "1", "2", "0", "9" * 19]),
)
receipt = body_of(
    {
        "deliveryId": delivery_id,
        "event": field_of(st.sampled_from(["shown", "clicked", "accepted", "SHOWN"])),
    },
    {"endpoint": st.one_of(st.none(), field_of(endpoint)), "auth": field_of(auth)},
)


# --- delivery feedback ------------------------------------------------------------------

feedback_event = field_of(
    body_of(
        {
            "reason": field_of(st.sampled_from(["INVALID_TARGET", "TRANSIENT", "invalid_target"])),
            "provider": field_of(
                st.sampled_from(["webpush", "fcm", ""]), st.text(min_size=60, max_size=70)
            ),
        },
        {
            "endpoint": field_of(endpoint),
            "token": field_of(endpoint_token),
            "deliveryId": field_of(delivery_id, st.sampled_from(["1", "0", str(2**63), "-1"])),
            "at": field_of(st.integers(), st.sampled_from([NOW_MS, 2**53, 2**53 - 1, 1.5])),
            "status": field_of(st.sampled_from(["FAILED", "DEAD"])),
        },
    )
)
digest = body_of(
    {
        "organization": field_of(st.sampled_from(["acme", "portal-test", "x" * 129, "\x00"])),
        "events": st.one_of(st.lists(feedback_event, max_size=5), junk),
    },
    {
        "truncated": field_of(st.booleans()),
        "eventsOmitted": field_of(st.integers(-1, 2**31), st.sampled_from([2**31 - 1, 2**31])),
    },
)


# --- encodings and headers --------------------------------------------------------------


def _with_duplicate(body: Any, key: str, value: Any, first: bool) -> bytes:
    if not isinstance(body, dict):
        return json.dumps(body).encode()
    items = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in body.items()]
    extra = f"{json.dumps(key)}: {json.dumps(value)}"
    items = [extra, *items] if first else [*items, extra]
    return ("{" + ", ".join(items) + "}").encode()


def _nested(depth: int, opener: str, closer: str, inside: str) -> bytes:
    return (opener * depth + inside + closer * depth).encode()


def encodings(body: st.SearchStrategy[Any], keys: list[str]) -> st.SearchStrategy[bytes]:
    plain = body.map(lambda b: json.dumps(b).encode())
    return st.one_of(
        plain,
        plain,
        plain,
        plain,
        body.map(lambda b: json.dumps(b, ensure_ascii=False).encode("utf-8", "surrogatepass")),
        st.builds(_with_duplicate, body, st.sampled_from(keys), junk, st.booleans()),
        st.builds(
            _nested,
            st.integers(1, 200_000),
            st.sampled_from(["[", '{"a":', f'{{"{keys[0]}":']),
            st.sampled_from(["]", "}"]),
            st.sampled_from(["", "1", "null"]),
        ),
        st.builds(lambda b, n: json.dumps(b).encode()[:n], body, st.integers(0, 40)),
        st.builds(lambda b: json.dumps(b).encode("utf-16"), body),
        st.builds(lambda b: b"\xef\xbb\xbf" + json.dumps(b).encode(), body),
        st.builds(
            lambda b, n: (
                json.dumps({**b, "pad": "x" * n}).encode() if isinstance(b, dict) else b"[]"
            ),
            body,
            st.integers(16_000, 17_000),
        ),
        st.binary(max_size=64),
        st.sampled_from(
            [
                b"",
                b"null",
                b"[]",
                b'"text"',
                b"NaN",
                b"Infinity",
                b"-Infinity",
                b"1e999",
                b"{}",
                b"{",
                b"\x00",
            ]
        ),
    )


CONTENT_TYPES = [
    "application/json",
    "application/json",
    "application/json",
    "application/json; charset=utf-8",
    "application/json; charset=latin-1",
    "APPLICATION/JSON",
    "application/json-patch+json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json;;;",
    "",
    None,
]
SAME_ORIGIN: list[dict[str, str]] = [
    {},
    {},
    {"Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"},
    {"Sec-Fetch-Site": "none"},
]
CROSS_ORIGIN: list[dict[str, str]] = [
    {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "https://evil.example"},
    {"Origin": "http://localhost:8080"},
    {"Origin": "http://evil.example@localhost"},
    {"Origin": "http://[::1"},
    {"Origin": "localhost"},
    {"Sec-Fetch-Site": "same-site", "Origin": "https://localhost.evil.example"},
    {"Sec-Fetch-Site": "Cross-Site"},
    {"Origin": "null"},
    {"Origin": "https://localhost"},
]
origin_headers = st.one_of(
    st.sampled_from(SAME_ORIGIN), st.sampled_from(SAME_ORIGIN), st.sampled_from(CROSS_ORIGIN)
)


def _headers(content_type: str | None, origin: dict[str, str]) -> dict[str, str]:
    headers = dict(origin)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


def json_requests(
    path: str, body: st.SearchStrategy[Any], keys: list[str]
) -> st.SearchStrategy[HostileRequest]:
    return st.builds(
        lambda data, content_type, origin: HostileRequest(
            "POST", path, data, _headers(content_type, origin)
        ),
        encodings(body, keys),
        st.sampled_from(CONTENT_TYPES),
        origin_headers,
    )


def _signed(data: bytes, how: str, skew_ms: int) -> HostileRequest:
    headers = {"Content-Type": "application/json"}
    if how == "signed":
        headers["X-CN1-Signature"] = header_value(FEEDBACK_SECRET, NOW_MS + skew_ms, data)
    elif how == "wrong-secret":
        headers["X-CN1-Signature"] = header_value("not-the-secret", NOW_MS, data)
    elif how == "stale":
        headers["X-CN1-Signature"] = header_value(FEEDBACK_SECRET, NOW_MS - 10**9, data)
    elif how != "unsigned":
        headers["X-CN1-Signature"] = how
    return HostileRequest("POST", "/api/push/feedback", data, headers)


feedback_requests = st.builds(
    _signed,
    encodings(digest, ["organization", "events"]),
    st.sampled_from(
        [
            "signed",
            "signed",
            "signed",
            "signed",
            "wrong-secret",
            "stale",
            "unsigned",
            "",
            "t=1",
            "v1=00",
            f"t={NOW_MS},v1={'0' * 64}",
            f"t={NOW_MS},t={NOW_MS},v1={'0' * 64}",
            "t=abc,v1=zz",
            "garbage",
        ]
    ),
    st.sampled_from([0, 0, 0, -299_000, 299_000]),
)

ENDPOINTS: dict[str, st.SearchStrategy[HostileRequest]] = {
    "subscribe": json_requests(
        "/api/push/subscribe", subscribe, ["subscription", "topics", "policyVersion"]
    ),
    "heartbeat": json_requests("/api/push/heartbeat", heartbeat, ["endpoint"]),
    "status": json_requests("/api/push/status", heartbeat, ["endpoint"]),
    "change": json_requests("/api/push/change", change, ["oldEndpoint", "subscription"]),
    "unsubscribe": json_requests("/api/push/unsubscribe", unsubscribe, ["endpoint"]),
    "preferences": json_requests(
        "/api/push/preferences", preferences, ["endpoint", "decisions", "decidedAt"]
    ),
    "receipt": json_requests("/api/push/receipt", receipt, ["deliveryId", "event"]),
    "feedback": feedback_requests,
}


# --- routes that do not exist, methods that are not allowed -----------------------------

_PATHS = [
    "/api/push/subscribe",
    "/api/push/subscribe/",
    "/api/push/SUBSCRIBE",
    "/api/push/vapid-public-key",
    "/api/push/preferences",
    "/api/push/feedback",
    "/api/push/receipt",
    "/api/push/../push/heartbeat",
    "/api/push/%00",
    "/api/push/",
    "/api/",
    "/api/openapi.json",
    "/api/push/subscriptions",
    "/api/push/unsubscribe%2F",
]
odd_requests = st.builds(
    lambda method, path, suffix, data, origin: HostileRequest(method, path + suffix, data, origin),
    st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "POST", "HEAD", "OPTIONS"]),
    st.sampled_from(_PATHS),
    st.one_of(
        st.just(""),
        st.sampled_from(["?x=1", "?endpoint=%00", "/x"]),
        st.text(string.ascii_letters, max_size=5),
    ),
    st.one_of(st.just(b""), st.binary(max_size=32)),
    origin_headers,
)
