"""Sealing the subscription's auth secret at rest (seed 000 §4).

AES-256-GCM under a versioned data key, stored as iv(12) ‖ tag(16) ‖ ciphertext. The
row keeps the key version, so a new key can become current while old rows still open,
and the re-seal job moves them over at its own pace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

IV_LENGTH = 12
TAG_LENGTH = 16
AUTH_SECRET_LENGTH = 16


class UnknownKeyVersion(LookupError):
    def __init__(self, version: int) -> None:
        super().__init__(f"no data key for auth_key_version {version}")
        self.version = version


class SealBroken(ValueError):
    """The sealed value does not open with its key: altered, or sealed under another key."""


@dataclass(frozen=True)
class Sealed:
    sealed: bytes
    key_version: int


class KeyRing:
    """The data keys by version, and which one seals new values (the key provider seam)."""

    def __init__(self, keys: Mapping[int, bytes], current_version: int) -> None:
        if current_version not in keys:
            raise UnknownKeyVersion(current_version)
        for version, key in keys.items():
            if len(key) != 32:
                raise ValueError(f"data key v{version} must be 32 bytes")
        self._keys = {version: AESGCM(key) for version, key in keys.items()}
        self.current_version = current_version

    def versions(self) -> list[int]:
        return sorted(self._keys)

    def seal(self, secret: bytes) -> Sealed:
        if len(secret) != AUTH_SECRET_LENGTH:
            raise ValueError("the auth secret must be 16 bytes")
        iv = os.urandom(IV_LENGTH)
        out = self._keys[self.current_version].encrypt(iv, secret, None)
        # cryptography returns ciphertext ‖ tag; the stored layout is iv ‖ tag ‖ ciphertext.
        ciphertext, tag = out[:-TAG_LENGTH], out[-TAG_LENGTH:]
        return Sealed(iv + tag + ciphertext, self.current_version)

    def open(self, sealed: bytes, key_version: int) -> bytes:
        aead = self._keys.get(key_version)
        if aead is None:
            raise UnknownKeyVersion(key_version)
        if len(sealed) < IV_LENGTH + TAG_LENGTH:
            raise SealBroken("sealed value is too short")
        iv = sealed[:IV_LENGTH]
        tag = sealed[IV_LENGTH : IV_LENGTH + TAG_LENGTH]
        ciphertext = sealed[IV_LENGTH + TAG_LENGTH :]
        try:
            return aead.decrypt(iv, ciphertext + tag, None)
        except InvalidTag:
            raise SealBroken(f"sealed value does not open under key v{key_version}") from None
