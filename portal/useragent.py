"""A user agent reduced to its family and major version: enough context, no fingerprint."""

from __future__ import annotations

import functools
import re

# Order matters: Edge and Opera also say "Chrome", Chrome also says "Safari".
_FAMILIES = (
    ("Edge", re.compile(r"Edg(?:e|A|iOS)?/(\d+)")),
    ("Opera", re.compile(r"OPR/(\d+)")),
    ("Samsung Internet", re.compile(r"SamsungBrowser/(\d+)")),
    ("Firefox", re.compile(r"(?:Firefox|FxiOS)/(\d+)")),
    ("Chrome", re.compile(r"(?:Chrome|CriOS)/(\d+)")),
    ("Safari", re.compile(r"Version/(\d+)[.\d]* (?:Mobile/\S+ )?Safari/")),
)


# Browsers send a handful of distinct strings; each is matched once per process.
@functools.lru_cache(maxsize=1024)
def family(user_agent: str | None) -> str:
    if not user_agent:
        return "unknown"
    for name, pattern in _FAMILIES:
        match = pattern.search(user_agent)
        if match:
            return f"{name} {match.group(1)}"
    return "other"
