"""A fake push service over HTTPS on loopback, for tests and benchmarks.

It speaks enough RFC 8030 to hold a sender to the rules: ``POST /push/<token>``, ``TTL``
and ``Content-Encoding: aes128gcm`` required, ``Urgency`` and ``Topic`` checked when
present, the VAPID ``Authorization`` verified (signature with the ``k=`` key, ``aud`` =
this origin, ``exp`` ahead but at most 24 h), bodies over 4096 bytes refused with 413,
and 201 with a ``Location`` for a message it takes. It then *decrypts* every accepted
body with the private key of the subscription (registered by the test, as the browser
would hold it), so a test proves the browser could read what was sent.

Answers are scriptable per endpoint token (``script(token, 429, Answer.slow(3), ...)``):
any status with headers such as Retry-After, a delay before answering, or a reset
connection. Once a token's script is used up it answers ``default_answer`` (201).

TLS uses a throwaway CA made at start; :attr:`FakePushService.ca_bundle` is its PEM file,
what the sender passes as ``PUSH_CA_BUNDLE``. The server is a small HTTP/1.1 server
with keep-alive: one thread, non-blocking sockets and a selector, with slow answers on a
timer heap. It takes about 50 µs of CPU per request with every check but decryption;
``ThreadingHTTPServer`` (a thread per connection, headers through the e-mail parser)
took about 110 µs answering without checking anything, and a send benchmark can only
measure a sender that is faster than its service.

:class:`FakePushProcess` runs the same service in a child process, so a benchmark's
client and server do not share one interpreter lock.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import datetime as dt
import heapq
import ipaddress
import itertools
import json
import multiprocessing
import multiprocessing.connection
import re
import selectors
import socket
import ssl
import struct
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from portal.clock import Clock, SystemClock
from tests.factories import BrowserSubscription, SubscriptionFactory
from tests.push_decrypt import DecryptError, decrypt

MAX_BODY_BYTES = 4096
HEADER_LENGTH = 86  # salt(16) ‖ rs(4) ‖ idlen(1) ‖ a 65-byte key id
MAX_VAPID_LIFETIME = dt.timedelta(hours=24)
URGENCIES = frozenset({"very-low", "low", "normal", "high"})
_TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")
_REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    410: "Gone",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


# --- what the push service checks -------------------------------------------------------


class VapidRejected(ValueError):
    """The Authorization header does not carry a valid VAPID token for this service."""


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_vapid_header(value: str) -> tuple[str, str]:
    """``vapid t=<jwt>, k=<key>`` → (jwt, key)."""
    scheme, _, params = value.strip().partition(" ")
    if scheme.lower() != "vapid":
        raise VapidRejected(f"authorization scheme is {scheme!r}, not vapid")
    found: dict[str, str] = {}
    for part in params.split(","):
        name, _, item = part.strip().partition("=")
        found[name.strip().lower()] = item.strip()
    if not found.get("t") or not found.get("k"):
        raise VapidRejected("vapid authorization needs both t= and k=")
    return found["t"], found["k"]


def verify_vapid(
    authorization: str, *, audience: str, now: dt.datetime
) -> tuple[dict[str, Any], str]:
    """Check a VAPID header as a push service does (RFC 8292 §2–4); returns (claims, key).

    The ES256 signature must verify with the ``k=`` public key, ``aud`` must be this
    service's origin, ``exp`` must lie ahead of ``now`` by at most 24 hours, and ``sub``
    must be a ``mailto:`` or ``https:`` URI.
    """
    jwt, key_text = parse_vapid_header(authorization)
    try:
        header_b64, claims_b64, signature_b64 = jwt.split(".")
        header = json.loads(_b64url_decode(header_b64))
        claims = json.loads(_b64url_decode(claims_b64))
        signature = _b64url_decode(signature_b64)
        key_bytes = _b64url_decode(key_text)
    except (ValueError, binascii.Error) as error:
        raise VapidRejected(f"malformed token: {error}") from None
    if header.get("alg") != "ES256":
        raise VapidRejected(f"alg is {header.get('alg')!r}, not ES256")
    if len(signature) != 64:
        raise VapidRejected("signature is not the 64-byte r ‖ s form")
    try:
        public_key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key_bytes)
    except ValueError:
        raise VapidRejected("k= is not a P-256 public key") from None
    der = encode_dss_signature(
        int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    )
    try:
        public_key.verify(
            der, f"{header_b64}.{claims_b64}".encode("ascii"), ec.ECDSA(hashes.SHA256())
        )
    except InvalidSignature:
        raise VapidRejected("signature does not verify with k=") from None
    if claims.get("aud") != audience:
        raise VapidRejected(f"aud is {claims.get('aud')!r}, not {audience!r}")
    exp = claims.get("exp")
    if not isinstance(exp, int):
        raise VapidRejected("exp is missing or not a whole number")
    left = exp - now.timestamp()
    if left <= 0:
        raise VapidRejected("token has expired")
    if left > MAX_VAPID_LIFETIME.total_seconds():
        raise VapidRejected("exp lies more than 24 hours ahead")
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject.startswith(("mailto:", "https:")):
        raise VapidRejected("sub must be a mailto: or https: URI")
    return claims, key_text


# --- scripted answers and what was received ---------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One scripted answer: a status and headers, possibly after a delay, or a reset."""

    status: int = 201
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    reset: bool = False
    body: bytes = b""

    @classmethod
    def of(cls, status: int, retry_after: str | float | None = None) -> Answer:
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        return cls(status, headers)

    @classmethod
    def slow(cls, seconds: float, then: Answer | int = 201) -> Answer:
        """Answer ``then`` only after ``seconds`` (a sender's read time-out fires first)."""
        base = then if isinstance(then, Answer) else Answer(then)
        return cls(base.status, base.headers, seconds, base.reset, base.body)

    @classmethod
    def connection_reset(cls) -> Answer:
        """Close the connection with a TCP reset instead of answering."""
        return cls(reset=True)


@dataclass(frozen=True)
class Received:
    """One request that got an answer (a reset gets none and is only counted)."""

    token: str
    status: int
    headers: Mapping[str, str]
    body: bytes
    plaintext: bytes | None
    at: dt.datetime
    error: str | None = None


@dataclass
class Stats:
    connections: int = 0
    requests: int = 0
    accepted: int = 0
    decrypted: int = 0
    resets: int = 0
    distinct_tokens: int = 0  # tokens with at least one accepted message

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


# --- TLS: a throwaway certificate authority ---------------------------------------------


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A new CA and a server certificate for 127.0.0.1 and localhost; returns the PEM
    paths (ca, server certificate, server key)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake push test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = folder / "fake-push-ca.pem"
    cert_path = folder / "fake-push-server.pem"
    key_path = folder / "fake-push-server.key"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


# --- the service ------------------------------------------------------------------------


class _Closed(Exception):
    """The peer went away or sent something that ends the connection."""


@dataclass(frozen=True)
class _Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    answer: Answer | None = None
    token: str | None = None
    plaintext: bytes | None = None
    error: str | None = None


class _Connection:
    """One client connection on the service's event loop."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self.handshaken = False
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.paused = False  # a slow answer is pending; later requests wait for it
        self.close_after_write = False
        self.closed = False
        self.events = selectors.EVENT_READ


@dataclass(frozen=True)
class _Delayed:
    """A request answered at once or, for a slow answer, when its timer fires."""

    conn: _Connection
    reply: _Reply
    headers: Mapping[str, str]
    body: bytes
    keep_alive: bool


@dataclass(frozen=True)
class _Subscriber:
    private_key: ec.EllipticCurvePrivateKey
    auth: bytes
    public_key: bytes  # the p256dh point, kept to spare a conversion per message


class FakePushService:
    """The push service; use as a context manager or call :meth:`start` / :meth:`stop`.

    ``decrypt`` (on by default) opens every accepted body with the registered keys; an
    unregistered token then gets 404, as a push service answers for an unknown
    subscription. ``record`` keeps every answered request for :meth:`received`.

    ``decrypt_sample=(first, every)`` (benchmarks only) decrypts a deterministic sample
    instead of every body: the first ``first`` accepted messages and then every
    ``every``-th (the n-th accepted message, counting from 1, when n ≤ first or n is a
    multiple of every). Every request is still parsed in full, its headers and VAPID
    checked, its token must be registered and its body must carry a well-formed
    ``aes128gcm`` header; the sampled plaintexts are kept for :meth:`samples`. Decryption
    costs as much as a sender's encryption, and on a small machine it takes the CPU the
    sender under test competes for.
    """

    def __init__(
        self,
        *,
        decrypt: bool = True,
        decrypt_sample: tuple[int, int] | None = None,
        record: bool = True,
        default_answer: Answer | int = 201,
        clock: Clock | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.decrypt = decrypt
        if decrypt_sample is not None and (decrypt_sample[0] < 0 or decrypt_sample[1] < 1):
            raise ValueError("decrypt_sample is (first ≥ 0, every ≥ 1)")
        self.decrypt_sample = decrypt_sample
        self.record = record
        self._samples: list[tuple[str, bytes]] = []
        self._accepted_tokens: set[str] = set()
        self.default_answer = (
            default_answer if isinstance(default_answer, Answer) else Answer(default_answer)
        )
        self.clock: Clock = clock or SystemClock()
        self.host = host
        self.port = 0
        self.stats = Stats()
        self._lock = threading.Lock()
        self._scripts: dict[str, collections.deque[Answer]] = collections.defaultdict(
            collections.deque
        )
        self._subscribers: dict[str, _Subscriber] = {}
        self._received: list[Received] = []
        self._verified_tokens: dict[str, tuple[str, int]] = {}  # jwt → (key, exp)
        self._message_ids = itertools.count(1)
        self._open: set[_Connection] = set()
        self._timers: list[tuple[float, int, _Delayed]] = []
        self._timer_ids = itertools.count()
        self._stopping = threading.Event()
        self._loop: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._waker: tuple[socket.socket, socket.socket] | None = None
        self._selector: selectors.BaseSelector | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._factory = SubscriptionFactory()
        self.ca_bundle = ""

    # lifecycle

    def start(self) -> FakePushService:
        self._tmp = tempfile.TemporaryDirectory(prefix="fakepush-")
        ca_path, cert_path, key_path = make_certificates(Path(self._tmp.name))
        self.ca_bundle = str(ca_path)
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert_path, key_path)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(256)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._waker = socket.socketpair()
        self._waker[0].setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._waker[0], selectors.EVENT_READ, "wake")
        self._loop = threading.Thread(target=self._run, name="fakepush", daemon=True)
        self._loop.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._waker is not None:
            with contextlib.suppress(OSError):
                self._waker[1].send(b"x")
        if self._loop is not None:
            self._loop.join(timeout=10)
            self._loop = None
        if self._waker is not None:
            self._waker[1].close()
            self._waker = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> FakePushService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # addresses and subscriptions

    @property
    def origin(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def endpoint_base(self) -> str:
        return f"{self.origin}/push/"

    def endpoint(self, token: str) -> str:
        return self.endpoint_base + token

    def register(self, token: str, private_key: ec.EllipticCurvePrivateKey, auth: bytes) -> None:
        """Tell the service the keys the browser behind ``token`` holds."""
        public_key = private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        with self._lock:
            self._subscribers[token] = _Subscriber(private_key, auth, public_key)

    def subscribe(self, token: str | None = None) -> BrowserSubscription:
        """A new browser subscription on this service, registered for decryption."""
        subscription = self._factory(base=self.endpoint_base, token=token)
        self.register(token_of(subscription), subscription.private_key, subscription.auth)
        return subscription

    # scripting and inspection

    def script(self, target: str | BrowserSubscription, *answers: Answer | int) -> None:
        """Queue answers for the next requests to one token, in order."""
        token = target if isinstance(target, str) else token_of(target)
        with self._lock:
            self._scripts[token].extend(a if isinstance(a, Answer) else Answer(a) for a in answers)

    def received(self, target: str | BrowserSubscription | None = None) -> list[Received]:
        """Answered requests, all or for one token, oldest first."""
        token = target if target is None or isinstance(target, str) else token_of(target)
        with self._lock:
            return [r for r in self._received if token is None or r.token == token]

    def plaintexts(self, target: str | BrowserSubscription) -> list[bytes]:
        """What the browser behind ``target`` could read, in arrival order."""
        return [r.plaintext for r in self.received(target) if r.plaintext is not None]

    # the server: one thread, non-blocking sockets, a selector and a timer heap

    def _run(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while not self._stopping.is_set():
                timeout = None
                if self._timers:
                    timeout = max(0.0, self._timers[0][0] - time.monotonic())
                for key, mask in selector.select(timeout):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            key.fileobj.recv(64)  # type: ignore[union-attr]
                    else:
                        self._pump(key.data, mask)
                self._run_due_timers()
        finally:
            for conn in list(self._open):
                self._close(conn)
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            if self._waker is not None:
                self._waker[0].close()
            selector.close()

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:  # BlockingIOError: nobody else is waiting
                return
            raw.setblocking(False)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = self._tls.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            conn = _Connection(tls)
            self.stats.connections += 1
            self._open.add(conn)
            self._selector.register(tls, selectors.EVENT_READ, conn)

    def _pump(self, conn: _Connection, mask: int = selectors.EVENT_READ) -> None:
        """Move a connection along: handshake, read, answer what is complete, write."""
        try:
            if not conn.handshaken:
                try:
                    conn.sock.do_handshake()
                except ssl.SSLWantReadError:
                    self._watch(conn, write=False)
                    return
                except ssl.SSLWantWriteError:
                    self._watch(conn, write=True)
                    return
                conn.handshaken = True
            if mask & selectors.EVENT_READ:
                self._read(conn)
            while not conn.paused and not conn.closed and self._next_request(conn):
                pass
            self._flush(conn)
        except (_Closed, OSError):
            # A client that hung up or failed the handshake, or a request this service
            # could not parse: either way this connection is over.
            self._close(conn)

    def _read(self, conn: _Connection) -> None:
        while True:
            try:
                data = conn.sock.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return
            if not data:
                raise _Closed
            conn.inbuf += data
            if len(conn.inbuf) > 2 << 20:
                raise _Closed

    def _next_request(self, conn: _Connection) -> bool:
        """Answer the first complete request in the buffer; False when there is none."""
        end = conn.inbuf.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.inbuf) > 65536:
                raise _Closed
            return False
        lines = conn.inbuf[:end].decode("latin-1").split("\r\n")
        try:
            method, target, _version = lines[0].split()
        except ValueError:
            raise _Closed from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        keep_alive = headers.get("connection", "").lower() != "close"
        if "transfer-encoding" in headers:
            self._queue(conn, _Reply(411, body=b"send a Content-Length"), keep_alive=False)
            return False
        try:
            length = int(headers.get("content-length") or "0")
        except ValueError:
            self._queue(conn, _Reply(400, body=b"bad Content-Length"), keep_alive=False)
            return False
        if length > 1 << 20:
            self._queue(conn, _Reply(413, body=b"far too large"), keep_alive=False)
            return False
        total = end + 4 + length
        if len(conn.inbuf) < total:
            return False
        body = bytes(conn.inbuf[end + 4 : total])
        del conn.inbuf[:total]
        self.stats.requests += 1
        reply = self._handle(method, target, headers, body)
        delayed = _Delayed(conn, reply, headers, body, keep_alive)
        if reply.answer is not None and reply.answer.delay:
            conn.paused = True  # HTTP/1.1 answers in order: later requests wait
            due = time.monotonic() + reply.answer.delay
            heapq.heappush(self._timers, (due, next(self._timer_ids), delayed))
            return False
        self._complete(delayed)
        return not conn.closed

    def _complete(self, done: _Delayed) -> None:
        conn, reply = done.conn, done.reply
        if reply.answer is not None and reply.answer.reset:
            self.stats.resets += 1
            if not conn.closed:
                # SO_LINGER 0: close() sends a TCP RST, the client sees a reset connection.
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self._close(conn)
            return
        if reply.token is not None and self.record:
            # Recorded even when the client gave up waiting: the service did take it.
            record = Received(
                reply.token,
                reply.status,
                done.headers,
                done.body,
                reply.plaintext,
                self.clock.now(),
                error=reply.error,
            )
            with self._lock:
                self._received.append(record)
        if not conn.closed:
            self._queue(conn, reply, keep_alive=done.keep_alive)

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, done = heapq.heappop(self._timers)
            self._complete(done)
            if not done.conn.closed:
                done.conn.paused = False
                self._pump(done.conn, 0)

    def _queue(self, conn: _Connection, reply: _Reply, *, keep_alive: bool) -> None:
        lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Unknown')}"]
        lines.extend(f"{name}: {value}" for name, value in reply.headers.items())
        lines.append(f"Content-Length: {len(reply.body)}")
        if not keep_alive:
            lines.append("Connection: close")
            conn.close_after_write = True
        conn.outbuf += ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body

    def _flush(self, conn: _Connection) -> None:
        while conn.outbuf and not conn.closed:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (ssl.SSLWantWriteError, BlockingIOError):
                self._watch(conn, write=True)
                return
            except ssl.SSLWantReadError:
                self._watch(conn, write=False)
                return
            del conn.outbuf[:sent]
        if conn.close_after_write:
            self._close(conn)
        elif not conn.closed:
            self._watch(conn, write=False)

    def _watch(self, conn: _Connection, *, write: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        if conn.events != events and not conn.closed and self._selector is not None:
            self._selector.modify(conn.sock, events, conn)
            conn.events = events

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._open.discard(conn)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> _Reply:
        if not target.startswith("/push/") or len(target) <= len("/push/"):
            return _Reply(404, body=b"no such push resource")
        token = target[len("/push/") :]
        if method != "POST":
            return _Reply(405, {"Allow": "POST"}, token=token, error="method")

        def refuse(status: int, reason: str) -> _Reply:
            message = json.dumps({"code": status, "error": reason}).encode()
            content_type = {"Content-Type": "application/json"}
            return _Reply(status, content_type, message, token=token, error=reason)

        if len(body) > MAX_BODY_BYTES:
            return refuse(413, f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
        try:
            self._check_vapid(headers.get("authorization"))
        except VapidRejected as rejected:
            return refuse(401, f"vapid: {rejected}")
        ttl = headers.get("ttl")
        if ttl is None or not ttl.isdigit():
            return refuse(400, "TTL header missing or not a whole number")
        if headers.get("content-encoding", "").lower() != "aes128gcm":
            return refuse(400, "Content-Encoding must be aes128gcm")
        urgency = headers.get("urgency")
        if urgency is not None and urgency not in URGENCIES:
            return refuse(400, f"unknown Urgency {urgency!r}")
        topic = headers.get("topic")
        if topic is not None and not _TOPIC.fullmatch(topic):
            return refuse(400, "Topic must be 1-32 base64url characters")

        with self._lock:
            queue = self._scripts.get(token)
            answer = queue.popleft() if queue else self.default_answer
            subscriber = self._subscribers.get(token)
        if answer.reset or not 200 <= answer.status < 300:
            return _Reply(answer.status, dict(answer.headers), answer.body, answer, token)
        plaintext = None
        if self.decrypt:
            if subscriber is None:
                return _Reply(404, {}, b"unknown subscription", answer, token, error="unregistered")
            if self._sampled(self.stats.accepted + 1):
                try:
                    plaintext = decrypt(
                        body,
                        subscriber.private_key,
                        subscriber.auth,
                        ua_public=subscriber.public_key,
                    )
                except DecryptError as error:
                    return refuse(400, f"does not decrypt: {error}")
            else:
                problem = _malformed(body)
                if problem:
                    return refuse(400, f"not an aes128gcm body: {problem}")
        with self._lock:
            self.stats.accepted += 1
            self._accepted_tokens.add(token)
            self.stats.distinct_tokens = len(self._accepted_tokens)
            if plaintext is not None:
                self.stats.decrypted += 1
                if self.decrypt_sample is not None:
                    self._samples.append((token, plaintext))
            message_id = next(self._message_ids)
        out = {"Location": f"{self.origin}/message/{message_id}", **answer.headers}
        return _Reply(answer.status, out, answer.body, answer, token, plaintext)

    def _sampled(self, n: int) -> bool:
        if self.decrypt_sample is None:
            return True
        first, every = self.decrypt_sample
        return n <= first or n % every == 0

    def samples(self) -> list[tuple[str, bytes]]:
        """(token, plaintext) of each message decrypted under ``decrypt_sample``."""
        with self._lock:
            return list(self._samples)

    def forget_tokens(self) -> None:
        """Start counting ``stats.distinct_tokens`` afresh (e.g. before the next way)."""
        with self._lock:
            self._accepted_tokens.clear()
            self.stats.distinct_tokens = 0

    def _check_vapid(self, authorization: str | None) -> None:
        if not authorization:
            raise VapidRejected("no Authorization header")
        now = self.clock.now()
        jwt, key = parse_vapid_header(authorization)
        with self._lock:
            seen = self._verified_tokens.get(jwt)
        # A token already verified needs only its key and expiry checked again; an ECDSA
        # verification per request would make this service the benchmark's bottleneck.
        lifetime = MAX_VAPID_LIFETIME.total_seconds()
        if seen is not None and key == seen[0] and 0 < seen[1] - now.timestamp() <= lifetime:
            return
        claims, key = verify_vapid(authorization, audience=self.origin, now=now)
        with self._lock:
            self._verified_tokens[jwt] = (key, claims["exp"])


def _malformed(body: bytes) -> str | None:
    """What is wrong with an ``aes128gcm`` body's framing, without decrypting it: the
    header (salt, record size, a 65-byte P-256 key id) and room for a tag and delimiter."""
    if len(body) < HEADER_LENGTH + 17:
        return f"{len(body)} bytes is shorter than a header and one record"
    (record_size,) = struct.unpack("!I", body[16:20])
    if record_size < 18:
        return f"record size {record_size} is below the minimum of 18"
    if body[20] != 65 or body[21] != 0x04:
        return "the key id is not an uncompressed P-256 point"
    return None


def token_of(subscription: BrowserSubscription) -> str:
    """The token at the end of a fake-service endpoint."""
    return subscription.endpoint.rsplit("/", 1)[1]


# --- in a child process, for benchmarks -------------------------------------------------


def _serve_in_child(conn: multiprocessing.connection.Connection, options: dict[str, Any]) -> None:
    service = FakePushService(**options).start()
    try:
        conn.send((service.origin, service.ca_bundle))
        while True:
            command, argument = conn.recv()
            if command == "register":
                for token, scalar, auth in argument:
                    private = ec.derive_private_key(int.from_bytes(scalar, "big"), ec.SECP256R1())
                    service.register(token, private, auth)
                conn.send(None)
            elif command == "stats":
                conn.send(service.stats.as_dict())
            elif command == "received":
                conn.send(service.received())
            elif command == "samples":
                conn.send(service.samples())
            elif command == "forget_tokens":
                service.forget_tokens()
                conn.send(None)
            elif command == "script":
                with service._lock:
                    service._scripts.clear()  # what the last script left unanswered
                for token, answers in argument:
                    service.script(token, *answers)
                conn.send(None)
            elif command == "stop":
                break
    finally:
        service.stop()
        conn.close()


class FakePushProcess:
    """:class:`FakePushService` in a child process; registration and stats over a pipe.

    For benchmarks: with the server in its own interpreter, the sender under test has a
    core (and the interpreter lock) to itself, as it would against a real push service.
    For tests with several sending processes: one service records what all of them sent.
    """

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.origin = ""
        self.ca_bundle = ""
        self._pipe: multiprocessing.connection.Connection | None = None
        self._process: Any = None

    def start(self) -> FakePushProcess:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(
            target=_serve_in_child, args=(child, self.options), daemon=True
        )
        self._process.start()
        child.close()
        self._pipe = parent
        self.origin, self.ca_bundle = parent.recv()
        return self

    @property
    def endpoint_base(self) -> str:
        return f"{self.origin}/push/"

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    @property
    def decrypting(self) -> bool:
        return bool(self.options.get("decrypt", True))

    def register_many(self, subscriptions: Iterable[BrowserSubscription]) -> None:
        assert self._pipe is not None
        batch = [
            (
                token_of(s),
                s.private_key.private_numbers().private_value.to_bytes(32, "big"),
                s.auth,
            )
            for s in subscriptions
        ]
        self._pipe.send(("register", batch))
        self._pipe.recv()

    def stats(self) -> dict[str, int]:
        assert self._pipe is not None
        self._pipe.send(("stats", None))
        return self._pipe.recv()

    def received(self) -> list[Received]:
        """Every answered request so far, oldest first (with ``record`` on)."""
        assert self._pipe is not None
        self._pipe.send(("received", None))
        return self._pipe.recv()

    def samples(self) -> list[tuple[str, bytes]]:
        """(token, plaintext) of each sampled message (with ``decrypt_sample`` set)."""
        assert self._pipe is not None
        self._pipe.send(("samples", None))
        return self._pipe.recv()

    def forget_tokens(self) -> None:
        assert self._pipe is not None
        self._pipe.send(("forget_tokens", None))
        self._pipe.recv()

    def script_many(self, scripts: Iterable[tuple[str, list[Answer | int]]]) -> None:
        """(token, answers): each token's next requests get these answers, in turn; the
        answers scripted before and not given yet are dropped."""
        assert self._pipe is not None
        self._pipe.send(("script", list(scripts)))
        self._pipe.recv()

    def stop(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError, EOFError):
                self._pipe.send(("stop", None))
            self._pipe.close()
            self._pipe = None
        if self._process is not None:
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._process = None

    def __enter__(self) -> FakePushProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def fake_push_service(**options: Any) -> Iterator[FakePushService]:
    """``with fake_push_service() as service: ...``"""
    service = FakePushService(**options).start()
    try:
        yield service
    finally:
        service.stop()
