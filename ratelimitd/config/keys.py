"""Selects the compiled `_keys` or its pure-Python twin `_keys_py`: cache keys, window
arithmetic, the near-limit maths and the status split; `meter_key` is built on them here.

Like yarl's YARL_NO_EXTENSIONS, RATELIMITD_NO_EXTENSIONS=1 forces the twin; the choice is
made at import, through the settings package (the only reader of the environment).
`implementation(name)` gives either twin by name.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._twins import chooser, install
from . import _keys_py

IMPLEMENTATION = install(globals(), "ratelimitd.config._keys", _keys_py)
if TYPE_CHECKING:
    # The twins' names, typed as the pure one's (the module's own `__all__`).
    from ._keys_py import (  # noqa: F401
        UNIT_SECONDS,
        Bump,
        bump,
        cache_key,
        evaluate,
        near_threshold,
        over,
        refuse,
        reset_seconds,
        settle,
        sliding_window,
        state_key,
        token_bucket,
        unit_seconds,
        verdict,
        window_start,
    )


# Counters saturate, they never overflow (docs/compatibility.md). One descriptor's hits
# count at most MAX_HITS: past any uint32 requests_per_unit by itself, so the decision is the
# same, and small enough that Lua's doubles and Redis' int64 counters take many of them. A
# counter stops at COUNTER_MAX, the top of Redis' signed range (INCRBY refuses to pass it).
MAX_HITS = 2**32
COUNTER_MAX = _keys_py.COUNTER_MAX

# Metered usage (the `meter: true` config extension) is kept per UTC day for 35 days, so
# a billing cycle or a rolling 30-day window can always be summed from it.
METER_TTL_SECONDS = 35 * 86400


def meter_key(prefix: str, domain: str, entries: Sequence[tuple[str, str]], now: int) -> str:
    """`<prefix>meter_<domain>_<k>_<v>[_<k>_<v>..]_<UTC day start>`: one day's usage bucket."""
    return cache_key(prefix + "meter_", domain, entries, None, 86400, now)


# implementation(name): the module behind the twin names, "compiled" `_keys` or "pure"
# `_keys_py` (None: the one selected at import).
implementation = chooser("ratelimitd.config._keys", "ratelimitd.config._keys_py", IMPLEMENTATION)


__all__ = [
    *_keys_py.__all__,
    "IMPLEMENTATION",
    "METER_TTL_SECONDS",
    "implementation",
    "meter_key",
]
