"""The time zones a campaign's times may be chosen in: ``UTC`` and the canonical IANA zones.

The list comes from the time-zone database's own tables, read from the ``tzdata`` package
(the system's ``/usr/share/zoneinfo`` when the package is absent): ``zone1970.tab`` names
every canonical zone of a place, ``tzdata.zi`` its links (``Link TARGET ALIAS`` — the old
and backward-compatible names such as ``US/Eastern`` or ``Europe/Kiev``). Fixed offsets
(``Etc/GMT+5``), the POSIX-style rules (``EST5EDT``) and every alias are left out.

:func:`check_zone` is the one rule: the staff form and ``portal campaign create --zone``
both call it (through :func:`portal.campaigns.services.validate_draft`), and a name it
refuses gets a message that names the canonical zone where there is one.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from portal.errors import ValidationError

UTC_ZONE = "UTC"
_SYSTEM = Path("/usr/share/zoneinfo")
# Links to these are the same clock as UTC for ever: "Etc/UTC" or "Zulu" → UTC.
_SAME_AS_UTC = frozenset({"Etc/UTC", "Etc/GMT"})


def _table(name: str) -> str:
    """One of the database's text tables, or "" when neither copy has it."""
    try:
        return importlib.resources.files("tzdata.zoneinfo").joinpath(name).read_text("utf-8")
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        pass
    try:
        return (_SYSTEM / name).read_text("utf-8")
    except OSError:
        return ""


def _rows(text: str) -> Iterator[list[str]]:
    for line in text.splitlines():
        if line and not line.startswith("#"):
            yield line.split("\t")


@dataclass(frozen=True)
class Zone:
    name: str  # "America/New_York"
    label: str  # "New York — United States (Eastern, most areas)"


@functools.cache
def _database() -> tuple[tuple[Zone, ...], dict[str, str], frozenset[str]]:
    countries = {row[0]: row[1] for row in _rows(_table("iso3166.tab")) if len(row) > 1}
    defined: set[str] = set()
    links: dict[str, str] = {}
    for line in _table("tzdata.zi").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "Z":
            defined.add(parts[1])
        elif len(parts) >= 3 and parts[0] == "L":
            links[parts[2]] = parts[1]
    places: dict[str, tuple[str, str]] = {}
    for row in _rows(_table("zone1970.tab")):
        if len(row) < 3 or (defined and row[2] not in defined):
            continue
        names = ", ".join(countries.get(code, code) for code in row[0].split(","))
        places[row[2]] = (names, row[3] if len(row) > 3 else "")

    def resolve(name: str) -> str:
        seen = set()
        while name in links and name not in seen:
            seen.add(name)
            name = links[name]
        return name

    aliases = {alias: resolve(alias) for alias in links}
    areas = {name.split("/", 1)[0] for name in places}
    also: dict[str, list[str]] = {}
    for alias, target in sorted(aliases.items()):
        city, target_city = _city(alias), _city(target)
        if target in places and alias.split("/", 1)[0] in areas and city != target_city:
            also.setdefault(target, []).append(city)
    zones = [Zone(UTC_ZONE, "Coordinated Universal Time")]
    for name in sorted(places):
        names, comment = places[name]
        city = _city(name)
        if also.get(name):
            city += f" (also {', '.join(also[name])})"
        zones.append(Zone(name, f"{city} — {names}" + (f": {comment}" if comment else "")))
    return tuple(zones), aliases, frozenset(defined | set(links))


def _city(name: str) -> str:
    return name.rsplit("/", 1)[-1].replace("_", " ")


def zones() -> tuple[Zone, ...]:
    """``UTC`` first, then every canonical zone by name, each with the places it covers."""
    return _database()[0]


@functools.cache
def zone_names() -> frozenset[str]:
    return frozenset(zone.name for zone in zones())


def _aliases() -> dict[str, str]:
    return _database()[1]


def _named(name: str) -> str | None:
    """The canonical zone ``name`` is, or is an alias of (the UTC ones: UTC), spelt exactly;
    None otherwise."""
    if name in zone_names():
        return name
    target = _aliases().get(name, name)
    if target in zone_names():
        return target
    if target in _SAME_AS_UTC:
        return UTC_ZONE
    return None


def _shown(name: str) -> tuple[str, bool]:
    """``name`` as a message may quote it (a long or unprintable one cut and quoted), and
    whether it was readable as it came."""
    readable = len(name) <= 64 and name.isprintable()
    return (name if readable else repr(name[:64])), readable


def canonical_for(name: str) -> str | None:
    """The canonical zone that ``name`` stands for: an alias's target ("US/Eastern" →
    "America/New_York"), the zone spelt in another case or with spaces ("new york"), or
    the one zone of a city ("Paris", "Amsterdam" → "Europe/Brussels"); None otherwise."""
    exact = _named(name)
    if exact is not None:
        return exact
    known = zone_names()
    folded = name.strip().replace(" ", "_").casefold()
    spelt: dict[str, set[str]] = {}
    cities: dict[str, set[str]] = {}
    for alias, zone in [*((z, z) for z in known), *_aliases().items()]:
        if zone in known:
            spelt.setdefault(alias.casefold(), set()).add(zone)
            cities.setdefault(_city(alias).replace(" ", "_").casefold(), set()).add(zone)
    found = spelt.get(folded) or cities.get(folded) or set()
    return next(iter(found)) if len(found) == 1 else None


def check_zone(name: str, field: str = "timezone") -> str:
    """``name`` when it is ``UTC`` or a canonical zone; otherwise a ValidationError that
    says why and names the canonical zone when one exists ("US/Eastern → America/New_York")."""
    if name in zone_names():
        return name
    if not name.strip():
        raise ValidationError("invalid_zone", "Choose a time zone from the list", field)
    shown, readable = _shown(name)
    suggestion = canonical_for(name) if readable else None
    if suggestion is not None and (name in _aliases() or name in _SAME_AS_UTC):
        raise ValidationError(
            "zone_alias",
            f"{shown} is an alias: choose {suggestion} instead ({shown} → {suggestion})",
            field,
        )
    if suggestion is not None:
        raise ValidationError(
            "unknown_zone", f"There is no time zone {shown}: did you mean {suggestion}?", field
        )
    if name in _database()[2]:
        raise ValidationError(
            "zone_alias",
            f"{shown} is not the time zone of a place: choose the place's own zone, "
            "like Europe/Paris, or UTC",
            field,
        )
    raise ValidationError(
        "unknown_zone",
        f"There is no time zone {shown}: choose one from the list, like Europe/Paris, or UTC",
        field,
    )


def browser_zone(name: str, field: str = "timeZone") -> str:
    """The canonical zone of what a browser reports
    (``Intl.DateTimeFormat().resolvedOptions().timeZone``), for a person's local time.

    Browsers report what their copy of the database calls the zone, an old name included
    (Chromium says "Asia/Calcutta" and "Europe/Kiev" where tzdata now says "Asia/Kolkata"
    and "Europe/Kyiv"): an alias is taken as its target, "Etc/UTC" and its like as UTC,
    and a fixed offset ("Etc/GMT+5") kept. Anything else, spelt loosely or made up, is
    refused: a guess would send at the wrong hour."""
    exact = _named(name)
    if exact is not None:
        return exact
    if name in _database()[2]:
        # A zone of the database that is no place's (a fixed offset such as
        # "Etc/GMT+5", which a system set to an offset reports): a clock all the same.
        return name
    shown, _ = _shown(name)
    raise ValidationError(
        "invalid_time_zone",
        f"{field} must be a time zone of the IANA database, like Europe/Paris, not {shown}",
        field,
    )
