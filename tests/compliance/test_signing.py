"""The export signing key: configuration and the forms a public key is given in."""

from __future__ import annotations

import pytest

from portal.compliance.signing import SigningKey, SigningKeyMissing, parse_public_key
from portal.config import ConfigError, Settings, b64url_encode, generate_signing_key


def test_a_malformed_key_stops_the_start(tmp_path):
    base = {"EXPORT_SIGNING_KEY": b64url_encode(b"short"), "PORTAL_ENV": "development"}
    with pytest.raises(ConfigError, match="EXPORT_SIGNING_KEY must be a base64url raw 32-byte"):
        Settings.from_env(base, str(tmp_path))


def test_development_generates_one(tmp_path):
    settings = Settings.from_env({}, str(tmp_path))
    key = SigningKey.from_setting(settings.export_signing_key)
    assert len(key.public.raw) == 32


def test_no_key_no_signing():
    with pytest.raises(SigningKeyMissing, match="EXPORT_SIGNING_KEY is not set"):
        SigningKey.from_setting("")


def test_a_public_key_in_every_form(tmp_path):
    key = SigningKey.from_setting(generate_signing_key()).public
    pem = tmp_path / "key.pem"
    pem.write_text(key.pem)
    for text in (key.hex, key.b64url, str(pem), f"  {key.hex}\n"):
        assert parse_public_key(text) == key
    with pytest.raises(ValueError, match="64 hex digits"):
        parse_public_key("not a key")


def test_signatures_verify_only_unchanged():
    key = SigningKey.from_setting(generate_signing_key())
    signature = key.sign(b"manifest")
    assert key.public.verify(signature, b"manifest")
    assert not key.public.verify(signature, b"manifesT")
