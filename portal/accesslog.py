"""Request targets in log lines: bearer tokens redacted, control characters escaped.

Three things in a request are bearer tokens — whoever holds one acts as the person: the
``token`` of a preference link and the ``assertion`` of a host product's sign-in link
(query parameters, on ``/preferences``), and the token of an erasure receipt (the last
segment of ``/preferences/erasure-receipt/<token>``). :func:`redact_target` takes them out
of a request target, with the compliance look-up's search text (``q``), whom an officer
looked for (the parameters by name on every route, their names percent-decoded as the
application decodes them), and :func:`escape_log_text` writes control characters
as ``\\xNN`` so a decoded ``%0a`` cannot start a forged line. Every place a target reaches
a log line goes through them: gunicorn's access log (:class:`AccessLogger`, named in
``gunicorn.conf.py``), the development server's request log (:func:`install`, a filter on
the ``werkzeug`` logger) and the portal's own lines (:func:`loggable_path`).
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import quote, unquote, unquote_plus

SECRET_PARAMETERS = frozenset({"token", "assertion"})
# Not tokens, but whom a compliance officer looked for: the look-up's search text
# (``/staff/compliance/lookup?q=``), kept out of the logs like them.
SEARCH_PARAMETERS = frozenset({"q"})
_REDACTED_PARAMETERS = SECRET_PARAMETERS | SEARCH_PARAMETERS
RECEIPT_PATH = "/preferences/erasure-receipt/"
_RECEIPT_SEGMENT = "erasure-receipt"
REDACTED = "[redacted]"
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
# Headers whose whole value is a credential, as gunicorn names their atoms.
_CREDENTIAL_ATOMS = frozenset(
    {
        "{authorization}i",
        "{proxy-authorization}i",
        "{cookie}i",
        "{set-cookie}o",
        "{http_authorization}e",
        "{http_proxy_authorization}e",
        "{http_cookie}e",
    }
)
# Atoms that carry a request target or a URL (the Referer of a page a token link opened).
_TARGET_ATOMS = frozenset(
    {
        "U",
        "f",
        "{referer}i",
        "{http_referer}e",
        "{raw_uri}e",
        "{path_info}e",
        "{request_uri}e",
    }
)
_QUERY_ATOMS = frozenset({"q", "{query_string}e"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\\]")


def escape_log_text(text: str) -> str:
    """``text`` with control characters (and line and paragraph separators) written as
    ``\\xNN``/``\\uNNNN`` and backslashes doubled: one log line stays one line."""

    def escape(match: re.Match[str]) -> str:
        char = match.group(0)
        if char == "\\":
            return "\\\\"
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _CONTROL.sub(escape, text)


def _redact_pair(pair: str) -> str:
    name, equals, _value = pair.partition("=")
    if not equals or unquote_plus(name).strip().lower() not in _REDACTED_PARAMETERS:
        return pair
    return f"{name}={REDACTED}"


def redact_query(query: str) -> str:
    """A query string with the value of every bearer-token (and search) parameter replaced."""
    return "&".join(_redact_pair(pair) for pair in query.split("&"))


def _redact_path(path: str) -> str:
    # Matched as the application routes it: decoded, with runs of slashes merged.
    decoded = re.sub(r"/{2,}", "/", unquote(path))
    found = decoded.find(RECEIPT_PATH)
    if found == -1:
        return path
    # Written back encoded: what came before the receipt path stays printable.
    return quote(decoded[:found], safe=_PATH_SAFE) + RECEIPT_PATH + REDACTED


def redact_target(target: str) -> str:
    """A request target (path and query, or a whole URL) without its bearer tokens;
    unchanged when it carries none."""
    path, question, query = target.partition("?")
    redacted = _redact_path(path)
    if question:
        redacted += question + redact_query(query)
    return redacted


def _redact_request_line(line: str) -> str:
    method, _, rest = line.partition(" ")
    target, space, protocol = rest.rpartition(" ")
    if not space:  # no protocol: "GET /path"
        return f"{method} {redact_target(rest)}" if rest else line
    return f"{method} {redact_target(target)} {protocol}"


def loggable_path(path: str) -> str:
    """A request path as the portal's own log lines write it."""
    return escape_log_text(redact_target(path))


def redact_words(text: str) -> str:
    """Every whitespace-separated word of ``text`` that is a request target, redacted."""
    if "=" not in text and "%" not in text and _RECEIPT_SEGMENT not in text:
        # Nothing to redact: a parameter needs "=", the receipt path its name (or a
        # percent-encoding of it). Most lines, an access line among them, end here.
        return text
    return re.sub(r"\S+", lambda match: redact_target(match.group(0)), text)


# -- gunicorn --------------------------------------------------------------------------------


def access_atoms(atoms: dict[str, Any]) -> dict[str, Any]:
    """gunicorn's access-log atoms made safe to write: tokens redacted, credentials
    dropped, control characters escaped (gunicorn itself escapes only quotes)."""
    return {key: _safe_atom(key, value) for key, value in atoms.items()}


def _safe_atom(key: str, value: Any) -> Any:
    return escape_log_text(_atom(key, value)) if isinstance(value, str) else value


def _atom(key: str, value: str) -> str:
    lowered = key if len(key) == 1 else key.lower()
    if lowered in _CREDENTIAL_ATOMS:
        return REDACTED
    if lowered == "r":
        return _redact_request_line(value)
    if lowered in _TARGET_ATOMS:
        return redact_target(value)
    if lowered in _QUERY_ATOMS:
        return redact_query(value)
    return value


try:
    from gunicorn.glogging import Logger as _GunicornLogger
except ImportError:  # pragma: no cover - gunicorn is a dependency; tools may lack it
    _GunicornLogger = object  # type: ignore[assignment,misc]


class SafeAccessAtoms(dict):  # type: ignore[type-arg]
    """gunicorn's atoms as its ``SafeAtoms`` gives them to ``access_log_format`` (a
    ``{header}`` atom case-insensitive, a missing one ``-``, quotes escaped), each made
    safe by :func:`access_atoms`'s rule when the format reads it. A line names a dozen
    atoms of the sixty-odd gunicorn gathers (every header and environ key): making each
    safe up front cost about as much as the rest of the line."""

    def __getitem__(self, key: str) -> Any:
        if key.startswith("{"):
            key = key.lower()
        if not dict.__contains__(self, key):
            return "-"
        value = _safe_atom(key, dict.__getitem__(self, key))
        return value.replace('"', '\\"') if isinstance(value, str) else value


class AccessLogger(_GunicornLogger):  # type: ignore[misc,valid-type]
    """gunicorn's logger with :func:`access_atoms`'s rule applied to every atom an
    access-log line shows, whatever ``access_log_format`` an operator chooses."""

    atoms_wrapper_class = SafeAccessAtoms


# -- the development server ------------------------------------------------------------------


class RedactingFilter(logging.Filter):
    """Rewrites each record of the development server (the ``werkzeug`` logger: its
    request lines and its errors, which quote the request line) without bearer tokens.
    Werkzeug escapes the control characters of the paths it logs already."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: logging reports it itself
            return True
        redacted = redact_words(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def install() -> None:
    """Put :class:`RedactingFilter` on the development server's logger (once)."""
    logger = logging.getLogger("werkzeug")
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
