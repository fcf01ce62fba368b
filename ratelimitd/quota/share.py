"""The fair-share arithmetic of quota assignments: pure functions, no I/O, no clock.

A stream's demand is what its reports show (allowed + denied per elapsed second); what it
wants is what that demand uses before its next report but one; `shares` divides what is
left of a limit among the streams that want more, never giving out more than is left.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

# Envoy 1.40 sends whole seconds and `0s` in a bucket's first report (and in reports of
# buckets younger than a second): a report is taken to span at least this long.
MIN_ELAPSED = 1.0
# The weight of the newest report in a bucket's demand (an exponential moving average), so
# one quiet or busy period moves a stream's share without throwing its history away.
NEWEST_WEIGHT = 0.5


def demand(allowed: int, denied: int, elapsed: float) -> float:
    """Requests per second one report shows: (allowed + denied) / elapsed, the elapsed time
    taken as at least MIN_ELAPSED."""
    return (allowed + denied) / max(elapsed, MIN_ELAPSED)


def smoothed(previous: float | None, newest: float) -> float:
    """A bucket's demand after one more report (the newest alone for the first)."""
    if previous is None:
        return newest
    return NEWEST_WEIGHT * newest + (1.0 - NEWEST_WEIGHT) * previous


def wanted(rate: float, horizon: float) -> int:
    """Tokens a stream asking `rate` requests per second uses within `horizon` seconds,
    at least one (a stream that reports is serving the bucket)."""
    return max(1, math.ceil(rate * horizon - 1e-9))


def shares(available: int, wants: Mapping[K, int], weights: Mapping[K, float]) -> dict[K, int]:
    """Divide `available` tokens among streams: each gets its want when all fit, else a part
    proportional to its weight (its demand), never more than it wants; the sum never exceeds
    `available`. Remainders go one token at a time to the heaviest first (then by key, so
    the result does not depend on dict order)."""
    out = {k: 0 for k in wants}
    left = max(0, available)
    open_ = sorted(k for k in wants if wants[k] > 0)  # type: ignore[type-var]
    while left > 0 and open_:
        total = sum(max(weights.get(k, 0.0), 0.0) for k in open_)
        given = 0
        for k in open_:
            part = left / len(open_) if total <= 0 else left * max(weights.get(k, 0.0), 0.0) / total
            n = min(wants[k] - out[k], math.floor(part))
            out[k] += n
            given += n
        left -= given
        open_ = [k for k in open_ if out[k] < wants[k]]
        if given == 0:
            for k in sorted(open_, key=lambda k: -weights.get(k, 0.0)):
                if left == 0:
                    break
                out[k] += 1
                left -= 1
            open_ = [k for k in open_ if out[k] < wants[k]]
    return out
