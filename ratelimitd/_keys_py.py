"""Cache keys, fixed-window arithmetic, near-limit maths and the status split: the pure twin.

`_keys.pyx` is the compiled twin; both expose the same names and are selected by `keys.py`.
Everything here is exactly what envoyproxy/ratelimit computes (reference sections 3.1,
7.2 and 7.3), because ratelimitd and the Go service must be able to share one Redis.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

from .messages import OK, OVER_LIMIT, Status

# Seconds per RLS v3 `RateLimitResponse.RateLimit.Unit`, indexed by the enum number:
# UNKNOWN 0, SECOND 1, MINUTE 2, HOUR 3, DAY 4, MONTH 5, YEAR 6, WEEK 7.
# MONTH and YEAR are fixed 30- and 365-day blocks aligned to the epoch, not calendar ones.
UNIT_SECONDS: tuple[int, ...] = (0, 1, 60, 3600, 86400, 2592000, 31536000, 604800)

_U64 = 0xFFFFFFFFFFFFFFFF
_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    return float(_F32.unpack(_F32.pack(x))[0])


def unit_seconds(unit: int) -> int:
    """Window length of a unit enum number (0 for UNKNOWN or out of range)."""
    if 0 <= unit < len(UNIT_SECONDS):
        return UNIT_SECONDS[unit]
    return 0


def window_start(now: int, seconds: int) -> int:
    """Start of the epoch-aligned fixed window containing `now`."""
    return (now // seconds) * seconds


def reset_seconds(now: int, seconds: int) -> int:
    """Seconds until the current window ends (`unit - now % unit`, never 0)."""
    return seconds - now % seconds


def near_threshold(limit: int, ratio: float) -> int:
    """floor(limit * ratio) computed in float32, exactly as the reference.

    Two float32 operands multiply exactly in float64 (24+24 bits < 53), so rounding that
    product once to float32 gives the float32 product.
    """
    return math.floor(_f32(_f32(float(limit)) * _f32(ratio)))


def cache_key(
    prefix: str,
    domain: str,
    entries: Sequence[tuple[str, str]],
    share: Sequence[str] | None,
    seconds: int,
    now: int,
) -> str:
    """`prefix + domain_k_v[_k_v..]_<windowStart>`, share_threshold patterns replacing values."""
    parts = [prefix, domain, "_"]
    if share is None:
        for k, v in entries:
            parts += (k, "_", v, "_")
    else:
        for i, (k, v) in enumerate(entries):
            pattern = share[i] if i < len(share) else ""
            parts += (k, "_", pattern or v, "_")
    parts.append(str((now // seconds) * seconds))
    return "".join(parts)


def evaluate(limit: int, hits: int, after: int, near: int) -> tuple[bool, int, int, int, int]:
    """Status and stat increments for one counter (reference section 7.3).

    Returns (over_limit, remaining, over_add, near_add, within_add). `before` is computed
    in uint64 like the reference: when hits were not actually added (the
    stop-increment-when-over-limit mode) it wraps, and the wrap decides the branch.
    """
    before = (after - hits) & _U64
    if after > limit:
        if before >= limit:
            return True, 0, hits, 0, 0
        return True, 0, after - limit, (limit - max(near, before)) & _U64, 0
    near_add = 0
    if after > near:
        near_add = hits if before >= near else after - near
    return False, limit - after, 0, near_add, hits


def over(rule: Any, st: Any, over_add: int, now: int) -> Status:
    """The Status at `now` of an over-limit counter, with its over_limit (and shadow_mode)
    stats: OVER_LIMIT, or OK when the rule is in shadow mode (only observed)."""
    reset = reset_seconds(now, rule.unit_seconds)
    st.over_limit += over_add
    if rule.shadow_mode:
        st.shadow_mode += over_add
        return Status(OK, rule, 0, reset)
    return Status(OVER_LIMIT, rule, 0, reset)


def settle(rule: Any, st: Any, hits: int, after: int, ratio: float, now: int) -> Status:
    """The Status at `now` of a counter that is `after` once `hits` were added, and the
    over/near/within/shadow split of its stats (reference section 7.3)."""
    limit = rule.requests_per_unit
    is_over, remaining, over_add, near_add, _ = evaluate(
        limit, hits, after, near_threshold(limit, ratio)
    )
    if near_add:
        st.near_limit += near_add
    if is_over:
        return over(rule, st, over_add, now)
    st.within_limit += hits
    return Status(OK, rule, remaining, reset_seconds(now, rule.unit_seconds))
