"""The signature header parser and the HMAC check, as properties."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.feedback.signature import (
    SignatureError,
    SignatureHeader,
    header_value,
    parse_header,
    sign,
    verify,
)

timestamps = st.integers(min_value=0, max_value=10**15 - 1)
macs = st.binary(min_size=32, max_size=32)
NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@given(timestamps, macs)
def test_a_formatted_header_parses_back(t, mac):
    assert parse_header(f"t={t},v1={mac.hex()}") == SignatureHeader(t, (mac,))


@given(timestamps, macs, st.booleans(), st.sampled_from(["", " ", "  "]))
def test_order_case_and_spacing_do_not_matter(t, mac, v1_first, space):
    hexed = mac.hex().upper() if t % 2 else mac.hex()
    parts = [f"t={t}", f"v1={hexed}"]
    if v1_first:
        parts.reverse()
    assert parse_header(f",{space}".join(parts)) == SignatureHeader(t, (mac,))


@given(timestamps, st.lists(macs, min_size=1, max_size=3), st.text(alphabet="abcdefuvwxyz0"))
def test_several_v1_values_and_other_schemes(t, several, unknown_value):
    parts = [f"t={t}", *(f"v1={m.hex()}" for m in several), f"v0={unknown_value}"]
    assert parse_header(",".join(parts)) == SignatureHeader(t, tuple(several))


@given(st.text())
def test_any_text_parses_or_is_refused_cleanly(text):
    try:
        header = parse_header(text)
    except SignatureError as error:
        assert error.reason in {"missing_signature", "malformed_signature"}
    else:
        assert header.macs and all(len(m) == 32 for m in header.macs)


@given(
    st.one_of(
        st.text(alphabet="0123456789", min_size=16, max_size=20),  # too long for millis
        st.from_regex(r"\A-?[0-9]*[^0-9,\s][0-9]*\Z"),  # not digits
        st.just(""),
    ),
    macs,
)
def test_a_bad_timestamp_is_malformed(t, mac):
    with pytest.raises(SignatureError) as raised:
        parse_header(f"t={t},v1={mac.hex()}")
    assert raised.value.reason == "malformed_signature"


@given(timestamps, st.binary(min_size=1, max_size=40))
def test_a_mac_of_the_wrong_length_or_alphabet_is_malformed(t, raw):
    bad = raw.hex() if len(raw) != 32 else raw.hex()[:-1] + "g"
    with pytest.raises(SignatureError) as raised:
        parse_header(f"t={t},v1={bad}")
    assert raised.value.reason == "malformed_signature"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "missing_signature"),
        ("", "missing_signature"),
        ("   ", "missing_signature"),
        ("v1=" + "a" * 64, "malformed_signature"),  # no t
        ("t=1", "malformed_signature"),  # no v1
        ("t=1,t=2,v1=" + "a" * 64, "malformed_signature"),  # t twice
        ("t=1;v1=" + "a" * 64, "malformed_signature"),
        ("t=1,v1", "malformed_signature"),
        ("sha256=" + "a" * 64, "malformed_signature"),
    ],
)
def test_header_refusals(value, reason):
    with pytest.raises(SignatureError) as raised:
        parse_header(value)
    assert raised.value.reason == reason


@given(st.binary(max_size=300), st.text(min_size=1, max_size=40))
def test_sign_is_hmac_sha256_over_t_dot_body(body, secret):
    expected = hmac.new(secret.encode(), f"{NOW}.".encode() + body, hashlib.sha256).digest()
    assert sign(secret, NOW, body) == expected
    assert (
        verify(
            parse_header(header_value(secret, NOW, body)),
            body,
            [secret],
            now_ms=NOW,
            max_age_seconds=300,
        )
        == 0
    )


@given(st.binary(min_size=1, max_size=300), st.data())
def test_any_changed_byte_fails(body, data):
    index = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    flip = data.draw(st.integers(min_value=1, max_value=255))
    changed = bytearray(body)
    changed[index] ^= flip
    header = parse_header(header_value("s3cret", NOW, body))
    with pytest.raises(SignatureError) as raised:
        verify(header, bytes(changed), ["s3cret"], now_ms=NOW, max_age_seconds=300)
    assert raised.value.reason == "invalid_signature"


@given(st.integers(min_value=-(10**6), max_value=10**6))
def test_the_age_window_is_inclusive_both_ways(offset_ms):
    header = parse_header(header_value("s3cret", NOW + offset_ms, b"{}"))
    if abs(offset_ms) <= 300_000:
        assert verify(header, b"{}", ["s3cret"], now_ms=NOW, max_age_seconds=300) == 0
    else:
        with pytest.raises(SignatureError) as raised:
            verify(header, b"{}", ["s3cret"], now_ms=NOW, max_age_seconds=300)
        assert raised.value.reason == "signature_expired"


def test_the_secret_that_matched_is_reported_by_index():
    header = parse_header(header_value("old", NOW, b"{}"))
    assert verify(header, b"{}", ["new", "old"], now_ms=NOW, max_age_seconds=300) == 1
    with pytest.raises(SignatureError) as raised:
        verify(header, b"{}", ["new"], now_ms=NOW, max_age_seconds=300)
    assert raised.value.reason == "invalid_signature"
    with pytest.raises(SignatureError) as raised:
        verify(header, b"{}", [], now_ms=NOW, max_age_seconds=300)
    assert raised.value.reason == "not_configured"
