"""The export signing key: Ed25519, from ``EXPORT_SIGNING_KEY`` (base64url raw bytes).

Manifests carry the public key and the signature in hex, which plain tools (``xxd``,
``openssl``) read without any base64 variant in between.
"""

from __future__ import annotations

import binascii
import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from portal.config import b64url_decode, b64url_encode

ALGORITHM = "Ed25519"
# DER prefix of an Ed25519 SubjectPublicKeyInfo: prepend it to the 32 raw bytes.
SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


class SigningKeyMissing(RuntimeError):
    """Exports need EXPORT_SIGNING_KEY; without it they are refused."""

    def __init__(self) -> None:
        super().__init__("EXPORT_SIGNING_KEY is not set: exports cannot be signed")


@dataclass(frozen=True)
class PublicKey:
    raw: bytes

    @property
    def hex(self) -> str:
        return self.raw.hex()

    @property
    def b64url(self) -> str:
        return b64url_encode(self.raw)

    @property
    def pem(self) -> str:
        key = ed25519.Ed25519PublicKey.from_public_bytes(self.raw)
        return key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode("ascii")

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the raw key, for reading out over the phone."""
        return hashlib.sha256(self.raw).hexdigest()

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class SigningKey:
    private: ed25519.Ed25519PrivateKey

    @classmethod
    def from_setting(cls, value: str) -> SigningKey:
        if not value:
            raise SigningKeyMissing()
        return cls(ed25519.Ed25519PrivateKey.from_private_bytes(b64url_decode(value)))

    @property
    def public(self) -> PublicKey:
        return PublicKey(
            self.private.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
        )

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


def parse_public_key(text: str) -> PublicKey:
    """A public key as hex (64 digits), base64url (43 characters) or a PEM file's path."""
    text = text.strip()
    if len(text) == 64:
        try:
            return PublicKey(bytes.fromhex(text))
        except ValueError:
            pass
    if len(text) == 43:
        try:
            raw = b64url_decode(text)
        except (ValueError, binascii.Error):
            raw = b""
        if len(raw) == 32:
            return PublicKey(raw)
    path = Path(text)
    if path.is_file():
        loaded = serialization.load_pem_public_key(path.read_bytes())
        if isinstance(loaded, ed25519.Ed25519PublicKey):
            return PublicKey(
                loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            )
        raise ValueError(f"{text} holds a public key that is not Ed25519")
    raise ValueError("a public key is 64 hex digits, 43 base64url characters or a PEM file")
