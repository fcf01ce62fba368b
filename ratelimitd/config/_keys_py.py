"""Cache keys, fixed-window arithmetic, near-limit maths and the status split: the pure twin.

`_keys.pyx` is the compiled twin; both expose the same names and are selected by `keys.py`.
Everything here is exactly what envoyproxy/ratelimit computes (its `src/utils`
and `src/limiter`), because ratelimitd and the Go service must be able to share one Redis.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Sequence
from typing import Any

from ..messages import OK, OVER_LIMIT, Status

# Counters saturate at the top of Redis' signed range (see keys.COUNTER_MAX).
COUNTER_MAX = 2**63 - 1

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
    return state_key(prefix, domain, entries, share, str((now // seconds) * seconds))


def evaluate(limit: int, hits: int, after: int, near: int) -> tuple[bool, int, int, int, int]:
    """Status and stat increments for one counter (the reference's `GetResponseDescriptorStatus`).

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
    return refuse(rule, st, over_add, reset_seconds(now, rule.unit_seconds))


def settle(rule: Any, st: Any, hits: int, after: int, ratio: float, now: int) -> Status:
    """The Status at `now` of a counter that is `after` once `hits` were added, and the
    over/near/within/shadow split of its stats (the reference's `GetResponseDescriptorStatus`)."""
    return verdict(rule, st, hits, after, ratio, reset_seconds(now, rule.unit_seconds))


# -- the extension's algorithms (docs/algorithms.md) --------------------------------------
#
# Integer maths on "ticks" (ms, or s; see config.ruleset.MAX_TICK_PRODUCT): every product
# stays below 2**50, so the compiled twin (int64), this one and the Redis scripts (Lua
# doubles) compute the very same numbers.


def state_key(
    prefix: str,
    domain: str,
    entries: Sequence[tuple[str, str]],
    share: Sequence[str] | None,
    suffix: str = "",
) -> str:
    """`prefix + domain_k_v[_k_v..]_ + suffix`: `cache_key` with `suffix` for its window start."""
    parts = [prefix, domain, "_"]
    if share is None:
        for k, v in entries:
            parts += (k, "_", v, "_")
    else:
        for i, (k, v) in enumerate(entries):
            pattern = share[i] if i < len(share) else ""
            parts += (k, "_", pattern or v, "_")
    parts.append(suffix)
    return "".join(parts)


def sliding_window(
    w: int, c: int, p: int, now: int, window: int, limit: int, hits: int
) -> tuple[int, int, int, int, int]:
    """One decision of the two-window weighted counter.

    State: `w` the start of the window `c` counts (0: none), `c` hits admitted in it, `p`
    hits admitted in the window before. The level is ceil(p x the part of the previous
    window still inside the rolling window) + c; the hits are admitted (counted in `c`)
    iff level + hits <= limit. Returns (level + hits, w, c, p, ticks until reset): until
    nothing is counted any more when admitted, until these hits would be when not.
    """
    start = now - now % window
    if w < start:  # a later window: roll
        p = c if w == start - window else 0
        c = 0
        w = start
    elif w > start:  # written by a clock ahead of ours: count in its window, from its start
        now = start = w
    left = start + window - now  # 1..window
    pe = p if p < limit else limit
    after = -(-pe * left // window) + c + hits
    if after <= limit:
        c += hits
        return after, w, c, p, left + window if c else left
    room = limit - c - hits
    if room >= 0:  # later in this window, once the previous one weighs little enough
        reset = left - room * window // pe
    elif hits > limit:  # never: until everything is forgotten
        reset = left + window
    else:  # in the next window, where this one's count weighs as the previous one
        ce = c if c < limit else limit
        reset = left + window - (limit - hits) * window // ce if ce else left
    return after, w, c, p, reset


def token_bucket(
    t: int, f: int, now: int, window: int, limit: int, hits: int
) -> tuple[int, int, int, int]:
    """One GCRA decision: a bucket of `limit` tokens refilled `limit` per `window`.

    State: the theoretical arrival time TAT = t + f/limit ticks (0, 0: none). The level is
    the tokens in use, ceil((TAT - now) x limit / window); the hits are admitted (TAT moves
    hits x window/limit on) iff level + hits <= limit. Returns (level + hits, t, f, ticks
    until reset): until the bucket is full when admitted, until these hits would be when
    not (until full if they never would).
    """
    if limit <= 0:
        return hits, t, f, window if hits else 0
    d = t - now
    if d < 0:
        debt = 0
    else:
        if d > window:  # written by a clock ahead of ours
            d = window
        debt = d * limit + (f if f < limit else limit - 1)  # in 1/limit ticks
    after = -(-debt // window) + hits
    if after <= limit:
        debt += hits * window
        return after, now + debt // limit, debt % limit, -(-debt // limit)
    if hits <= limit:
        return after, t, f, -(-(debt - (limit - hits) * window) // limit)
    return after, t, f, -(-debt // limit)


def bump(store: Any, key: str, hits: int, seconds: int, now: int) -> int:
    """INCRBY `key` `hits` + EXPIRE `seconds` (+ jitter) at `now` in a memory store's map
    (`store._counters`: key -> [value, expires]), as Redis does: an absent or expired counter
    starts from `hits`; a counter saturates at COUNTER_MAX. The counter after.

    The memory backend's per-window fast path, compiled with the counter maths; the store
    keeps the rest: its sweep (`store._sweep(now)`, due from `store._next_sweep`) and what a
    new key costs it (`store._created(key, expires, now)`).
    """
    if now >= store._next_sweep:
        store._sweep(now)
    expires = now + seconds
    jitter = store._jitter
    if jitter > 0:
        # int(random() * n) is uniform on [0, n) like randrange, at a tenth of its cost.
        expires += int(random.random() * jitter)
    counters = store._counters
    entry = counters.get(key)
    if entry is None:
        counters[key] = [hits, expires]
        store._created(key, expires, now)
        return hits
    if entry[1] <= now:  # expired, not swept yet: a fresh counter
        entry[0] = hits
    else:
        count = entry[0] + hits
        entry[0] = count if count <= COUNTER_MAX else COUNTER_MAX  # saturates
    entry[1] = expires
    return entry[0]  # type: ignore[no-any-return]


class Bump:
    """`bump` bound to one store: the memory backend's `increment_one` (the compiled twin's
    decision path calls it without a Python call)."""

    __slots__ = ("store",)

    def __init__(self, store: Any) -> None:
        self.store = store

    def __call__(self, key: str, hits: int, seconds: int, now: int) -> int:
        return bump(self.store, key, hits, seconds, now)


def refuse(rule: Any, st: Any, over_add: int, reset: int) -> Status:
    """`over` with the reset given: OVER_LIMIT (OK in shadow mode) and its stats."""
    st.over_limit += over_add
    if rule.shadow_mode:
        st.shadow_mode += over_add
        return Status(OK, rule, 0, reset)
    return Status(OVER_LIMIT, rule, 0, reset)


def verdict(rule: Any, st: Any, hits: int, after: int, ratio: float, reset: int) -> Status:
    """`settle` with the reset given (any algorithm): the Status and its stats split."""
    limit = rule.requests_per_unit
    is_over, remaining, over_add, near_add, _ = evaluate(
        limit, hits, after, near_threshold(limit, ratio)
    )
    if near_add:
        st.near_limit += near_add
    if is_over:
        return refuse(rule, st, over_add, reset)
    st.within_limit += hits
    return Status(OK, rule, remaining, reset)


# What the compiled module provides too (`_twins.select` checks a build against it).
__all__ = [
    "UNIT_SECONDS",
    "Bump",
    "bump",
    "cache_key",
    "evaluate",
    "near_threshold",
    "over",
    "refuse",
    "reset_seconds",
    "settle",
    "sliding_window",
    "state_key",
    "token_bucket",
    "unit_seconds",
    "verdict",
    "window_start",
]
