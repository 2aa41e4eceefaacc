"""Hostile identity assertions and addresses on the public pages: each is a 400 (or
404) page that links nothing and writes nothing."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from portal.identity import InvalidLink, sign_assertion, verify_assertion
from portal.seams import current_portal
from tests.helpers import Unchanged

SECRET = "host-product-secret"


@pytest.fixture
def linking_app(app, catalogue_ready):
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        identity_assertion_secrets=(SECRET,)
    )
    return app


def _good() -> str:
    return sign_assertion({"sub": "user-42", "exp": time.time() + 60}, SECRET)


HOSTILE = [
    pytest.param(lambda: "é." + "a" * 64, id="non-ASCII payload"),
    pytest.param(lambda: _good().rpartition(".")[0] + ".é" + "a" * 63, id="non-ASCII mac"),
    pytest.param(lambda: _good() + "é", id="non-ASCII after the mac"),
    pytest.param(lambda: "€" * 40 + "." + "ü" * 64, id="all non-ASCII"),
    pytest.param(lambda: _good().replace(".", ".\u0660", 1), id="Arabic-Indic digit"),
    pytest.param(lambda: "\udc80." + "a" * 64, id="lone surrogate"),
    pytest.param(lambda: "a" * 100_000 + "." + "0" * 64, id="very long"),
]


@pytest.mark.parametrize("make", HOSTILE)
def test_a_hostile_assertion_is_an_invalid_link(make):
    with pytest.raises(InvalidLink, match="This sign-in link is not valid"):
        verify_assertion(make(), secrets=(SECRET,), now=time.time())


@pytest.mark.parametrize("make", HOSTILE[:5])
def test_a_non_ascii_assertion_in_the_address_is_a_400_page(linking_app, engine, make):
    client = linking_app.test_client()
    unchanged = Unchanged(engine)
    response = client.get(f"/preferences?assertion={quote(make())}")
    assert response.status_code == 400
    assert "This sign-in link is not valid" in response.text
    assert unchanged.changed() == []
    assert client.get_cookie("portal_subscriber") is None


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": "user-42", "exp": float("inf")},
        {"sub": "user-42", "exp": float("nan")},
        {"sub": "user-42", "exp": 1e308, "iat": float("nan")},
    ],
)
def test_an_assertion_that_never_expires_is_refused(claims):
    with pytest.raises(InvalidLink):
        verify_assertion(sign_assertion(claims, SECRET), secrets=(SECRET,), now=time.time())


def test_a_signed_assertion_nested_too_deeply_is_an_invalid_link():
    import base64
    import hashlib
    import hmac

    payload = base64.urlsafe_b64encode(b"[" * 100_000 + b"]" * 100_000).rstrip(b"=")
    mac = hmac.new(SECRET.encode(), payload, hashlib.sha256).hexdigest()
    with pytest.raises(InvalidLink, match="This sign-in link is not valid"):
        verify_assertion(f"{payload.decode()}.{mac}", secrets=(SECRET,), now=time.time())


@pytest.mark.parametrize("locale", ["de\x00DE", "de-DE\n", "x" * 35, "de DE"])
def test_a_locale_claim_that_is_not_a_language_tag_is_dropped(locale):
    claims = {"sub": "user-42", "exp": time.time() + 60, "locale": locale}
    found = verify_assertion(sign_assertion(claims, SECRET), secrets=(SECRET,), now=time.time())
    assert found.locale is None
    assert found.external_user_id == "user-42"


def test_a_plain_locale_claim_is_kept():
    claims = {"sub": "user-42", "exp": time.time() + 60, "locale": "de-DE"}
    found = verify_assertion(sign_assertion(claims, SECRET), secrets=(SECRET,), now=time.time())
    assert found.locale == "de-DE"


@pytest.mark.parametrize(
    "url",
    ["/preferences?token=%00", "/preferences?assertion=a%00.b", "/preferences?x=%0D%0A"],
)
def test_a_control_character_in_the_query_string_is_a_400_page(linking_app, engine, url):
    client = linking_app.test_client()
    unchanged = Unchanged(engine)
    response = client.get(url)
    assert response.status_code == 400
    assert unchanged.changed() == []


def test_a_policy_file_with_a_nul_is_refused_by_the_publish_command(app, engine, tmp_path):
    notice = tmp_path / "notice.txt"
    notice.write_text("We send\x00 what you choose.\n\tThat is all.\r\n")
    unchanged = Unchanged(engine)
    result = app.test_cli_runner().invoke(
        args=["portal", "policy", "publish", "v9", "--file", str(notice)]
    )
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output == (
        "error: the text must not contain control characters (there is a NUL at character 8)\n"
    )
    assert unchanged.changed() == []


def test_a_policy_file_keeps_its_line_breaks_and_tabs(app, tmp_path):
    notice = tmp_path / "notice.txt"
    notice.write_text("We send what you choose.\n\tThat is all.\r\n")
    result = app.test_cli_runner().invoke(
        args=["portal", "policy", "publish", "v9", "--file", str(notice)]
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--label", "Product\x1bnews", "the label must not contain control characters "
         "(there is U+001B at character 8)"),
        ("--category", "News\x7f", "the category must not contain control characters "
         "(there is U+007F at character 5)"),
    ],
)  # fmt: skip
def test_the_topic_command_refuses_control_characters(app, engine, option, value, message):
    arguments = {"--category": "News", "--label": "Product news", option: value}
    unchanged = Unchanged(engine)
    result = app.test_cli_runner().invoke(
        args=[
            "portal",
            "topic",
            "add",
            "product-news",
            *[x for kv in arguments.items() for x in kv],
        ]
    )
    assert result.exit_code == 1
    assert result.output == f"error: {message}\n"
    assert unchanged.changed() == []
