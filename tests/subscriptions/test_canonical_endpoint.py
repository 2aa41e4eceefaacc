"""One canonical spelling per push resource, and the sender takes every endpoint the
validator takes (SPEC §4, "An endpoint is an address, not a password")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.errors import ValidationError
from portal.push.transport import PushRequest
from portal.subscriptions.validation import (
    EndpointRefused,
    HostAllowList,
    canonical_endpoint,
    endpoint_hash,
    validate_endpoint,
)

ALLOWED = HostAllowList(
    [
        "fcm.googleapis.com",
        "*.notify.windows.com",
        "127.0.0.1:8443",
        "localhost:8443",
        "[::1]:8443",
        "xn--bcher-kva.example",
    ]
)
FCM = "https://fcm.googleapis.com/fcm/send/abc:APA91b-x_y"


def valid(text: str) -> str:
    return validate_endpoint(text, allowed=ALLOWED, max_length=4096).endpoint


def sendable(endpoint: str) -> PushRequest:
    """The transport's own entry check: building the request it sends."""
    return PushRequest(endpoint, b"x", 0)


SPELLINGS = [
    # the five of issue 13 item 2, each a separate row before
    ("HTTPS://FCM.GoogleAPIs.com/fcm/send/abc:APA91b-x_y", FCM),
    ("https://fcm.googleapis.com:443/fcm/send/abc:APA91b-x_y", FCM),
    ("https://fcm.googleapis.com:0443/fcm/send/abc:APA91b-x_y", FCM),
    ("https://fcm.googleapis.com/fcm/send/abc:APA91b-x_y?", FCM),
    ("https://fcm.googleapis.com/fcm/send/abc:APA91b-x_y#fragment", FCM),
    # and the other spellings one resource has
    ("https://fcm.googleapis.com./fcm/send/abc:APA91b-x_y", FCM),
    ("https://fcm.googleapis.com:/fcm/send/abc:APA91b-x_y", FCM),
    ("hTtPs://FCM.googleapis.COM.:000443/fcm/send/abc:APA91b-x_y?#", FCM),
    ("https://fcm.googleapis.com/fcm/./send/x/../abc:APA91b-x_y", FCM),
    (
        "https://fcm.googleapis.com/fcm/send/abc%3aAPA91b%2Dx%5Fy",
        "https://fcm.googleapis.com/fcm/send/abc%3AAPA91b-x_y",
    ),
    ("https://fcm.googleapis.com/%66cm/send/abc:APA91b-x_y", FCM),
    (
        "https://wns2-by3p.NOTIFY.windows.com/w/?token=BQYAAAB%2bq%2fz%3d",
        "https://wns2-by3p.notify.windows.com/w/?token=BQYAAAB%2Bq%2Fz%3D",
    ),
    ("https://127.0.0.1:08443/push/t", "https://127.0.0.1:8443/push/t"),
    ("https://LocalHost:8443/push/t#x", "https://localhost:8443/push/t"),
    ("https://[0:0:0:0:0:0:0:1]:8443/push/t", "https://[::1]:8443/push/t"),
    ("https://Bücher.example/push/t", "https://xn--bcher-kva.example/push/t"),
    ("https://BÜCHER.example./push/t", "https://xn--bcher-kva.example/push/t"),
]


@pytest.mark.parametrize(("spelling", "canonical"), SPELLINGS)
def test_every_spelling_of_a_resource_is_stored_as_one_canonical_endpoint(spelling, canonical):
    assert valid(spelling) == canonical
    assert valid(canonical) == canonical
    assert endpoint_hash(spelling) == endpoint_hash(canonical)
    assert validate_endpoint(spelling, allowed=ALLOWED, max_length=4096).hash == endpoint_hash(
        canonical
    )
    sendable(spelling)
    sendable(canonical)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("https://fcm.googleapis.com:0/fcm/send/x", "invalid_endpoint"),
        ("https://fcm.googleapis.com:65536/fcm/send/x", "invalid_endpoint"),
        ("https://fcm.googleapis.com:+443/fcm/send/x", "invalid_endpoint"),
        ("https://fcm.googleapis.com:４４３/fcm/send/x", "invalid_endpoint"),
        ("https://fcm.googleapis.com/fcm/send/ünïcode", "invalid_endpoint"),
        ("https://fcm.googleapis.com/fcm/send/a%zz", "invalid_endpoint"),
        ("https://fcm.googleapis.com/fcm/send/a<b>", "invalid_endpoint"),
        ('https://fcm.googleapis.com/fcm/send/a"b', "invalid_endpoint"),
        ("https://fcm.googleapis.com../fcm/send/x", "invalid_endpoint"),
        ("https://127.1:8443/push/t", "invalid_endpoint"),
        ("https://0x7f.0.0.1:8443/push/t", "invalid_endpoint"),
        ("https://[::1%25eth0]:8443/push/t", "invalid_endpoint"),
        ("https://[fcm.googleapis.com]/x", "invalid_endpoint"),
        ("https://fcm.googleapis.com/fcm/../", "invalid_endpoint"),
        ("http://fcm.googleapis.com/fcm/send/x", "insecure_endpoint"),
        ("https://user@fcm.googleapis.com/fcm/send/x", "invalid_endpoint"),
        ("https://fcm.googleapis.com.evil.test/fcm/send/x", "push_service_not_allowed"),
        ("https://fcm.googleapis.com:8443/fcm/send/x", "push_service_not_allowed"),
    ],
)
def test_what_is_no_push_endpoint_is_refused(text, code):
    with pytest.raises(ValidationError) as refused:
        valid(text)
    assert (refused.value.code, refused.value.field) == (code, "endpoint")


def test_a_canonical_endpoint_longer_than_the_limit_is_refused():
    text = "https://Bücher.example/push/" + "t" * 20
    with pytest.raises(ValidationError) as refused:
        validate_endpoint(text, allowed=ALLOWED, max_length=len(text))
    assert refused.value.code == "endpoint_too_long"


# Spellings of one resource, generated: each part written in any of the ways a URL
# parser takes for it.


def _case(text: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(text), max_size=len(text)).map(
        lambda upper: "".join(c.upper() if u else c for c, u in zip(text, upper, strict=True))
    )


TOKEN = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_:", min_size=1)


@st.composite
def spelled(draw: st.DrawFn) -> tuple[str, str]:
    """(a spelling, the plain endpoint of the same resource)."""
    host, port, default = draw(
        st.sampled_from(
            [
                ("fcm.googleapis.com", 443, True),
                ("wns2-by3p.notify.windows.com", 443, True),
                ("127.0.0.1", 8443, False),
                ("localhost", 8443, False),
            ]
        )
    )
    path = "/push/" + draw(TOKEN)
    plain = f"https://{host}{'' if default else f':{port}'}{path}"
    scheme = draw(_case("https"))
    written_host = draw(_case(host)) + draw(st.sampled_from(["", "."]))
    zeros = "0" * draw(st.integers(0, 3))
    written_port = draw(
        st.sampled_from(
            ["", ":", f":{zeros}{port}"] if default else [f":{port}", f":{zeros}{port}"]
        )
    )
    query = draw(st.sampled_from(["", "?"]))
    fragment = draw(st.sampled_from(["", "#", "#" + draw(TOKEN)]))
    dots = draw(st.sampled_from(["", "/.", "/x/.."]))
    return f"{scheme}://{written_host}{written_port}{dots}{path}{query}{fragment}", plain


@given(spelled())
def test_spellings_of_one_resource_give_one_endpoint_one_hash_and_are_sendable(case):
    spelling, plain = case
    canonical = valid(spelling)
    assert canonical == valid(plain)
    assert endpoint_hash(spelling) == endpoint_hash(plain) == endpoint_hash(canonical)
    assert valid(canonical) == canonical  # canonicalising twice changes nothing
    sendable(spelling)
    sendable(canonical)


URLISH = st.text(
    alphabet=st.sampled_from(
        [
            *"htpsHTPS:/?#@[]%.-_~!$&'()*+,;=0123456789abcfgloemnAFGLOEMN \"<>\\^`{|}",
            *["ü", "ß", "．", "\x00", "\t"],
        ]
    ),
    max_size=60,
)


@given(st.one_of(URLISH.map(lambda t: "https://fcm.googleapis.com/" + t), URLISH))
def test_whatever_the_validator_accepts_the_transport_accepts(text):
    try:
        canonical = valid(text)
    except ValidationError:
        return  # refused: nothing is stored, nothing will be sent
    sendable(text)
    sendable(canonical)
    assert valid(canonical) == canonical
    assert endpoint_hash(text) == endpoint_hash(canonical)


@given(
    st.one_of(
        st.text(max_size=80),
        st.text(max_size=40).map(lambda t: f"https://{t}/x"),
        st.text(max_size=40).map(lambda t: f"https://fcm.googleapis.com{t}"),
    )
)
def test_the_parser_refuses_with_its_own_error_and_hashing_never_raises(text):
    """Every look-up hashes what it is given: no text makes it raise (a 500)."""
    try:
        canonical = canonical_endpoint(text)
    except EndpointRefused as refused:
        assert refused.code in {"invalid_endpoint", "insecure_endpoint"}
    else:
        assert canonical.isascii() and canonical_endpoint(canonical) == canonical
    assert len(endpoint_hash(text)) == 32
