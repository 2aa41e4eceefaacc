"""Staff fixtures: a quick password hasher, staff users, a browser that signs in."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher
from flask import Flask
from flask.testing import FlaskClient

from portal import create_app
from portal.clock import FrozenClock
from portal.config import Settings, StaffAuthSettings
from portal.db import db
from portal.seams import current_portal
from portal.staff import services
from portal.staff.models import Role, StaffUser
from portal.staff.passwords import Passwords
from tests.conftest import make_settings

PASSWORD = "correct horse battery staple"
# Cheap parameters keep the suite fast; test_passwords.py checks the real defaults.
FAST_HASHER = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
# Sign-in tests sign in many times from one test-client address.
GENEROUS = StaffAuthSettings(attempts_per_minute=10_000)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, str(tmp_path / "instance"), staff=GENEROUS)


@pytest.fixture(autouse=True)
def _fast_passwords(app: Flask) -> None:
    current_portal(app).passwords = Passwords(FAST_HASHER)


@pytest.fixture
def make_app(
    database_url: str, tmp_path: Path, clock: FrozenClock
) -> Iterator[Callable[..., Flask]]:
    """Another app on the same database, with other settings."""
    made: list[Flask] = []

    def make(**overrides: Any) -> Flask:
        overrides.setdefault("staff", GENEROUS)
        application = create_app(
            make_settings(database_url, str(tmp_path / "instance"), **overrides),
            clock=clock,
            passwords=Passwords(FAST_HASHER),
        )
        application.config["TESTING"] = True
        made.append(application)
        return application

    yield make
    for application in made:
        application.extensions["portal.db"].engine.dispose()


@pytest.fixture
def make_staff(app: Flask) -> Callable[..., StaffUser]:
    def make(
        email: str = "admin@example.test",
        *roles: Role,
        password: str = PASSWORD,
        disabled: bool = False,
        must_replace_password: bool = False,
    ) -> StaffUser:
        with app.app_context(), db.begin() as session:
            user = services.create_staff(
                session,
                email=email,
                password=password,
                roles=roles or (Role.ADMIN,),
                actor=None,
                passwords=current_portal(app).passwords,
                now=current_portal(app).clock.now(),
                via="test",
                must_replace_password=must_replace_password,
            )
            if disabled:
                user.disabled_at = current_portal(app).clock.now()
        return user

    return make


_TOKEN = re.compile(r'name="csrf_token"(?: type="hidden")? value="([^"]+)"')


def csrf_from(html: str) -> str:
    match = _TOKEN.search(html)
    assert match, "no CSRF token on the page"
    return match.group(1)


@dataclass
class Browser:
    """A test client that behaves like a person at a browser: it reads the CSRF token
    from a page before posting a form."""

    client: FlaskClient
    base_url: str = "http://localhost"

    def token(self) -> str:
        page = self.get("/staff/login")
        if page.status_code == 302:  # signed in: any staff page carries the token
            page = self.get("/staff/password")
        return csrf_from(page.text)

    def sign_in(self, email: str, password: str = PASSWORD, next_path: str | None = None) -> Any:
        url = "/staff/login" + (f"?next={next_path}" if next_path else "")
        return self.post(url, {"email": email, "password": password})

    def post(self, url: str, data: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        data = {"csrf_token": self.token(), **(data or {})}
        if self.base_url.startswith("https:"):
            # Over https Flask-WTF also checks that the form came from this site.
            kwargs.setdefault("headers", {"Referer": f"{self.base_url}/staff/login"})
        return self.client.post(url, data=data, base_url=self.base_url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> Any:
        return self.client.get(url, base_url=self.base_url, **kwargs)

    @property
    def cookie(self) -> str | None:
        found = self.client.get_cookie("portal_staff", path="/staff")
        return found.value if found else None


@pytest.fixture
def browser(app: Flask) -> Callable[..., Browser]:
    def make(
        application: Flask | None = None,
        *,
        remote_addr: str | None = None,
        base_url: str = "http://localhost",
    ) -> Browser:
        client = (application or app).test_client()
        if remote_addr:
            client.environ_base["REMOTE_ADDR"] = remote_addr
        return Browser(client, base_url)

    return make


@pytest.fixture
def admin_browser(make_staff, browser) -> Browser:
    make_staff("admin@example.test", Role.ADMIN)
    signed_in = browser()
    assert signed_in.sign_in("admin@example.test").status_code == 303
    return signed_in
