"""One logging configuration: JSON lines in production, readable text in development.

Every record goes to standard error through one handler, as one line. The fields a call
passes as ``extra=`` (the audit event ``push_token_pruned`` carries ``subscription``,
``provider``, ``reason`` and ``delivery``) are written with it: keys of the JSON object in
production, ``key=value`` pairs after the message in development.

No secret reaches a line. Bearer tokens in request targets (a preference link's
``token``, a sign-in ``assertion``, an erasure receipt's path) are redacted from the
message and from every string field as :mod:`portal.accesslog` redacts them, a field
whose name says it holds a credential (``password``, ``token``, ``secret``, ``key`` …) is
written as ``[redacted]`` whatever it holds, and text lines escape control characters so
one record stays one line.

:func:`configure` is called by ``create_app``. Like :func:`logging.basicConfig` it leaves
the root logger alone when something else has already given it handlers (a test runner,
an embedding program); gunicorn is given the same configuration through
:func:`gunicorn_config` in ``gunicorn.conf.py``, so its error log and access log come out
in the same format, and ``create_app`` then finds the handler in place.

``PORTAL_LOG_FORMAT`` (``json`` or ``text``) overrides the choice the environment makes;
``PORTAL_LOG_LEVEL`` sets the level (``INFO`` unless told).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from portal.accesslog import REDACTED, escape_log_text, redact_words

JSON, TEXT = "json", "text"
FORMATS = (JSON, TEXT)
HANDLER_NAME = "portal"
# The attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    {
        *vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None)),
        "message",
        "asctime",
        "taskName",
    }
)
# A field named like this holds a credential: its value is never written.
_CREDENTIAL_NAME = re.compile(
    r"pass(word|phrase)?|secret|token|assertion|auth|cookie|credential|signature|"
    r"private|(^|_)keys?($|_)|p256dh|session",
    re.IGNORECASE,
)


def choose_format(*, production: bool, environ: Mapping[str, str] | None = None) -> str:
    """``json`` in production and ``text`` elsewhere, unless PORTAL_LOG_FORMAT says."""
    environ = os.environ if environ is None else environ
    chosen = environ.get("PORTAL_LOG_FORMAT", "").strip().lower()
    if chosen:
        if chosen not in FORMATS:
            raise ValueError(f"PORTAL_LOG_FORMAT must be one of {', '.join(FORMATS)}: {chosen!r}")
        return chosen
    return JSON if production else TEXT


def choose_level(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    level = environ.get("PORTAL_LOG_LEVEL", "").strip().upper() or "INFO"
    if not isinstance(logging.getLevelName(level), int):
        raise ValueError(f"PORTAL_LOG_LEVEL is not a logging level: {level!r}")
    return level


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a logging call passed as ``extra=``, made safe to write."""
    return {
        key: safe_value(key, value)
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_")
    }


def safe_value(key: str, value: Any) -> Any:
    """``value`` as a log line may show it under the name ``key``."""
    if _CREDENTIAL_NAME.search(key):
        return REDACTED
    if isinstance(value, str):
        return redact_words(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): safe_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [safe_value(key, item) for item in value]
    # UUIDs, datetimes, enums, decimals …: their text.
    return redact_words(str(value))


# Colour codes (Werkzeug styles its request lines): dropped, not escaped into noise.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def _message(record: logging.LogRecord) -> str:
    return redact_words(_COLOUR.sub("", record.getMessage()))


def _timestamp(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, every ``extra=`` field,
    and the traceback as ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": _message(record),
        }
        for key, value in extra_fields(record).items():
            line.setdefault(key, value)  # an extra named like a core field cannot hide it
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``2026-12-01T17:00:00.000Z WARNING portal.audit push_token_pruned provider=fcm …``:
    the ``extra=`` fields as ``key=value`` (values with spaces quoted), the traceback on
    the lines below."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name]
        parts.append(escape_log_text(_message(record)))
        for key, value in extra_fields(record).items():
            parts.append(f"{escape_log_text(key)}={_text_value(value)}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def _text_value(value: Any) -> str:
    """A field's value, escaped, and quoted when it holds a space, a quote or an equals
    sign (a quote inside written as ``\\x22``) or nothing at all."""
    raw = value if isinstance(value, str) else json.dumps(value, default=str)
    text = escape_log_text(raw)
    if raw and not re.search(r"[\s\"=]", raw):
        return text
    return '"' + text.replace('"', "\\x22") + '"'


FORMATTERS: dict[str, type[logging.Formatter]] = {JSON: JsonFormatter, TEXT: TextFormatter}


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record (as logging's last
    resort does), or to ``stream`` when one is given."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self._fixed = stream

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns it
        pass


def handler(fmt: str, stream: TextIO | None = None) -> logging.Handler:
    made = StderrHandler(stream)
    made.set_name(HANDLER_NAME)
    made.setFormatter(FORMATTERS[fmt]())
    return made


def configure(
    *,
    production: bool,
    fmt: str | None = None,
    level: str | None = None,
    stream: TextIO | None = None,
    force: bool = False,
) -> logging.Handler | None:
    """Give the root logger the portal's handler; the handler, or None when the root
    logger already had handlers of someone else's (then nothing changes) unless
    ``force``. Called again, it replaces its own handler."""
    root = logging.getLogger()
    others = [h for h in root.handlers if h.get_name() != HANDLER_NAME]
    if others and not force:
        return None
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
    installed = handler(fmt or choose_format(production=production), stream)
    root.addHandler(installed)
    root.setLevel(level or choose_level())
    return installed


def remove() -> None:
    """Take the portal's handler off the root logger (tests)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)


def gunicorn_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """gunicorn's ``logconfig_dict``: the root logger, ``gunicorn.error`` and
    ``gunicorn.access`` through the portal's handler and formatter. gunicorn runs in
    production, so JSON unless PORTAL_LOG_FORMAT says otherwise."""
    environ = os.environ if environ is None else environ
    fmt = choose_format(production=True, environ=environ)
    level = choose_level(environ)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"portal": {"()": FORMATTERS[fmt]}},
        "handlers": {
            HANDLER_NAME: {"()": StderrHandler, "formatter": "portal"},
        },
        "root": {"level": level, "handlers": [HANDLER_NAME]},
        "loggers": {
            # Through the root's handler only: no second copy of each line.
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": True},
        },
    }
