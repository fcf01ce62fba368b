"""How a limit counts: the algorithm ids, and the windows a rule is compiled to at load.

The config names the algorithm (`algorithm:`; the reference has only the fixed window),
so the ids are the config's; the backends and the decision model read them from here.
A rule's `windows` are what the count step needs of each of its limits, computed once
when the config loads and never on the request path: the algorithm, the window length,
the limit, and how the store key of the limit ends.
"""

from __future__ import annotations

from typing import Any, NamedTuple

FIXED_WINDOW, SLIDING_WINDOW, TOKEN_BUCKET = 0, 1, 2
ALGORITHM_NAMES = ("fixed_window", "sliding_window", "token_bucket")
ALGORITHM_BY_NAME = {name: number for number, name in enumerate(ALGORITHM_NAMES)}
ALL_ALGORITHMS = frozenset(ALGORITHM_BY_NAME.values())
ONLY_FIXED_WINDOW = frozenset({FIXED_WINDOW})


class Window(NamedTuple):
    """One limit of a rule as the count step uses it (a tuple: the compiled decision
    module reads it by position)."""

    limit: Any  # the limit's config.Rule: what a status reports (current_limit, name)
    algorithm: int
    seconds: int  # the window: unit_multiplier units
    requests: int  # requests_per_unit
    # After the store key's entries: "" for the reference's own key (one fixed window of one
    # unit, `..._<window start>`); `_<W>s` after the window start of any other fixed window;
    # `<W>s_<algorithm>` in place of the window start for a sliding window or token bucket.
    suffix: str
    tick: int  # sliding window and token bucket maths run in ticks of this many ms
    ticks: int  # the window in ticks
    per_second: bool  # a SECOND-unit limit: REDIS_PERSECOND's instance counts it


def key_suffix(algorithm: int, seconds: int, reference: bool) -> str:
    """Where a limit's state lives, after the reference's key without its window start: only
    the reference's own case (one fixed window of one unit) keeps the reference key; any other
    carries its window (and algorithm), so two limits of one descriptor, or windows of
    different lengths, never share a counter."""
    if algorithm == FIXED_WINDOW:
        return "" if reference else f"_{seconds}s"
    return f"{seconds}s_{ALGORITHM_NAMES[algorithm]}"
