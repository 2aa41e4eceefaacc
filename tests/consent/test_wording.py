"""The one wording rule for a topic's state, and the short summary of a notice's changes."""

from __future__ import annotations

import datetime as dt
import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.consent.catalogue import DIFF_LINE_MAX_CHARS, DIFF_MAX_LINES, VERSION, policy_diff
from portal.consent.models import PolicyVersion, Source
from portal.consent.preferences import Effective, Reason, explain

WHEN = dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC)

DEFAULTS = {
    Reason.TRANSACTIONAL_GRANT: (
        True,
        "On by default for account messages, because you allowed notifications.",
    ),
    Reason.DEFAULT_BY_REGION: (
        True,
        "On by default where you live. Turn it off if you do not want it.",
    ),
    Reason.REGION_BLOCKS_DEFAULT: (
        False,
        "Off until you turn it on: we only send these with your agreement.",
    ),
    Reason.DEFAULT_OFF: (False, "Off until you turn it on."),
}


def _effective(reason: Reason) -> Effective:
    on = {Reason.EXPLICIT_OPT_IN: True, Reason.EXPLICIT_OPT_OUT: False}.get(
        reason, DEFAULTS.get(reason, (False, ""))[0]
    )
    state = {Reason.EXPLICIT_OPT_IN: "opt_in", Reason.EXPLICIT_OPT_OUT: "opt_out"}.get(
        reason, "unset"
    )
    return Effective(on, reason, state)


@pytest.mark.parametrize("reason", list(DEFAULTS))
def test_a_topic_never_chosen_says_its_default_and_claims_no_choice(reason):
    on, sentence = DEFAULTS[reason]
    assert explain(_effective(reason)) == sentence
    assert sentence.startswith("On" if on else "Off")
    assert "you turned" not in sentence and "you chose" not in sentence


@pytest.mark.parametrize(
    ("reason", "source", "sentence"),
    [
        (
            Reason.EXPLICIT_OPT_IN,
            Source.PREFERENCE_CENTRE,
            "On: you chose this on 01 December 2026, under notice version 2026-01.",
        ),
        (
            Reason.EXPLICIT_OPT_IN,
            Source.SUBSCRIBE_PAGE,
            "On: you chose this on 01 December 2026, under notice version 2026-01.",
        ),
        (
            Reason.EXPLICIT_OPT_OUT,
            Source.PREFERENCE_CENTRE,
            "Off: you said no to this on 01 December 2026, under notice version 2026-01.",
        ),
        (
            Reason.EXPLICIT_OPT_OUT,
            Source.API,
            "Off: you said no to this on 01 December 2026, under notice version 2026-01.",
        ),
        (
            Reason.EXPLICIT_OPT_OUT,
            Source.SUBSCRIBE_PAGE,
            "Off: you left this unticked when you subscribed on 01 December 2026, "
            "under notice version 2026-01.",
        ),
    ],
)
def test_a_choice_says_when_and_under_which_notice(reason, source, sentence):
    assert (
        explain(_effective(reason), decided_at=WHEN, source=source.value, policy_version="2026-01")
        == sentence
    )


def test_a_choice_without_a_date_or_notice_leaves_them_out():
    assert explain(_effective(Reason.EXPLICIT_OPT_IN)) == "On: you chose this."
    assert (
        explain(_effective(Reason.EXPLICIT_OPT_OUT), decided_at=WHEN)
        == "Off: you said no to this on 01 December 2026."
    )


def _doubled(sentence: str, version: str | None) -> list[str]:
    """Words written twice in a row by the wording itself (the version is the data's)."""
    if version:
        sentence = sentence.replace(f"notice version {version}.", "notice version #.")
    words = re.findall(r"[\w'-]+", sentence.lower())
    return [a for a, b in itertools.pairwise(words) if a == b]


@given(
    reason=st.sampled_from(list(Reason)),
    decided_at=st.none() | st.datetimes(timezones=st.just(dt.UTC)),
    source=st.none() | st.sampled_from([s.value for s in Source]),
    version=st.none() | st.from_regex(VERSION, fullmatch=True),
)
def test_every_sentence_reads_right(reason, decided_at, source, version):
    effective = _effective(reason)
    sentence = explain(effective, decided_at=decided_at, source=source, policy_version=version)
    # No word twice in a row ("turned this on on"), the version's own name apart.
    assert _doubled(sentence, version) == []
    assert sentence.startswith("On" if effective.on else "Off")
    assert sentence.endswith(".")
    if not effective.explicit:
        # Nobody's choice: never claims one, whatever the row around it says.
        assert "you turned" not in sentence and "you chose" not in sentence
        assert sentence == DEFAULTS[reason][1]
    else:
        if decided_at is not None:
            assert f"{decided_at:%d %B %Y}" in sentence
        if version:
            assert f"notice version {version}." in sentence
    if source == Source.SUBSCRIBE_PAGE and reason == Reason.EXPLICIT_OPT_OUT:
        assert "you turned" not in sentence  # left unticked is not turned off


def _policy(version: str, text: str) -> PolicyVersion:
    return PolicyVersion(version=version, published_at=WHEN, text=text, text_sha256="0" * 64)


def test_the_summary_lists_removed_and_added_lines_in_order():
    old = _policy("v1", "We send what you choose.\nWe never sell your data.\n")
    new = _policy(
        "v2", "We send what you choose.\nWe send a monthly summary.\n\nWe never sell your data."
    )
    diff = policy_diff(old, new)
    assert [(line.added, line.text) for line in diff.lines] == [
        (True, "We send a monthly summary.")
    ]
    assert diff.more == 0
    assert (diff.old.version, diff.new.version) == ("v1", "v2")
    replaced = policy_diff(new, _policy("v3", "Something else."))
    # What went, then what came in its place.
    assert [(line.added, line.text) for line in replaced.lines] == [
        (False, "We send what you choose."),
        (False, "We send a monthly summary."),
        (False, "We never sell your data."),
        (True, "Something else."),
    ]


def test_the_summary_is_capped_and_keeps_markup_as_text():
    old = _policy("v1", "same")
    new = _policy("v2", "\n".join(f"<b>line {n}</b>" + "x" * 400 for n in range(30)))
    diff = policy_diff(old, new)
    assert len(diff.lines) == DIFF_MAX_LINES
    assert diff.more == 31 - DIFF_MAX_LINES  # 30 added, "same" removed
    assert all(len(line.text) <= DIFF_LINE_MAX_CHARS for line in diff.lines)
    assert any(line.text.startswith("<b>line 0</b>") for line in diff.lines)  # escaped later


@given(st.text(max_size=300), st.text(max_size=300))
def test_the_summary_is_short_whatever_the_texts(old_text, new_text):
    diff = policy_diff(_policy("a", old_text), _policy("b", new_text))
    assert len(diff.lines) <= DIFF_MAX_LINES
    assert all(0 < len(line.text) <= DIFF_LINE_MAX_CHARS for line in diff.lines)
    if old_text.splitlines() == new_text.splitlines():
        assert diff.lines == () and diff.more == 0
