"""The HTTPS transport end to end against the fake push service: what goes out, what
comes back, and that trouble on the wire becomes a result, never an exception."""

from __future__ import annotations

import datetime as dt
import email.utils
import socket
import time
from pathlib import Path

import pytest

from portal.clock import FrozenClock
from portal.push.encryption import MAX_PLAINTEXT_BYTES, PayloadTooLarge
from portal.push.transport import (
    BatchInterrupted,
    HttpsPushTransport,
    InvalidPushRequest,
    NetworkError,
    PushRequest,
    PushResponse,
    Urgency,
    _Exchange,
    request_headers,
)
from portal.subscriptions.lifecycle import Lifecycle, Outcome, apply_answer
from portal.subscriptions.models import PushService, SubscriptionState
from tests.conftest import make_settings
from tests.fakepush import Answer, fake_push_service
from tests.push.conftest import push_request

SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def test_the_browser_reads_what_was_sent(fake_push, transport):
    sub = fake_push.subscribe()
    response = transport.send(push_request(sub, b'{"title":"Spring sale","id":"d-1"}'))
    assert response.status == 201
    assert response.accepted
    assert response.error is None
    assert response.location is not None
    assert response.location.startswith(f"{fake_push.origin}/message/")
    assert fake_push.plaintexts(sub) == [b'{"title":"Spring sale","id":"d-1"}']


def test_rfc8030_headers_go_out(fake_push, transport, vapid_signer):
    sub = fake_push.subscribe()
    transport.send(push_request(sub, ttl=86400, urgency=Urgency.LOW, topic="campaign-42"))
    transport.send(push_request(sub, ttl=0))
    with_options, plain = (r.headers for r in fake_push.received(sub))
    assert with_options["ttl"] == "86400"
    assert with_options["content-encoding"] == "aes128gcm"
    assert with_options["content-type"] == "application/octet-stream"
    assert with_options["urgency"] == "low"
    assert with_options["topic"] == "campaign-42"
    assert with_options["authorization"] == vapid_signer.authorization(sub.endpoint)
    assert plain["ttl"] == "0"
    assert "urgency" not in plain
    assert "topic" not in plain
    assert "expect" not in plain


def test_request_headers_without_a_transport():
    request = PushRequest("https://push.example.test/x", b"body", 30, Urgency.HIGH, "t1")
    assert request_headers(request, "vapid t=a, k=b") == {
        "TTL": "30",
        "Content-Encoding": "aes128gcm",
        "Content-Type": "application/octet-stream",
        "Authorization": "vapid t=a, k=b",
        "Urgency": "high",
        "Topic": "t1",
    }


@pytest.mark.parametrize("status", [200, 201, 202, 400, 403, 404, 406, 410, 413, 500, 502, 503])
def test_each_answer_reaches_the_caller(fake_push, transport, status):
    sub = fake_push.subscribe()
    fake_push.script(sub, status)
    response = transport.send(push_request(sub))
    assert response.status == status
    assert response.error is None
    assert response.retry_after is None


def test_retry_after_in_seconds_or_as_an_http_date(fake_push, vapid_signer):
    clock = FrozenClock(dt.datetime.now(dt.UTC).replace(microsecond=0))
    later = email.utils.format_datetime(clock.now() + dt.timedelta(seconds=120), usegmt=True)
    sub = fake_push.subscribe()
    fake_push.script(
        sub,
        Answer.of(429, retry_after=45),
        Answer.of(503, retry_after=later),
        Answer.of(429, retry_after="soon"),
    )
    with HttpsPushTransport(vapid_signer, ca_bundle=fake_push.ca_bundle, clock=clock) as sender:
        answers = [sender.send(push_request(sub)) for _ in range(3)]
    assert [(a.status, a.retry_after) for a in answers] == [(429, 45.0), (503, 120.0), (429, None)]
    assert answers[1].headers["retry-after"] == later


def test_answers_feed_the_lifecycle_rules(fake_push, transport):
    sub = fake_push.subscribe()
    fake_push.script(sub, 410, Answer.of(429, retry_after=10), 201)
    active = Lifecycle(SubscriptionState.ACTIVE, 0, True)
    gone, limited, ok = (transport.send(push_request(sub)) for _ in range(3))
    assert apply_answer(active, gone.answer(PushService.FCM)).outcome == Outcome.REVOKED
    retry = apply_answer(active, limited.answer(PushService.FCM))
    assert retry.outcome == Outcome.RETRY
    assert limited.answer().retry_after == 10.0
    assert apply_answer(active, ok.answer()).outcome == Outcome.ACCEPTED


def test_an_error_body_is_kept_short_for_the_log(fake_push, transport):
    sub = fake_push.subscribe()
    fake_push.script(sub, Answer(400, {"Content-Type": "text/plain"}, body=b"E" * 5000))
    response = transport.send(push_request(sub))
    assert response.status == 400
    assert response.detail == "E" * 1024


def test_a_slow_answer_times_out_as_a_result(fake_push, vapid_signer):
    sub = fake_push.subscribe()
    fake_push.script(sub, Answer.slow(5))
    with HttpsPushTransport(vapid_signer, ca_bundle=fake_push.ca_bundle, timeout=0.3) as sender:
        started = time.monotonic()
        response = sender.send(push_request(sub))
        assert time.monotonic() - started < 4  # the time-out, not the answer, ended it
        assert response.status is None
        assert response.error == NetworkError.TIMEOUT
        assert response.answer().status is None
        # The next message goes out on a fresh connection and succeeds.
        assert sender.send(push_request(sub)).status == 201


def test_a_reset_connection_is_a_result(fake_push, transport):
    sub = fake_push.subscribe()
    fake_push.script(sub, Answer.connection_reset())
    response = transport.send(push_request(sub))  # a fresh connection: no second try
    assert response.status is None
    assert response.error == NetworkError.CONNECTION
    assert "reset" in response.detail.lower()
    assert fake_push.stats.resets == 1


def test_a_reset_on_a_reused_connection_is_tried_once_more_on_a_new_one(fake_push, transport):
    # libcurl's rule for keep-alive connections that die before any answer: the request
    # goes once more on a new connection. The second reset is reported.
    sub = fake_push.subscribe()
    assert transport.send(push_request(sub)).status == 201
    fake_push.script(sub, Answer.connection_reset(), Answer.connection_reset())
    response = transport.send(push_request(sub))
    assert response.error == NetworkError.CONNECTION
    assert fake_push.stats.resets == 2
    assert transport.send(push_request(sub)).status == 201  # a fresh, then reused, connection
    fake_push.script(sub, Answer.connection_reset(), 201)
    assert transport.send(push_request(sub)).status == 201
    assert fake_push.stats.requests == 6
    assert fake_push.stats.decrypted == 3


def test_a_refused_connection_is_a_result(vapid_signer):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    request = PushRequest(f"https://127.0.0.1:{port}/push/x", b"x", 0)
    with HttpsPushTransport(vapid_signer, connect_timeout=1) as sender:
        response = sender.send(request)
    assert response.status is None
    assert response.error == NetworkError.CONNECT


def test_sequential_sends_reuse_one_connection(fake_push, transport):
    subs = [fake_push.subscribe() for _ in range(20)]
    for i in range(200):
        assert transport.send(push_request(subs[i % 20])).status == 201
    assert fake_push.stats.connections == 1
    assert transport.connections_opened == 1
    assert fake_push.stats.decrypted == 200


def test_a_batch_answers_in_request_order_over_at_most_concurrency_connections(
    fake_push, vapid_signer
):
    subs = [fake_push.subscribe() for _ in range(40)]
    expected = [(201, 404, 410, 201, 429)[i % 5] for i in range(40)]
    for sub, status in zip(subs, expected, strict=True):
        fake_push.script(sub, status)
    with HttpsPushTransport(vapid_signer, ca_bundle=fake_push.ca_bundle, concurrency=6) as sender:
        answers = sender.send_batch(push_request(s, f"n{i}".encode()) for i, s in enumerate(subs))
        again = sender.send_batch(push_request(s) for s in subs)  # scripts used up: all 201
        assert sender.connections_opened == fake_push.stats.connections
    assert [a.status for a in answers] == expected
    assert [a.status for a in again] == [201] * 40
    assert fake_push.stats.connections <= 6
    for i, sub in enumerate(subs):
        if expected[i] == 201:
            assert fake_push.plaintexts(sub)[0] == f"n{i}".encode()


def test_no_more_than_concurrency_requests_are_in_flight(fake_push, vapid_signer):
    subs = [fake_push.subscribe() for _ in range(12)]
    for sub in subs:
        fake_push.script(sub, Answer.slow(0.15))
    with HttpsPushTransport(vapid_signer, ca_bundle=fake_push.ca_bundle, concurrency=4) as sender:
        started = time.monotonic()
        answers = sender.send_batch(push_request(s) for s in subs)
        elapsed = time.monotonic() - started
    assert [a.status for a in answers] == [201] * 12
    assert elapsed >= 3 * 0.15  # three waves of four
    assert fake_push.stats.connections == 4


def test_requests_are_pulled_lazily_as_slots_free_up(fake_push, vapid_signer):
    subs = [fake_push.subscribe() for _ in range(10)]
    answered_when_pulled: list[int] = []

    def requests_():
        for sub in subs:
            answered_when_pulled.append(fake_push.stats.requests)
            yield push_request(sub)  # the encryption happens here, as slots free up

    with HttpsPushTransport(vapid_signer, ca_bundle=fake_push.ca_bundle, concurrency=3) as sender:
        answers = sender.send_batch(requests_())
    assert [a.status for a in answers] == [201] * 10
    assert answered_when_pulled[:3] == [0, 0, 0]  # the first three fill the slots
    assert all(n >= i - 2 for i, n in enumerate(answered_when_pulled[3:], start=3))


def test_a_failing_request_source_ends_the_batch_with_the_answers_so_far(fake_push, transport):
    subs = [fake_push.subscribe() for _ in range(3)]

    def requests_():
        yield from (push_request(s) for s in subs)
        raise RuntimeError("the database went away")

    with pytest.raises(BatchInterrupted) as caught:
        transport.send_batch(requests_())
    assert [r.status for r in caught.value.responses] == [201, 201, 201]
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert fake_push.stats.decrypted == 3
    assert transport.send(push_request(subs[0])).status == 201  # still usable


def test_one_vapid_signature_for_many_messages(fake_push, transport, vapid_signer):
    subs = [fake_push.subscribe() for _ in range(5)]
    transport.send_batch(push_request(s) for s in subs * 10)
    assert vapid_signer.stats.misses == 1
    assert vapid_signer.stats.hits == 49


def test_the_configured_ca_bundle_is_honoured_whatever_the_environment(
    fake_push, vapid_signer, monkeypatch
):
    # The environment points every usual variable at the system CAs, and a proxy.
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.setenv(name, SYSTEM_BUNDLE)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    sub = fake_push.subscribe()
    with HttpsPushTransport(vapid_signer, ca_bundle=fake_push.ca_bundle) as sender:
        assert sender.send(push_request(sub)).status == 201


def test_without_a_bundle_only_the_system_cas_are_trusted(fake_push, vapid_signer, monkeypatch):
    # requests' and curl's variables naming the fake CA are not consulted.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", fake_push.ca_bundle)
    monkeypatch.setenv("CURL_CA_BUNDLE", fake_push.ca_bundle)
    monkeypatch.setenv("SSL_CERT_FILE", SYSTEM_BUNDLE)
    sub = fake_push.subscribe()
    with HttpsPushTransport(vapid_signer) as sender:
        response = sender.send(push_request(sub))
    assert response.status is None
    assert response.error == NetworkError.TLS
    assert fake_push.stats.requests == 0


def test_from_settings_takes_push_ca_bundle(fake_push, vapid_signer, tmp_path):
    settings = make_settings("sqlite://", str(tmp_path), push_ca_bundle=fake_push.ca_bundle)
    with HttpsPushTransport.from_settings(settings, vapid_signer, timeout=5) as sender:
        assert sender.ca_bundle == fake_push.ca_bundle
        assert sender.send(push_request(fake_push.subscribe())).status == 201
    missing = make_settings("sqlite://", str(tmp_path), push_ca_bundle=str(tmp_path / "nope.pem"))
    with pytest.raises(FileNotFoundError, match="PUSH_CA_BUNDLE"):
        HttpsPushTransport.from_settings(missing, vapid_signer)


def test_a_closed_transport_refuses_to_send(fake_push, vapid_signer):
    sender = HttpsPushTransport(vapid_signer, ca_bundle=fake_push.ca_bundle)
    sender.close()
    sender.close()
    with pytest.raises(RuntimeError, match="closed"):
        sender.send(push_request(fake_push.subscribe()))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"endpoint": "http://push.example.test/x"}, "https"),
        ({"ttl": -1}, "ttl"),
        ({"body": b"x" * 4097}, "4096"),
        ({"urgency": "urgent"}, "urgency"),
        ({"topic": "x" * 33}, "topic"),
        ({"topic": "not/base64url"}, "topic"),
        ({"topic": ""}, "topic"),
        ({"endpoint": "https:///no-host"}, "host"),
        ({"endpoint": "https://push.example.test/a b"}, "characters"),
        ({"endpoint": "https://user@push.example.test/x"}, "user information"),
    ],
)
def test_requests_no_push_service_would_take_are_refused(kwargs, message):
    fields = {"endpoint": "https://push.example.test/x", "body": b"x", "ttl": 0} | kwargs
    with pytest.raises(InvalidPushRequest, match=message):
        PushRequest(**fields)


def test_a_payload_too_large_is_refused_before_sending(fake_push):
    sub = fake_push.subscribe()
    push_request(sub, b"x" * MAX_PLAINTEXT_BYTES)
    with pytest.raises(PayloadTooLarge):
        push_request(sub, b"x" * (MAX_PLAINTEXT_BYTES + 1))


def test_a_second_push_service_gets_its_own_connections_and_token(
    fake_push, vapid_signer, tmp_path
):
    with fake_push_service() as other:
        bundle = tmp_path / "both.pem"
        bundle.write_text(Path(fake_push.ca_bundle).read_text() + Path(other.ca_bundle).read_text())
        subs = [fake_push.subscribe(), other.subscribe(), fake_push.subscribe(), other.subscribe()]
        with HttpsPushTransport(vapid_signer, ca_bundle=str(bundle)) as sender:
            answers = sender.send_batch(push_request(s) for s in subs)
            opened = sender.connections_opened
            again = sender.send_batch(push_request(s) for s in subs)
            assert sender.connections_opened == opened  # the second batch reuses them all
        assert [a.status for a in answers + again] == [201] * 8
        assert other.stats.decrypted == 4
        assert opened == fake_push.stats.connections + other.stats.connections
    assert fake_push.stats.decrypted == 4
    assert vapid_signer.stats.misses == 2


def test_a_response_without_an_answer_maps_to_a_retry():
    response = PushResponse(None, error=NetworkError.TIMEOUT)
    assert not response.accepted
    after = apply_answer(Lifecycle(SubscriptionState.ACTIVE), response.answer())
    assert after.outcome == Outcome.RETRY


def test_only_the_final_response_headers_count_after_an_interim_one():
    exchange = _Exchange()
    exchange.header_lines.extend(
        [
            b"HTTP/1.1 100 Continue\r\n",
            b"X-Interim: yes\r\n",
            b"\r\n",
            b"HTTP/1.1 201 Created\r\n",
            b"Location: https://push.example.test/m/1\r\n",
            b"Via: HTTP/1.1 proxy\r\n",
            b"\r\n",
        ]
    )
    assert exchange.headers() == {
        "location": "https://push.example.test/m/1",
        "via": "HTTP/1.1 proxy",
    }


def test_an_interrupted_batch_leaves_the_transport_usable(fake_push, transport, monkeypatch):
    subs = [fake_push.subscribe() for _ in range(4)]
    calls = 0
    original = transport._finish

    def finish_then_interrupt(*args):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(transport, "_finish", finish_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        transport.send_batch(push_request(s) for s in subs)
    monkeypatch.undo()
    answers = transport.send_batch(push_request(s) for s in subs)
    assert [a.status for a in answers] == [201] * 4
