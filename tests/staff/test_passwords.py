"""Argon2id hashing: real parameters, verification, re-hashing when they change."""

from __future__ import annotations

import sqlalchemy as sa
from argon2 import PasswordHasher

from portal.seams import current_portal
from portal.staff.passwords import Passwords, password_problem
from tests.staff.conftest import FAST_HASHER, PASSWORD


def test_the_default_is_argon2id_with_memory_hard_parameters():
    passwords = Passwords()
    stored = passwords.hash(PASSWORD)
    assert stored.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
    assert passwords.verify(stored, PASSWORD)
    assert not passwords.verify(stored, PASSWORD + "!")
    assert not passwords.needs_rehash(stored)


def test_verify_never_raises():
    passwords = Passwords(FAST_HASHER)
    assert passwords.verify(None, "anything") is False
    assert passwords.verify("not a hash", "anything") is False
    assert passwords.needs_rehash("not a hash") is True


def test_a_sign_in_rehashes_when_the_parameters_changed(app, engine, make_staff, browser):
    make_staff("ann@example.test")
    with engine.connect() as conn:
        before = conn.execute(sa.text("SELECT password_hash FROM staff_user")).scalar_one()
    assert "t=1" in before
    current_portal(app).passwords = Passwords(
        PasswordHasher(time_cost=2, memory_cost=2048, parallelism=1)
    )
    assert browser().sign_in("ann@example.test").status_code == 303
    with engine.connect() as conn:
        after = conn.execute(sa.text("SELECT password_hash FROM staff_user")).scalar_one()
    assert after != before
    assert "m=2048,t=2,p=1" in after
    assert browser().sign_in("ann@example.test").status_code == 303


def test_a_failed_sign_in_does_not_rehash(app, engine, make_staff, browser):
    make_staff("ann@example.test")
    current_portal(app).passwords = Passwords(
        PasswordHasher(time_cost=2, memory_cost=2048, parallelism=1)
    )
    browser().sign_in("ann@example.test", "the wrong password")
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT password_hash FROM staff_user")).scalar_one()
    assert "t=1" in stored


def test_password_rules_are_length_only():
    assert password_problem("x" * 11) == "Password must be 12 characters or more"
    assert password_problem(" " * 20) == "Password must not be only spaces"
    assert password_problem("x" * 257) == "Password must be 256 characters or fewer"
    assert password_problem("alllowercaseletters") is None  # no composition rules
    assert password_problem("pässwörd mit ümläuten") is None
