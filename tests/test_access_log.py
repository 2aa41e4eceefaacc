"""Request lines in logs: no bearer token, no forged line.

Preference-link tokens (``/preferences?token=``), identity assertions (``?assertion=``)
and erasure-receipt tokens (``/preferences/erasure-receipt/<token>``) are bearer tokens:
whoever holds one acts as the person. The servers' request logs (gunicorn's access log,
the development server's) and the portal's own log lines carry request targets; these
tests run the real servers and read their real lines back.
"""

from __future__ import annotations

import logging
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support import ROOT, clean_environ, free_port, stop, wait_until_up

BIN = Path(sys.executable).parent
REDACTED = "[redacted]"  # what portal.accesslog writes in place of a token


def _secret(name: str) -> str:
    return f"{name}{secrets.token_hex(12)}"


def _raw_get(port: int, target: str, headers: dict[str, str] | None = None) -> bytes:
    """One GET written byte for byte (no client library tidies the target or headers)."""
    lines = [f"GET {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


class Probe:
    """Requests that put a bearer token, or a would-be line break, into a request line."""

    def __init__(self) -> None:
        self.secrets = {
            name: _secret(name)
            for name in ("linktoken", "assertion", "encodedname", "receipt", "referer", "plusname")
        }

    def send(self, port: int) -> int:
        s = self.secrets
        targets = [
            f"/preferences?token={s['linktoken']}",
            f"/preferences?assertion={s['assertion']}.00ff",
            f"/preferences?from=push&%74oken={s['encodedname']}",
            f"/preferences/erasure-receipt/{s['receipt']}",
            f"/preferences?x=1&token={s['plusname']}&y=2",
            # A line break written into the path, encoded and as the server decodes it.
            "/policy/v1%0aFORGED-LINE%0d%0aFORGED-TOO",
            "/no/such%0a127.0.0.1%20-%20-%20FORGED",
        ]
        for target in targets:
            assert _raw_get(port, target).startswith(b"HTTP/1.")
        # The page a token link failed on is the Referer of its stylesheet.
        referer = f"http://127.0.0.1:{port}/preferences?token={s['referer']}"
        assert _raw_get(port, "/static/css/portal.css", {"Referer": referer}).startswith(b"HTTP/")
        # A header with terminal control characters (gunicorn refuses it outright).
        agent = {"User-Agent": "agent\x1b[2J\x07\x0bwith controls"}
        assert _raw_get(port, "/static/img/icon.svg", agent).startswith(b"HTTP/1.")
        return len(targets) + 1

    def check(self, output: str) -> list[str]:
        """The request lines of ``output``, after asserting nothing leaked or was forged."""
        leaked = [name for name, value in self.secrets.items() if value in output]
        assert leaked == [], f"bearer tokens in the log: {leaked}\n{output}"
        assert REDACTED in output
        forged = [line for line in output.splitlines() if line.startswith("FORGED")]
        assert forged == [], output
        assert "\x1b[2J" not in output and "\x07" not in output and "\x0b" not in output
        return [line for line in output.splitlines() if "HTTP/1.1" in line]


@pytest.mark.slow
def test_gunicorn_s_access_log_has_no_token_and_no_forged_line(tmp_path):
    port = free_port()
    environ = clean_environ(
        PORTAL_INSTANCE_PATH=str(tmp_path / "instance"),
        PORTAL_BIND=f"127.0.0.1:{port}",
        PORTAL_SCHEDULER="off",
        WEB_CONCURRENCY="1",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
    )
    (tmp_path / "metrics").mkdir()
    subprocess.run(
        [BIN / "flask", "--app", "app", "db", "upgrade"],
        cwd=ROOT,
        env=environ,
        check=True,
        capture_output=True,
    )
    process = subprocess.Popen(
        [BIN / "gunicorn", "-c", "gunicorn.conf.py", "app:app"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    probe = Probe()
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", process)
        sent = probe.send(port)
        time.sleep(0.5)  # the access log is written after the answer
    finally:
        output = stop(process)
    lines = probe.check(output)
    assert len(lines) >= sent  # every request was logged (and /healthz)
    assert f"/preferences?token={REDACTED}" in output
    assert f"/preferences/erasure-receipt/{REDACTED}" in output
    assert f"/preferences?from=push&%74oken={REDACTED}" in output


@pytest.mark.slow
def test_the_development_server_s_log_has_no_token_and_no_forged_line(tmp_path):
    port = free_port()
    environ = clean_environ(PORTAL_INSTANCE_PATH=str(tmp_path / "instance"), PORTAL_SCHEDULER="off")
    process = subprocess.Popen(
        [BIN / "flask", "--app", "app", "run", "--port", str(port)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    probe = Probe()
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", process)
        sent = probe.send(port)
        time.sleep(0.5)
    finally:
        output = stop(process)
    lines = probe.check(output)
    assert len(lines) >= sent
    assert f"/preferences?token={REDACTED}" in output
    assert f"/preferences/erasure-receipt/{REDACTED}" in output


def test_the_portal_s_own_lines_escape_the_path(caplog, tmp_path):
    """The portal logs the path of a request answered 503 (database down), and Flask the
    path of one that crashed: a decoded line break must not start a line of its own."""
    from portal import create_app
    from tests.conftest import make_settings

    app = create_app(
        make_settings(f"sqlite:///{tmp_path / 'absent' / 'portal.sqlite3'}", str(tmp_path))
    )
    app.config["PROPAGATE_EXCEPTIONS"] = False
    receipt = _secret("receipt")

    @app.get("/crash/<path:rest>")
    def crash(rest: str) -> str:
        raise RuntimeError("boom")

    caplog.set_level(logging.INFO)
    client = app.test_client()
    # A control character or a space in a route parameter is refused before anything
    # needs the database (404: no notice version could be named so), so only well-formed
    # paths reach the 503 line.
    assert client.get("/policy/v1%0aFORGED%20line").status_code == 404
    assert client.get("/policy/v1%20line").status_code == 404
    assert client.get("/policy/v1-line").status_code == 503
    assert client.get(f"/crash/x%0dFORGED/preferences/erasure-receipt/{receipt}").status_code == 404
    assert client.get(f"/crash/x//preferences/erasure-receipt/{receipt}").status_code == 500
    texts = [r.getMessage() for r in caplog.records if r.name == "portal"]
    assert any("/policy/v1-line" in t for t in texts), texts
    assert any("/crash/x/preferences/erasure-receipt/[redacted]" in t for t in texts), texts
    assert all("\n" not in t and "\r" not in t for t in texts)
    assert all(receipt not in t for t in texts)
    app.extensions["portal.db"].engine.dispose()


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/preferences?token=abc", f"/preferences?token={REDACTED}"),
        ("/preferences?assertion=a.b&x=1", f"/preferences?assertion={REDACTED}&x=1"),
        ("/preferences?tok%65n=abc", f"/preferences?tok%65n={REDACTED}"),
        ("/preferences?token", "/preferences?token"),  # nothing to hide
        ("/preferences/erasure-receipt/abc.def", f"/preferences/erasure-receipt/{REDACTED}"),
        ("//preferences//erasure-receipt/abc", f"/preferences/erasure-receipt/{REDACTED}"),
        ("/pr%65ferences/erasure-receipt/abc", f"/preferences/erasure-receipt/{REDACTED}"),
        (
            "https://portal.example/preferences?token=abc",
            f"https://portal.example/preferences?token={REDACTED}",
        ),
        ("/staff/audit?action=x&page=2", "/staff/audit?action=x&page=2"),
        # Whom the compliance look-up searched for stays out of the logs; its page does not.
        (
            "/staff/compliance/lookup?q=acct-42&page=2",
            f"/staff/compliance/lookup?q={REDACTED}&page=2",
        ),
        (
            "/staff/compliance/lookup?page=2&%71=K7QM",
            f"/staff/compliance/lookup?page=2&%71={REDACTED}",
        ),
        ("/static/css/portal.css", "/static/css/portal.css"),
    ],
)
def test_redact_target(target, expected):
    from portal.accesslog import redact_target

    assert redact_target(target) == expected


_URL_CHARS = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters="&#? \t\r\n"), min_size=8
)


@given(value=_URL_CHARS, before=st.sampled_from(["", "a=1&", "from=push&"]))
@example(value="assertio", before="")
def test_no_token_value_survives_redaction(value, before):
    from portal.accesslog import redact_target

    for name in ("token", "assertion", "%74oken", "assertio%6E"):
        redacted = redact_target(f"/preferences?{before}{name}={value}")
        # Only what follows the name's "=" may not hold the value: the name itself can
        # (a value of "assertio" is inside "assertio%6E").
        kept = redacted.partition("?")[2].replace(before, "", 1).partition("=")[2]
        assert value not in kept
    assert value not in redact_target(f"/preferences/erasure-receipt/{value}").rpartition("/")[2]


@given(st.text())
def test_escaped_text_holds_no_control_character(text):
    from portal.accesslog import escape_log_text

    escaped = escape_log_text(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in escaped)
    assert "\u2028" not in escaped and "\u2029" not in escaped


def test_gunicorn_atoms_of_any_format_are_safe():
    from portal.accesslog import access_atoms

    safe = access_atoms(
        {
            "r": "GET /preferences?token=abc&x=1 HTTP/1.1",
            "U": "/preferences/erasure-receipt/abc\n",
            "q": "assertion=abc.def",
            "f": "https://portal.example/preferences?token=abc",
            "{authorization}i": "Bearer scrape-token",
            "{cookie}i": "portal_subscriber=abc",
            "{set-cookie}o": "portal_device=abc; HttpOnly",
            "{referer}i": "https://portal.example/preferences?assertion=abc",
            "{query_string}e": "token=abc",
            "a": "agent\x1b[2J\r\nFORGED",
            "s": "200",
            "B": 1234,
        }
    )
    assert all("abc" not in str(value) for value in safe.values()), safe
    assert "scrape-token" not in str(safe)
    assert safe["r"] == f"GET /preferences?token={REDACTED}&x=1 HTTP/1.1"
    assert safe["{authorization}i"] == REDACTED
    assert safe["a"] == "agent\\x1b[2J\\x0d\\x0aFORGED"
    assert safe["B"] == 1234


_LINE_PARTS = st.sampled_from(
    [" ", "/", "?", "&", "=", "%", "%2F", "%3d", "+", "token", "q", "assertion", "x", "GET"]
) | st.sampled_from(["/preferences", "/erasure-receipt/", "erasure-receipt", "//", '"', "abc"])


@given(st.lists(_LINE_PARTS | st.text(max_size=3)).map("".join))
@example("GET /preferences/erasure-receipt/abc HTTP/1.1")
@example('"GET /pr%65ferences/erasure-receipt/abc HTTP/1.1"')
@example("ref /a?q=who")
def test_a_line_with_nothing_to_redact_is_let_through_as_every_word_would_be(text):
    """redact_words skips the word-by-word pass when the text holds no "=", "%" or
    receipt path: whatever the text, its answer is that pass's answer."""
    from portal.accesslog import redact_target, redact_words

    assert redact_words(text) == re.sub(r"\S+", lambda m: redact_target(m.group(0)), text)


def test_an_access_line_shows_each_atom_as_access_atoms_makes_it_and_quotes_escaped():
    """gunicorn's access line reads only the atoms its format names: each is made safe as
    it is read, as access_atoms would make it, then quoted as gunicorn's SafeAtoms does
    (a "{header}" atom found whatever its case, a missing atom "-")."""
    from portal.accesslog import SafeAccessAtoms, access_atoms

    raw = {
        "r": 'GET /preferences?token=abc"x HTTP/1.1',
        "a": 'agent "quoted"\r\nFORGED',
        "{cookie}i": "portal_subscriber=abc",
        "{referer}i": "https://portal.example/preferences?assertion=abc",
        "{x-request-id}i": "req-1",
        "s": "303",
        "B": 189,
    }
    safe = SafeAccessAtoms(raw)
    made = access_atoms(raw)
    for key in ("r", "a", "{cookie}i", "{referer}i", "{x-request-id}i", "s"):
        assert safe[key] == made[key].replace('"', '\\"')
    assert safe["{X-Request-ID}i"] == "req-1"
    assert safe["B"] == 189
    assert safe["{absent}i"] == "-" and safe["z"] == "-"
    # As gunicorn writes the line: access_log_format % atoms.
    line = "%(r)s %(a)s %({cookie}i)s %({Referer}i)s %(B)s" % safe  # noqa: UP031
    assert "abc" not in line and "\r" not in line and "\n" not in line
