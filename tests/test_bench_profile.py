"""The dispatch benchmark's profile puts each sample of the sending thread in the part of
the engine it was in (bench/dispatch.py, profile_parts)."""

from __future__ import annotations

from bench.dispatch import profile_parts

ENGINE = "/work/portal/delivery/engine.py"


def _sample(thread: int, *functions: str, count: int = 1) -> str:
    frames = ";".join(f"Dispatcher.{name} ({ENGINE}:1)" for name in functions)
    return f"thread ({thread}): worker;{frames} {count}"


def test_materialisation_in_the_sending_loop_counts_as_advancing_campaigns():
    """Inside the loop a sender writes the next batch from ``_more_to_claim`` and
    ``_materialise_ahead``, not under ``advance_campaigns``: it is still that part."""
    raw = "\n".join(
        [
            _sample(7, "tick", "advance_campaigns", "_advance", "_materialise"),
            _sample(7, "tick", "_more_to_claim", "_advance", "_materialise", count=2),
            _sample(7, "tick", "_materialise_ahead", "_materialise", count=3),
            _sample(7, "tick", "_more_to_claim", "_advance", count=4),
            _sample(7, "tick", "claim", count=5),
            _sample(8, "tick", "_materialise_ahead", "_materialise", count=6),
        ]
    )
    parts = profile_parts(raw, 7)
    assert parts["advance"] == 1 + 2 + 3 + 4
    assert parts["claim"] == 5
    assert parts["threads"] == 6
    assert parts["other"] == 0
