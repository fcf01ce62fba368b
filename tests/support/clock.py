"""A controllable clock, for anything that takes `clock=` (a zero-argument callable)."""

from __future__ import annotations


class Clock:
    """A settable clock: `clock()` returns `clock.now`; tests set or `advance` it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds
