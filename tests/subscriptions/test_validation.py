"""Validators: property tests for base64url and the host allow-list."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.errors import ValidationError
from portal.subscriptions.validation import (
    HostAllowList,
    decode_b64url,
    push_service_for,
    validate_endpoint,
)

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
DEFAULT = HostAllowList(["fcm.googleapis.com", "*.notify.windows.com", "127.0.0.1:8443"])


@given(st.binary(min_size=16, max_size=16))
def test_b64url_round_trip(raw):
    text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    assert decode_b64url(text, field="f", length=16) == raw


@given(st.binary(min_size=16, max_size=16))
def test_padded_or_standard_alphabet_is_refused(raw):
    text = base64.urlsafe_b64encode(raw).decode()
    with pytest.raises(ValidationError):
        decode_b64url(text, field="f", length=16)  # padded
    standard = base64.b64encode(raw).rstrip(b"=").decode()
    if standard != text.rstrip("="):
        with pytest.raises(ValidationError):
            decode_b64url(standard, field="f", length=16)


def test_non_canonical_trailing_bits_are_refused():
    raw = b"\x00" * 16
    text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()  # ends in 'AA'
    with pytest.raises(ValidationError, match="canonical"):
        decode_b64url(text[:-1] + "B", field="f", length=16)


@given(st.text(max_size=40))
def test_decoder_never_crashes(text):
    try:
        decode_b64url(text, field="f", length=16)
    except ValidationError as error:
        assert error.field == "f"


@given(st.lists(LABEL, min_size=1, max_size=3))
def test_wildcard_matches_subdomains_only_on_a_dot_boundary(labels):
    host = ".".join(labels)
    assert DEFAULT.allows(f"{host}.notify.windows.com", 443)
    assert not DEFAULT.allows(f"{host}notify.windows.com", 443)
    assert not DEFAULT.allows(f"notify.windows.com.{host}", 443)
    assert not DEFAULT.allows(f"{host}.notify.windows.com", 8443)


@given(LABEL)
def test_exact_hosts_match_exactly(label):
    assert not DEFAULT.allows(f"{label}fcm.googleapis.com", 443)
    assert not DEFAULT.allows(f"{label}.fcm.googleapis.com", 443)
    assert not DEFAULT.allows(f"fcm.googleapis.com.{label}", 443)


def test_ports_must_match_the_entry():
    assert DEFAULT.allows("127.0.0.1", 8443)
    assert not DEFAULT.allows("127.0.0.1", 443)
    assert DEFAULT.allows("fcm.googleapis.com", 443)
    assert not DEFAULT.allows("fcm.googleapis.com", 8443)


@given(st.text(max_size=200))
def test_endpoint_validator_never_crashes(text):
    try:
        validate_endpoint(text, allowed=DEFAULT, max_length=4096)
    except ValidationError as error:
        assert error.field == "endpoint"


def test_push_service_derivation():
    assert push_service_for("fcm.googleapis.com") == "fcm"
    assert push_service_for("updates.push.services.mozilla.com") == "autopush"
    assert push_service_for("web.push.apple.com") == "apple"
    assert push_service_for("wns2-by3p.notify.windows.com") == "wns"
    assert push_service_for("127.0.0.1") == "other"
    assert push_service_for("evilgoogleapis.com") == "other"


@pytest.mark.parametrize(
    "text", ["https://[::1/push/x", "https://fcm.googleapis.com]/x", "https://[fe80::1%25/x"]
)
def test_endpoint_that_urlsplit_refuses_is_invalid_not_a_crash(text):
    with pytest.raises(ValidationError) as caught:
        validate_endpoint(text, allowed=DEFAULT, max_length=4096)
    assert caught.value.code == "invalid_endpoint"
