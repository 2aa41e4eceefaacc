"""Password hashing with Argon2id (memory-hard), through argon2-cffi."""

from __future__ import annotations

import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

MIN_LENGTH = 12
# Long enough for any passphrase or manager-made password; short enough that hashing
# an enormous body cannot be used to tie up a worker.
MAX_LENGTH = 256


class Passwords:
    """Hash, verify and re-hash staff passwords.

    The default parameters are argon2-cffi's (RFC 9106's low-memory profile). When they
    change, :meth:`needs_rehash` tells the caller to store a fresh hash at the next
    successful sign-in.
    """

    def __init__(self, hasher: PasswordHasher | None = None) -> None:
        self.hasher = hasher or PasswordHasher()
        self._dummy: str | None = None
        self._lock = threading.Lock()

    def hash(self, password: str) -> str:
        return self.hasher.hash(password)

    def verify(self, stored_hash: str | None, password: str) -> bool:
        """True when ``password`` matches. With no hash (an unknown email), a dummy hash
        is verified instead so the answer takes about as long either way."""
        try:
            return self.hasher.verify(stored_hash or self._dummy_hash(), password)
        except (VerificationError, InvalidHashError):
            return False

    def needs_rehash(self, stored_hash: str) -> bool:
        try:
            return self.hasher.check_needs_rehash(stored_hash)
        except InvalidHashError:
            return True

    def _dummy_hash(self) -> str:
        with self._lock:
            if self._dummy is None:
                self._dummy = self.hasher.hash("no account has this password")
            return self._dummy


def password_problem(password: str) -> str | None:
    """Why a new password is refused, or None. Length only (NIST SP 800-63B): no
    composition rules, and anything may be pasted from a password manager."""
    if len(password) < MIN_LENGTH:
        return f"Password must be {MIN_LENGTH} characters or more"
    if len(password) > MAX_LENGTH:
        return f"Password must be {MAX_LENGTH} characters or fewer"
    if not password.strip():
        return "Password must not be only spaces"
    return None
