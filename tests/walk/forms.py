"""The forms a page offers, read from its HTML as a browser would: where each posts, and
every field's name and the values the page itself puts there (options, radios, hidden
values, buttons). The walk fuzzes these, so a new field is fuzzed without anyone listing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urljoin, urlsplit

from werkzeug.exceptions import HTTPException
from werkzeug.routing import MapAdapter, Rule

CSRF_FIELD = "csrf_token"


@dataclass
class Form:
    """One (rule, method) as its forms post to it, merged over every page that has one."""

    rule: str
    method: str
    fields: dict[str, set[str]] = field(default_factory=dict)
    # Query parameters the form's own action carries (``/staff/login?next=…``).
    action_query: dict[str, set[str]] = field(default_factory=dict)

    def add(self, name: str, value: str | None) -> None:
        values = self.fields.setdefault(name, set())
        if value is not None:
            values.add(value)


@dataclass
class _Parsed:
    action: str | None
    method: str
    fields: list[tuple[str, str | None]] = field(default_factory=list)


class _FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[_Parsed] = []
        self._form: _Parsed | None = None
        self._textarea: str | None = None
        self._text: list[str] = []
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self._form = _Parsed(a.get("action"), (a.get("method") or "get").upper())
            self.forms.append(self._form)
            return
        if self._form is None:
            return
        name = a.get("name")
        if tag == "input" and name:
            kind = (a.get("type") or "text").lower()
            value = a.get("value")
            if kind in {"checkbox", "radio"}:
                value = value if value is not None else "on"
            self._form.fields.append((name, value))
        elif tag == "button" and name:
            self._form.fields.append((name, a.get("value") or ""))
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []
        elif tag == "select" and name:
            self._select = name
            self._form.fields.append((name, None))
        elif tag == "option" and self._select:
            self._form.fields.append((self._select, a.get("value") or ""))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag == "textarea" and self._textarea is not None and self._form is not None:
            self._form.fields.append((self._textarea, "".join(self._text)))
            self._textarea = None
        elif tag == "select":
            self._select = None


def forms_on(html: str, page_url: str, adapter: MapAdapter) -> list[tuple[Rule, Form]]:
    """Every form on a page, with the URL rule its action resolves to."""
    parser = _FormParser()
    parser.feed(html)
    found = []
    for parsed in parser.forms:
        target = urlsplit(urljoin(page_url, parsed.action or page_url))
        try:
            rule, _ = adapter.match(target.path, parsed.method, return_rule=True)
        except HTTPException:
            continue  # a form to another site, or one the router refuses
        form = Form(rule.rule, parsed.method)
        for name, value in parse_qsl(target.query, keep_blank_values=True):
            form.action_query.setdefault(name, set()).add(value)
        for name, value in parsed.fields:
            if name != CSRF_FIELD:
                form.add(name, value)
        found.append((rule, form))
    return found


def merge(into: dict[tuple[str, str], Form], more: list[tuple[Rule, Form]]) -> None:
    for _, form in more:
        known = into.setdefault((form.rule, form.method), Form(form.rule, form.method))
        for name, values in form.fields.items():
            known.fields.setdefault(name, set()).update(values)
        for name, values in form.action_query.items():
            known.action_query.setdefault(name, set()).update(values)
