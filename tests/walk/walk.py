"""The walk: every rule of the app's URL map, its forms read from the pages, and hostile
values for every route parameter, query string and form field.

- :func:`targets` lists every (rule, method) of ``app.url_map``; :func:`harvest` opens
  every page as every persona (and the steps only a form reaches: a campaign's review,
  a policy's preview, a topic's review) and reads the forms each offers (tests/walk/forms.py).
  :func:`uncovered` names a rule the walk cannot fill in or a form it never saw.
- :func:`requests` draws one request: a target, its route parameters (a value that names
  something, or a hostile one), a query string, and for a POST the form's fields — mostly
  good values with one or two spoiled, a valid CSRF token most of the time (so the fuzz
  reaches the validators), sometimes none or a wrong one.
- :class:`Walker` is the oracle: no 5xx, no traceback, a 4xx is a page (or the JSON
  error shape under /api/), and a refusal changes no row of any table — bar the few
  refusals that are recorded on purpose (:func:`recorded_refusal`).
"""

from __future__ import annotations

import json
import operator
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_from_bytes

import sqlalchemy as sa
from flask import Flask
from hypothesis import strategies as st
from werkzeug.routing import Rule

from tests.api.guard import FEEDBACK_DIGESTS, TableDigest, is_error_shape
from tests.campaigns.conftest import form_data
from tests.walk.conftest import World
from tests.walk.forms import Form, forms_on, merge

Target = tuple[str, str]  # (rule, method)

_ARGUMENT = re.compile(r"<(?:[^<>:]+:)?(\w+)>")
# Stands for the sending persona's CSRF token in a drawn request.
OWN_TOKEN = "own-csrf-token"
# Query parameters the views read outside any form.
QUERY_NAMES = (
    "next",
    "token",
    "assertion",
    "before",
    "after",
    "tests",
    "subscriber",
    # The consent log's proofs (GET /api/consent-log/consistency and …/inclusion).
    "from",
    "to",
    "leaf",
    "size",
)


def targets(app: Flask) -> dict[Target, Rule]:
    found = {}
    for rule in app.url_map.iter_rules():
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            found[(rule.rule, method)] = rule
    return found


def is_json_api(rule: str) -> bool:
    """The JSON API: fuzzed body by body in tests/api; walked here for its addresses."""
    return rule.startswith("/api/")


def fill(rule: str, values: dict[str, str | bytes]) -> str:
    """The rule's path with each parameter percent-encoded (as bytes: a lone surrogate
    becomes the invalid UTF-8 a browser could send)."""
    return _ARGUMENT.sub(lambda m: encode(values[m.group(1)]), rule)


def encode(value: str | bytes) -> str:
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    return quote_from_bytes(raw, safe="")


# -- what a page offers -----------------------------------------------------------------


def _paths(world: World, rule: Rule) -> list[str]:
    """The rule's addresses for every value that names something (each page a world's
    topic, campaign or staff user has)."""
    combinations: list[dict[str, str | bytes]] = [{}]
    for name in sorted(rule.arguments):
        combinations = [{**c, name: v} for c in combinations for v in world.parameters[name]]
    return [fill(rule.rule, values) for values in combinations]


def harvest(world: World) -> dict[Target, Form]:
    """Every form every persona is offered, on every page (and a few pages only a form
    leads to), merged by the rule and method it posts to."""
    app = world.app
    adapter = app.url_map.bind("localhost")
    forms: dict[Target, Form] = {}
    for persona in world.personas.values():
        persona.before_request()
        pages = [
            path
            for (rule_text, method), rule in targets(app).items()
            if method == "GET" and not is_json_api(rule_text) and rule.endpoint != "static"
            for path in _paths(world, rule)
        ]
        for path in pages:
            with persona.client.get(path, follow_redirects=True) as answer:
                if answer.mimetype == "text/html":
                    merge(forms, forms_on(answer.text, path, adapter))
        seeds: list[tuple[str, dict[str, Any]]] = [
            ("/staff/campaigns/new", {**form_data(), "action": "review"}),
            ("/staff/admin/policies/new", {"version": "v2", "text": "We send less."}),
            (
                "/staff/admin/topics/new",
                {
                    "slug": "walked",
                    "category": "News",
                    "label": "Walked",
                    "topic_class": "marketing",
                    "default_state": "opt_out",
                },
            ),
        ]
        for path, data in seeds:
            answer = persona.client.post(path, data={"csrf_token": persona.token, **data})
            if answer.mimetype == "text/html":
                merge(forms, forms_on(answer.text, path, adapter))
        persona.restore()
    # An account link, from a browser of its own (it may link that browser).
    stranger = app.test_client()
    for assertion in world.assertions[:1]:
        answer = stranger.get(f"/preferences?assertion={assertion}", follow_redirects=True)
        if answer.mimetype == "text/html":
            merge(forms, forms_on(answer.text, "/preferences", adapter))
    return forms


def weighted(world: World, persona: str, forms: dict[Target, Form]) -> list[Target]:
    """Every target, each repeated by how much there is behind it for this persona: a
    form it may post most (a validator, then the database), then a page it may open;
    the rest once (a redirect to sign-in, a 403)."""
    role = world.personas[persona].role
    chosen = []
    for target, rule in sorted(targets(world.app).items()):
        roles = getattr(world.app.view_functions[rule.endpoint], "staff_roles", None)
        usable = (
            roles is None if role is None else roles is not None and (not roles or role in roles)
        )
        has_form = target in forms and not is_json_api(target[0])
        chosen += [target] * (8 if usable and has_form else 3 if usable else 1)
    return chosen


def uncovered(world: World, forms: dict[Target, Form]) -> list[str]:
    """What the walk cannot do for a rule: a parameter it has no values for, or a form
    post no page offers (so it would fuzz the CSRF check and nothing behind it)."""
    problems = []
    for (rule_text, method), rule in targets(world.app).items():
        problems.extend(
            f"{rule_text}: no values for <{name}>: add them to World.parameters"
            for name in sorted(rule.arguments)
            if name not in world.parameters
        )
        if method == "POST" and not is_json_api(rule_text) and (rule_text, method) not in forms:
            problems.append(f"POST {rule_text}: no page offers this form: add the page or step")
    return problems


# -- values -----------------------------------------------------------------------------

_SPECIAL: list[str | bytes] = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\x01",
    "\x07",
    "\x1b[31m",
    "\x7f",
    "\x85",
    "\r\n",
    "\n",
    "\r",
    "\t",
    "a\r\nSet-Cookie: x=1",
    "\u2028",
    "\ud800",
    "x\udfffy",
    "\u202e",
    "\ufeff",
    "é",
    "😀",
    "名前",
    "null",
    "NaN",
    "Infinity",
    "0001-01-01",
    "9999-12-31",
    "9999-12-30",
    "10000-01-01",
    "2026-02-30",
    "0001-01-01T00:00",
    "9999-12-31T23:59",
    "10000-01-01T00:00",
    "2026-03-29T02:30",
    "-1",
    "0",
    "-0",
    "2147483648",
    "9223372036854775808",
    "-9223372036854775809",
    "1" * 400,
    "1e309",
    "²",
    "١٢",
    "１２",
    "../../etc/passwd",
    "%00",
    "'; DROP TABLE staff_user; --",
    "<script>alert(1)</script>",
    "{{ 7 * 7 }}",
    "\\",
    "//evil.example",
    "javascript:alert(1)",
    "00000000-0000-0000-0000-000000000000",
    str(uuid.UUID(int=1)),
    b"\xff",
    b"\xc0\x80",  # an overlong NUL
    b"\xed\xa0\x80",  # a surrogate, as UTF-8
    b"\xf4\x90\x80\x80",  # past U+10FFFF
]

hostile: st.SearchStrategy[str | bytes] = st.one_of(
    st.sampled_from(_SPECIAL),
    st.text(max_size=20).map("\x00".join),
    st.text(max_size=30),
    st.text(st.characters(max_codepoint=0x1F), max_size=6),
    st.text(st.characters(categories=["Cc", "Cs", "Co", "Cn", "Zl", "Zp", "Cf"]), max_size=6),
    st.builds(
        operator.mul,
        st.sampled_from(["a", "é", "😀", "\x00", "\ud800", "%", "-"]),
        st.integers(200, 20_000),
    ),
    st.binary(max_size=12),
    st.integers().map(str),
)


# What a near miss puts into a good value: NUL most often, the byte PostgreSQL refuses;
# then other controls, a lone surrogate, and plain non-ASCII (it must pass, and go on).
_INSERTED = ["\x00"] * 6 + ["\n", "\r\n", "\t", "\x1b", "\x7f", "\x85", "\ud800", "é", "€"]
# The edges of a value's own kind: a date, a date and time, a number.
_EDGES = [
    (re.compile(r"\d{4}-\d\d-\d\d"), ["0001-01-01", "9999-12-31", "9999-12-30", "10000-01-01"]),
    (
        re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d"),
        ["0001-01-01T00:00", "9999-12-31T23:59", "9999-12-31T12:00", "10000-01-01T00:00"],
    ),
    (re.compile(r"\d+"), ["-1", "0", "²", "١٢", "１２", "9" * 20, "2147483648", "1e309"]),
]
_HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60)
_CONTENT_TYPES = ["application/x-www-form-urlencoded"] * 18 + ["text/plain", "multipart/form-data"]


@dataclass
class WalkRequest:
    persona: str
    target: Target
    method: str
    path: str
    query: str
    body: bytes | None = None
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    def __repr__(self) -> str:
        body = (self.body or b"")[:400]
        return f"{self.persona}: {self.method} {self.url[:400]} {self.content_type} {body!r}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def _query_string(pairs: list[tuple[str | bytes, str | bytes]]) -> str:
    return "&".join(f"{encode(k)}={encode(v)}" for k, v in pairs)


def _json_body(pairs: list[tuple[Any, Any]]) -> bytes:
    document = {
        (k.decode("latin-1") if isinstance(k, bytes) else k): (
            v.decode("latin-1") if isinstance(v, bytes) else v
        )
        for k, v in pairs
    }
    return json.dumps(document).encode()


class _Draw:
    """One request's choices. The shape (which route, which fields to spoil, which token)
    comes from a Random seeded by Hypothesis, so every choice is as likely as intended;
    the hostile values are Hypothesis's own draws. Both replay."""

    def __init__(self, draw: st.DrawFn, world: World, forms: dict[Target, Form]) -> None:
        self.draw = draw
        self.world = world
        self.forms = forms
        # A real Random from a drawn seed: Hypothesis's own is biased to small choices,
        # which would leave routes and fields unvisited.
        self.rnd = draw(st.randoms(use_true_random=True))

    def chance(self, p: float) -> bool:
        return self.rnd.random() < p

    def near_miss(self, good: str) -> str:
        """A good value with a control character (or a lone surrogate) put in: it passes
        the checks of shape that come first, so it reaches whatever reads it next."""
        at = self.rnd.randrange(len(good) + 1)
        return good[:at] + self.rnd.choice(_INSERTED) + good[at:]

    def good(self, values: list[str]) -> str:
        return self.rnd.choice(values).replace("{n}", str(self.rnd.randrange(10**6)))

    def edge(self, good: str) -> str | None:
        for shape, edges in _EDGES:
            if shape.fullmatch(good):
                return self.rnd.choice(edges)
        return None

    def value(self, good: list[str], *, spoiled: bool) -> str | bytes:
        """A good value, or for a spoiled field: the edge of its kind (a far date, a
        digit that is not ASCII), a near miss, or anything hostile."""
        if not spoiled:
            return self.good(good)
        roll, chosen = self.rnd.random(), self.good(good)
        if roll < 0.35:
            return self.edge(chosen) or self.near_miss(chosen)
        if roll < 0.65:
            return self.near_miss(chosen)
        return self.draw(hostile)

    def parameter(self, name: str) -> str | bytes:
        known = self.world.parameters[name]
        roll = self.rnd.random()
        if roll < 0.5:
            return self.rnd.choice(known)
        if roll < 0.9:
            return self.value(known, spoiled=True)
        return str(uuid.UUID(int=self.rnd.getrandbits(128)))

    def fields(self, form: Form) -> list[tuple[Any, Any]]:
        """The form's fields: good values (what the page offers), one or two spoiled — a
        near miss or anything hostile — a few left out, now and then one sent twice or a
        stray field."""
        names = sorted(form.fields)
        spoiled: set[str] = set()
        if names and self.chance(0.85):
            spoiled = set(self.rnd.sample(names, min(len(names), self.rnd.choice([1, 1, 2]))))
        pairs: list[tuple[Any, Any]] = []
        for name in names:
            if self.chance(0.06):
                continue  # left out
            offered = form.fields[name] | set(self.world.good_by_field.get(name, ()))
            good = sorted(offered) or self.world.good_values
            pairs.append((name, self.value(good, spoiled=name in spoiled)))
            if self.chance(0.04):  # sent twice
                pairs.append((name, self.value(good, spoiled=self.chance(0.5))))
        if self.chance(0.08):
            pairs.append((self.draw(hostile), self.draw(hostile)))
        for name, values in sorted(form.action_query.items()):
            pairs.append((name, sorted(values)[0]))
        return pairs

    def query(self, target: Target) -> str:
        own = self.forms.get(target)
        in_query = own is not None and target[1] == "GET"  # a form that sends a query string
        if not self.chance(0.9 if in_query else 0.5 if target[1] == "GET" else 0.2):
            return ""
        pairs = self.fields(own) if in_query and own is not None else []
        names = sorted({*QUERY_NAMES, *(own.fields if own else ())})
        for _ in range(self.rnd.randrange(4)):
            name: str | bytes = self.rnd.choice(names) if self.chance(0.7) else self.draw(hostile)
            roll = self.rnd.random()
            if roll < 0.4:
                value: str | bytes = self.draw(hostile)
            elif roll < 0.7:
                value = self.value(self.world.good_values, spoiled=self.chance(0.3))
            else:  # a link token or a signed assertion, as sent or nearly
                value = self.value(
                    self.world.link_tokens + self.world.assertions, spoiled=self.chance(0.5)
                )
            pairs.append((name, value))
        return _query_string(pairs)

    def headers(self) -> dict[str, str]:
        if not self.chance(0.2):
            return {}
        return {
            "User-Agent": self.draw(_HEADER_TEXT),
            "Accept-Language": self.rnd.choice([self.draw(_HEADER_TEXT), "de-DE,de;q=0.9"]),
            "Origin": self.rnd.choice(["http://localhost", "https://evil.example", "null"]),
        }


def requests(
    world: World, persona: str, chosen: list[Target], forms: dict[Target, Form]
) -> st.SearchStrategy[WalkRequest]:
    """Requests as ``persona``, each to one of the ``chosen`` targets (repeat one to
    weigh it more)."""
    every = targets(world.app)
    other_token = world.personas["admin"].token

    @st.composite
    def request(draw: st.DrawFn) -> WalkRequest:
        pick = _Draw(draw, world, forms)
        target = pick.rnd.choice(chosen)
        rule = every[target]
        values = {name: pick.parameter(name) for name in sorted(rule.arguments)}
        made = WalkRequest(persona, target, target[1], fill(target[0], values), pick.query(target))
        made.headers = pick.headers()
        if target[1] != "POST":
            return made
        pairs = pick.fields(forms.get(target, Form(*target)))
        # The persona's own token (read when the request is sent: a sign-in renews it)
        # most of the time, so the fuzz reaches the validators behind the CSRF check.
        if pick.chance(0.85):
            pairs.insert(0, ("csrf_token", OWN_TOKEN))
        elif pick.chance(0.75):
            pairs.insert(0, ("csrf_token", pick.rnd.choice(["", "garbage", other_token, "\x00"])))
        if is_json_api(target[0]) and pick.chance(0.5):
            made.body, made.content_type = _json_body(pairs), "application/json"
        else:
            made.body = _query_string(pairs).encode()
            made.content_type = pick.rnd.choice(_CONTENT_TYPES)
        return made

    return request()


# -- the oracle ---------------------------------------------------------------------------

SIGN_IN_REFUSED = {"staff.sign_in_failed", "staff.locked_out"}
PASSWORD_REFUSED = {"staff.password_change_failed", "staff.locked_out"}


def recorded_refusal(walker: Walker, request: WalkRequest, status: int, changed: list[str]) -> bool:
    """The refusals that write on purpose: a failed sign-in (the lockout and the audit
    trail count it), a look-up that found nobody (audited either way), a signed feedback
    digest refused (kept for the operations page), a wrong current password on the
    password form (it counts toward the lockout like a failed sign-in)."""
    rule, method = request.target
    if rule == "/staff/login" and method == "POST" and status in {401, 403, 429}:
        allowed = {"staff_audit", "staff_login_throttle", "staff_user"}
        return set(changed) <= allowed and walker.newest_audit(changed) <= SIGN_IN_REFUSED
    if rule == "/staff/password" and method == "POST" and status in {422, 429}:
        allowed = {"staff_audit", "staff_user"}
        return set(changed) <= allowed and walker.newest_audit(changed) <= PASSWORD_REFUSED
    if rule == "/staff/compliance/lookup" and method == "POST" and status == 404:
        return changed == ["staff_audit"] and walker.newest_audit(changed) == {"consent.looked_up"}
    return rule == "/api/push/feedback" and changed == [FEEDBACK_DIGESTS]


@dataclass
class Walker:
    """Checks every answer; counts requests, statuses, targets and time."""

    world: World
    digest: TableDigest = field(init=False)
    before: dict[str, tuple[int, str]] = field(init=False)
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    reached: Counter[Target] = field(default_factory=Counter)
    started: float = field(default_factory=time.perf_counter)
    _counts: tuple[dict[str, tuple[int, str]], dict[str, tuple[int, str]]] | None = None

    def __post_init__(self) -> None:
        self.digest = TableDigest(self.world.engine)
        self.before = self.digest.take()

    def send(self, request: WalkRequest) -> None:
        persona = self.world.personas[request.persona]
        persona.before_request()
        body = request.body
        if body is not None:
            body = body.replace(OWN_TOKEN.encode(), persona.token.encode())
        response = persona.client.open(
            request.url,
            method=request.method,
            data=body,
            content_type=request.content_type,
            headers=request.headers,
        )
        with response:
            body = response.get_data()
        self.check(request, response.status_code, response.mimetype, body)
        if persona.restore():
            self.before = self.digest.take()

    def check(self, request: Any, status: int, mimetype: str | None, body: bytes) -> None:
        self.requests += 1
        self.statuses[status] += 1
        self.reached[request.target] += 1
        after = self.digest.take()
        before, self.before = self.before, after
        self._counts = (before, after)
        assert status < 500, f"{request!r} answered {status}: {body[:300]!r}"
        assert b"Traceback" not in body, f"{request!r} shows a traceback"
        if status < 400:
            return
        if is_json_api(request.target[0]) or mimetype == "application/json":
            assert mimetype == "application/json", f"{request!r}: {status} as {mimetype}"
            assert is_error_shape(json.loads(body)), f"{request!r}: {status} {body[:300]!r}"
        else:
            assert mimetype in {"text/html", "text/plain"}, f"{request!r}: {status} as {mimetype}"
        changed = sorted(t for t in before if before[t] != after[t])
        if changed and recorded_refusal(self, request, status, changed):
            return
        assert not changed, f"{request!r} was refused ({status}) but changed {changed}"

    def newest_audit(self, changed: list[str]) -> set[str]:
        """The actions of the audit rows the last request added."""
        assert self._counts is not None
        before, after = self._counts
        added = after["staff_audit"][0] - before["staff_audit"][0]
        with self.world.engine.connect() as conn:
            return set(
                conn.execute(
                    sa.text("SELECT action FROM staff_audit ORDER BY id DESC LIMIT :n"),
                    {"n": added},
                ).scalars()
            )

    def summary(self) -> str:
        elapsed = time.perf_counter() - self.started
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return f"{self.requests} requests in {elapsed:.1f} s ({statuses})"
