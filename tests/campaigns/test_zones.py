"""The zones a campaign may be chosen in, the one rule that checks a zone, and how a
campaign's time reads in its zone (daylight saving included)."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.campaigns import zones
from portal.campaigns.presentation import zoned_time
from portal.errors import ValidationError

NAMES = sorted(zones.zone_names())
# The database's links, less those listed themselves: UTC is a link to Etc/UTC in the zone
# database and the one name the list offers for it (accepted, test_every_listed_zone_is_accepted).
ALIASES = sorted(set(zones._aliases()) - set(NAMES))
instants = st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2037, 12, 31)).map(
    lambda naive: naive.replace(tzinfo=dt.UTC)
)


def test_the_list_is_utc_then_the_canonical_zones_of_the_database():
    names = [zone.name for zone in zones.zones()]
    assert names[0] == "UTC" and names[1:] == sorted(names[1:])
    assert len(names) > 300
    for canonical in ("Europe/Paris", "America/New_York", "Asia/Kolkata", "Europe/Kyiv"):
        assert canonical in names
    # No alias, fixed offset or POSIX-style rule: only the zones of places, and UTC.
    for legacy in (
        "US/Eastern",
        "GB",
        "Etc/GMT+5",
        "Etc/UTC",
        "EST5EDT",
        "Europe/Kiev",
        "Asia/Calcutta",
        "Europe/Amsterdam",
        "Factory",
    ):
        assert legacy not in names
    assert not any(name.startswith("Etc/") for name in names)
    # Every one of them is a zone this Python can use.
    for name in names:
        zoneinfo.ZoneInfo(name)


def test_a_zone_is_listed_with_the_places_it_covers_and_its_old_city_names():
    labels = {zone.name: zone.label for zone in zones.zones()}
    assert labels["America/New_York"] == "New York — United States: Eastern (most areas)"
    assert labels["Europe/Brussels"].startswith("Brussels (also Amsterdam, Luxembourg) — ")
    assert "Netherlands" in labels["Europe/Brussels"]
    assert labels["Asia/Kolkata"] == "Kolkata (also Calcutta) — India"


@given(st.sampled_from(NAMES))
def test_every_listed_zone_is_accepted(name):
    assert zones.check_zone(name) == name


# Campaigns are sent from now on: the alias and the zone it names must agree since 2000.
# (Before, some differ where a distribution builds the old zone itself: Debian's WET and
# EET keep their own pre-1996 history though tzdata.zi lists them as links to Lisbon and
# Athens.)
since_2000 = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2037, 12, 31)
).map(lambda naive: naive.replace(tzinfo=dt.UTC))


@given(st.sampled_from(ALIASES), since_2000)
def test_an_alias_is_refused_naming_a_listed_zone_with_the_same_clock(alias, at):
    with pytest.raises(ValidationError) as refused:
        zones.check_zone(alias)
    suggested = zones.canonical_for(alias)
    message = refused.value.message
    assert refused.value.field == "timezone"
    if suggested is None:  # "Etc/GMT+5", "EST5EDT": no place's zone to offer
        assert message.startswith(f"{alias} is not the time zone of a place")
        return
    assert suggested in NAMES
    assert message == f"{alias} is an alias: choose {suggested} instead ({alias} → {suggested})"
    # The same clock: the alias and its canonical zone agree at every instant.
    assert at.astimezone(zoneinfo.ZoneInfo(alias)).utcoffset() == (
        at.astimezone(zoneinfo.ZoneInfo(suggested)).utcoffset()
    )


@given(st.text(max_size=80))
def test_any_text_is_a_listed_zone_or_refused_with_a_clear_message(text):
    try:
        accepted = zones.check_zone(text)
    except ValidationError as refused:
        assert text not in NAMES
        message = refused.message
        assert message and "\n" not in message and len(message) < 300
        assert refused.code in {"invalid_zone", "unknown_zone", "zone_alias"}
        suggested = zones.canonical_for(text) if text.isprintable() else None
        if suggested is not None and len(text) <= 64:
            assert suggested in NAMES and suggested in message
    else:
        assert accepted == text and text in NAMES


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("US/Eastern", "America/New_York"),
        ("US/Pacific", "America/Los_Angeles"),
        ("GB", "Europe/London"),
        ("Europe/Kiev", "Europe/Kyiv"),
        ("Zulu", "UTC"),
        ("Etc/UTC", "UTC"),
        ("GMT", "UTC"),
        ("europe/paris", "Europe/Paris"),
        ("new york", "America/New_York"),
        ("Paris", "Europe/Paris"),
        ("Amsterdam", "Europe/Brussels"),
        ("Etc/GMT+5", None),
        ("Mars/Base", None),
    ],
)
def test_the_canonical_name_is_suggested_where_there_is_one(typed, suggested):
    assert zones.canonical_for(typed) == suggested


# -- how a campaign's time reads ---------------------------------------------------------


def _utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


def test_a_time_reads_in_its_zone_with_the_offset_then_and_in_utc():
    shown = zoned_time(_utc(2026, 12, 8, 8, 0), "Europe/Paris")
    assert shown.text == "Tue 8 Dec 2026, 09:00 Europe/Paris (UTC+01:00) — 08:00 UTC"
    assert shown.iso == "2026-12-08T08:00:00Z"
    # The UTC side names its day when it is another day than the zone's.
    assert zoned_time(_utc(2026, 12, 8, 23, 30), "Europe/Paris").text == (
        "Wed 9 Dec 2026, 00:30 Europe/Paris (UTC+01:00) — Tue 8 Dec 2026, 23:30 UTC"
    )
    assert zoned_time(_utc(2026, 3, 8, 8, 0, 5), "Asia/Kolkata").text == (
        "Sun 8 Mar 2026, 13:30:05 Asia/Kolkata (UTC+05:30) — 08:00:05 UTC"
    )


def test_daylight_saving_changes_the_offset_shown():
    # Paris goes from UTC+1 to UTC+2 at 01:00 UTC on 29 March 2026 (02:00 → 03:00).
    assert zoned_time(_utc(2026, 3, 29, 0, 59), "Europe/Paris").text == (
        "Sun 29 Mar 2026, 01:59 Europe/Paris (UTC+01:00) — 00:59 UTC"
    )
    assert zoned_time(_utc(2026, 3, 29, 1, 0), "Europe/Paris").text == (
        "Sun 29 Mar 2026, 03:00 Europe/Paris (UTC+02:00) — 01:00 UTC"
    )
    # New York springs forward on 8 March 2026 at 07:00 UTC (02:00 → 03:00 EDT).
    assert zoned_time(_utc(2026, 3, 8, 7, 5), "America/New_York").text == (
        "Sun 8 Mar 2026, 03:05 America/New_York (UTC-04:00) — 07:05 UTC"
    )
    # Back on 25 October: 02:30 happens twice in Paris, and the offset tells them apart.
    assert zoned_time(_utc(2026, 10, 25, 0, 30), "Europe/Paris").text == (
        "Sun 25 Oct 2026, 02:30 Europe/Paris (UTC+02:00) — 00:30 UTC"
    )
    assert zoned_time(_utc(2026, 10, 25, 1, 30), "Europe/Paris").text == (
        "Sun 25 Oct 2026, 02:30 Europe/Paris (UTC+01:00) — 01:30 UTC"
    )


def test_utc_and_an_unknown_zone_read_in_utc_only():
    at = _utc(2026, 12, 8, 8, 0)
    assert zoned_time(at, "UTC").text == "Tue 8 Dec 2026, 08:00 UTC"
    assert zoned_time(at, "UTC").zone_known
    # NULL: a campaign launched before zones were kept. Shown in UTC, said to be unknown.
    assert zoned_time(at, None).text == "Tue 8 Dec 2026, 08:00 UTC"
    assert not zoned_time(at, None).zone_known
