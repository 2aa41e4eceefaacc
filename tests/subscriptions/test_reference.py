"""A person's short reference: given once, stable, unique (a clash is drawn again), read
back however it is typed, and worth nothing as proof of who anyone is."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from portal.db import db
from portal.identity import SUBSCRIBER_COOKIE
from portal.subscriptions import reference
from portal.subscriptions.models import Subscriber
from tests.factories import make_subscriber


def test_a_drawn_reference_is_eight_crockford_characters():
    for _ in range(200):
        value = reference.random_reference()
        assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{8}", value)
    assert reference.display("K7QM3XPA") == "K7QM-3XPA"


@pytest.mark.parametrize(
    "typed",
    ["K7QM-3XPA", "k7qm3xpa", " k7qm 3xpa ", "K7QM 3XPA", "k7qm_3xpa", "k7q-m3x-pa", "k7qm.3xpa"],
)
def test_what_people_type_back_is_read_leniently(typed):
    assert reference.normalise(typed) == "K7QM3XPA"


def test_crockford_lookalikes_are_read_as_digits():
    assert reference.normalise("AO1I-LBCD") == "A0111BCD"
    assert reference.normalise("ao1i lbcd") == "A0111BCD"


@pytest.mark.parametrize(
    "typed", ["", "K7QM-3XP", "K7QM-3XPAB", "K7QM-3XPU", "K7QM-3XP%", "K7QM\x003XPA", "ÄÄÄÄÄÄÄÄ"]
)
def test_what_cannot_be_a_reference_is_none(typed):
    assert reference.normalise(typed) is None


def test_a_person_is_given_one_reference_and_keeps_it(app):
    with db.begin(app) as session:
        person = make_subscriber(session, "acct-1")
        given = reference.reference_for(session, person.id)
    with db.begin(app) as session:
        assert reference.reference_for(session, person.id, draw=lambda: "ZZZZZZZZ") == given
        assert reference.subscriber_by_reference(session, reference.display(given)) == person.id
        assert reference.subscriber_by_reference(session, given.lower()) == person.id


def test_a_clash_is_drawn_again(app):
    with db.begin(app) as session:
        holder = make_subscriber(session, "acct-1", reference="AAAAAAAA")
        newcomer = make_subscriber(session, "acct-2")
    draws = iter(["AAAAAAAA", "AAAAAAAA", "BBBBBBBB"])
    with db.begin(app) as session:
        assert reference.reference_for(session, newcomer.id, draw=lambda: next(draws)) == (
            "BBBBBBBB"
        )
    with db.begin(app) as session:
        refs = dict(
            session.execute(sa.select(Subscriber.external_user_id, Subscriber.reference)).all()
        )
    assert refs == {"acct-1": "AAAAAAAA", "acct-2": "BBBBBBBB"}
    assert holder.id != newcomer.id


def test_endless_clashes_give_up_rather_than_loop(app):
    with db.begin(app) as session:
        make_subscriber(session, "acct-1", reference="AAAAAAAA")
        newcomer = make_subscriber(session, "acct-2")
    with db.begin(app) as session, pytest.raises(RuntimeError, match="no free reference"):
        reference.reference_for(session, newcomer.id, draw=lambda: "AAAAAAAA")


def test_the_database_refuses_a_second_holder(app):
    with db.begin(app) as session:
        make_subscriber(session, "acct-1", reference="AAAAAAAA")
    with pytest.raises(IntegrityError), db.begin(app) as session:
        make_subscriber(session, "acct-2", reference="AAAAAAAA")


def test_a_reference_opens_nothing(app, client):
    """No route takes a reference as a credential: not as the preference centre's token,
    assertion or cookie."""
    with db.begin(app) as session:
        person = make_subscriber(session, "acct-1")
        given = reference.reference_for(session, person.id)
    for value in (given, reference.display(given)):
        for url in (f"/preferences?token={value}", f"/preferences?assertion={value}"):
            answer = client.get(url)
            assert answer.status_code == 400
            assert given not in answer.text
        client.set_cookie(SUBSCRIBER_COOKIE, value)
        page = client.get("/preferences")
        assert "Your reference" not in page.text
        assert given not in page.text
