"""The embedded in-memory backend: counters with TTL, no external server.

It is the default when no Redis or memcached is configured, and the baseline of tests
and benchmarks. Semantics are Redis INCRBY + EXPIRE: an increment creates the counter
at 0 if absent or expired, adds the hits, and (re)sets the TTL to unit + jitter.

Memory stays bounded by the live keys: each key sits in exactly one expiry bucket (the
second it was due to expire when last bucketed). Once per second the due buckets are
swept; a key whose TTL was refreshed since is moved to its new bucket, an expired one is
deleted. The hot path pays a bucket append only when it creates a key.

A fixed-window counter is one int, `value << EXPIRY_BITS | expires`: a list of the value
and the expiry cost a list and two ints per key (about 100 bytes more at a million keys).
A sliding-window or token-bucket state stays `[state tuple, expires]`. The map is a
`counters.CounterTable`: compiled, the packed counter sits in the table's slot beside the
key's hashes, so a decision on a store of a million keys touches one cache line of it where
a dict touched four (its index, its entry, the key, the int); the pure twin is a dict.

And the live keys are bounded (MEMORY_MAX_KEYS): 10,000 new keys a second once added 146 MB
a minute. A key counts once per started KEY_UNIT bytes of its name, so long descriptor values
cannot make the bound meaningless. A store that is full drops its expired keys, then evicts
the keys closest to their expiry (they would vanish soonest; an evicted counter restarts
from 0). The map is rebuilt once it has shrunk to a quarter of its peak, and the freed
memory handed back (`allocator.Trimmer`): neither a dict nor the table shrinks by itself.
"""

from __future__ import annotations

import heapq
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..config.budget_store import MAX_BUDGET_TXNS
from ..config.keys import COUNTER_MAX, EXPIRY_BITS, EXPIRY_MASK
from ..config.keys import sliding_window as _sliding_window
from ..config.keys import token_bucket as _token_bucket
from ..config.windows import FIXED_WINDOW, SLIDING_WINDOW
from ..runtime.allocator import Trimmer
from . import MEMORY
from .base import Op
from .counters import CounterTable, TableBump
from .memory_budget import MAX_TXNS, MemoryBudgets

if TYPE_CHECKING:
    from ..health import Health
    from ..settings import Settings
    from ..stats import StatsStore

log = logging.getLogger("ratelimitd.backends.memory")

# MEMORY_MAX_KEYS' default, and the bytes of key name one unit of it allows.
DEFAULT_MAX_KEYS = 1_000_000
KEY_UNIT = 256
# What one key costs besides its name (table slots, expiry bucket slot), for the trimmer's
# estimate of what a rebuild frees.
_KEY_BYTES = 100
# A full store evicts this fraction of its bound more, so that eviction is not paid per key.
_EVICT_SLACK = 1 / 64
# The table is rebuilt once it holds a quarter of its peak, from this size on.
_COMPACT_FROM = 65_536
# At most one "store full" warning per this many seconds.
_LOG_EVERY = 60.0


class MemoryBackend:
    """Process-local counters (and sliding-window / token-bucket states): a `SyncBackend`."""

    name = "memory"
    capabilities = MEMORY
    # What `TableBump` reads on every counted window, as slots (a member descriptor is a
    # few instructions where an instance dict lookup is a hashed probe); the rest of the
    # store's state lives in its `__dict__`.
    __slots__ = ("__dict__", "_counters", "_jitter", "_next_sweep")

    def __init__(
        self,
        jitter_max_seconds: int = 0,
        clock: Callable[[], float] = time.time,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        trimmer: Trimmer | None = None,
        budget_max_transactions: int = MAX_BUDGET_TXNS,
        max_budget_transactions: int = MAX_TXNS,
    ) -> None:
        # key -> value << EXPIRY_BITS | expires, or [state tuple, expires]
        self._counters: dict[str, Any] = CounterTable()
        self._buckets: dict[int, list[str]] = {}  # expiry second -> keys
        self._due: list[int] = []  # heap of bucket seconds
        self._jitter = jitter_max_seconds
        self._clock = clock
        self._next_sweep = 0
        # `increment_now` of one fixed-window op given as its fields (no Op built): the
        # limiter's per-window fast path, compiled with the table (`counters.TableBump`,
        # which the compiled decision calls in C).
        self.increment_one: Callable[[str, int, int, int], int] = TableBump(self)
        self.max_keys = max_keys
        # Units of max_keys in use (a key of n bytes uses 1 + n // KEY_UNIT), the dict's
        # peak size since it was last rebuilt, and the keys evicted so far.
        self.used = 0
        self._peak = 0
        self.evicted = 0
        self._logged = -_LOG_EVERY
        self._trimmer = trimmer if trimmer is not None else Trimmer()
        # Token budgets (`Op.budget` calls): their own keys, forgotten when they can no
        # longer matter.
        self.budgets = MemoryBudgets(budget_max_transactions, max_budget_transactions)
        # One budget call, straight to its maths (`SyncBackend.budget_now`).
        self.budget_now = self.budgets.apply

    def __len__(self) -> int:
        return len(self._counters)

    async def connect(self) -> None:
        """Nothing to reach."""

    def increment_now(self, ops: Sequence[Op], now: int) -> list[Any]:
        """The synchronous core of `increment` at Unix time `now` (the limiter's clock)."""
        if now >= self._next_sweep:
            self._sweep(now)
        counters = self._counters
        jitter = self._jitter
        out: list[Any] = []
        for op in ops:
            if op.algorithm != FIXED_WINDOW:
                out.append(self._decide(op, now))
                continue
            if op.budget is not None:
                out.append(self.budgets.apply(op.budget))
                continue
            key = op.key
            hits = op.hits
            expires = now + op.seconds
            if jitter > 0:
                expires += int(random.random() * jitter)
            entry = counters.get(key)
            if type(entry) is int and entry & EXPIRY_MASK > now:  # a live counter
                value = entry >> EXPIRY_BITS
                if op.refund:  # decrement, floored at 0
                    value = max(0, value - hits)
                else:
                    value += hits
                    if value > COUNTER_MAX:
                        value = COUNTER_MAX  # saturates
            elif op.refund:  # an absent counter stays absent
                out.append(0)
                continue
            else:  # absent, or expired and not swept yet: a fresh counter
                value = hits
            counters[key] = value << EXPIRY_BITS | expires
            if entry is None:
                self._created(key, expires, now)
            out.append(value)
        return out

    def _decide(self, op: Op, now: int, *, peek: bool = False) -> tuple[int, int]:
        """A sliding-window or token-bucket op: (level after, ticks until reset)."""
        return self.decide_now(
            op.key,
            op.algorithm,
            0 if peek else op.hits,
            op.seconds * 1000 // op.tick,
            op.limit,
            op.tick,
            op.now,
            now,
        )

    def decide_now(
        self,
        key: str,
        algorithm: int,
        hits: int,
        window: int,
        limit: int,
        tick: int,
        now_ticks: int,
        now: int,
    ) -> tuple[int, int]:
        """One sliding-window or token-bucket decision (`window`, `now_ticks` in ticks of
        `tick` ms; `now` in seconds for expiry): (level after, ticks until reset).

        The state lives in the counter map as `[state tuple, expires]`, so expiry and the
        sweep treat it like a counter; it is kept exactly as long as it can matter.
        """
        if now >= self._next_sweep:
            self._sweep(now)
        entry = self._counters.get(key)
        state = entry[0] if type(entry) is list and entry[1] > now else None
        if algorithm == SLIDING_WINDOW:
            w, c, p = state or (0, 0, 0)
            after, w, c, p, reset = _sliding_window(w, c, p, now_ticks, window, limit, hits)
            if after > limit or not hits:
                return after, reset
            # Until the end of the window after `w`'s: then c weighs nothing any more.
            expires = (w + 2 * window) * tick // 1000 + 1
            new: tuple[int, ...] = (w, c, p)
        else:
            t, f = state or (0, 0)
            after, t, f, reset = _token_bucket(t, f, now_ticks, window, limit, hits)
            if after > limit or not hits:
                return after, reset
            expires = t * tick // 1000 + 1  # until the bucket is full again
            new = (t, f)
        if type(entry) is list:
            entry[0] = new
            entry[1] = expires
        else:
            self._counters[key] = [new, expires]
            if entry is None:
                self._created(key, expires, now)
        return after, reset

    async def increment(self, ops: Sequence[Op]) -> list[Any]:
        """INCRBY + EXPIRE for each op; the counters after."""
        return self.increment_now(ops, int(self._clock()))

    async def peek(self, ops: Sequence[Op]) -> list[Any]:
        """`increment` on a copy of the ops' entries: what it would return, nothing written."""
        now = int(self._clock())
        states = []
        for op in ops:
            states.append(_live(self._counters.get(op.key), now))
        out = simulate(ops, states, now)
        calls = [j for j, op in enumerate(ops) if op.budget is not None]
        if calls:  # on copies of the budgets, in order: nothing written
            results = self.budgets.dry_run([ops[j].budget for j in calls])
            for j, result in zip(calls, results, strict=True):
                out[j] = result
        return out

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """Current values (0 when absent or expired); a decided op's level, uncounted."""
        now = int(self._clock())
        out = []
        for op in ops:
            if op.algorithm != FIXED_WINDOW:
                out.append(self._decide(op, now, peek=True)[0])
                continue
            value = _live(self._counters.get(op.key), now)
            out.append(value if type(value) is int else 0)
        return out

    async def delete(self, keys: Sequence[str]) -> int:
        """Drop counters (their expiry buckets drop them again, harmlessly)."""
        now = int(self._clock())
        found = 0
        for key in keys:
            entry = self._counters.pop(key, None)
            if entry is not None:
                self.used -= 1 + len(key) // KEY_UNIT
                found += _expiry(entry) > now
            else:
                found += self.budgets.delete(key, now * 1000)
        return found

    def ttl(self, key: str) -> int:
        """Seconds to expiry (-2 when absent), like Redis TTL; for tests."""
        entry = self._counters.get(key)
        now = int(self._clock())
        if entry is None or _expiry(entry) <= now:
            return -2
        return _expiry(entry) - now

    async def close(self) -> None:
        """Nothing to release."""
        self._counters.clear()
        self._buckets.clear()
        self._due.clear()
        self.used = 0

    def _created(self, key: str, expires: int, now: int) -> None:
        """Account for a new key (already in the dict), evicting others if it overflows."""
        self._bucket(key, expires)
        self.used += 1 + len(key) // KEY_UNIT
        size = len(self._counters)
        if size > self._peak:
            self._peak = size
        if self.used > self.max_keys:
            self._make_room(now)

    def _make_room(self, now: int) -> None:
        """Expired keys first, then the ones closest to expiry, down to the bound less a
        little slack."""
        self._sweep(now, compact=False)  # the caller holds the dict: no rebuild now
        goal = self.max_keys - int(self.max_keys * _EVICT_SLACK)
        due = self._due
        evicted = 0
        while self.used > goal and due:
            # The earliest bucket goes whole, though its keys have not expired yet.
            evicted += self._drop_due(due[0])
        self.evicted += evicted
        if evicted and now - self._logged >= _LOG_EVERY:
            self._logged = now
            log.warning(
                "memory backend full (MEMORY_MAX_KEYS=%d): evicted %d counters closest to "
                "their expiry (%d so far)",
                self.max_keys,
                evicted,
                self.evicted,
            )

    def _bucket(self, key: str, expires: int) -> None:
        bucket = self._buckets.get(expires)
        if bucket is None:
            bucket = self._buckets[expires] = []
            heapq.heappush(self._due, expires)
        bucket.append(key)

    def _drop_due(self, until: int) -> int:
        """Take the earliest expiry bucket off the heap: delete its keys that expire by
        `until`, file the ones refreshed since under their later expiry; how many went."""
        counters = self._counters
        dropped = 0
        for key in self._buckets.pop(heapq.heappop(self._due), ()):
            entry = counters.get(key)
            if entry is None:
                continue
            expires = _expiry(entry)
            if expires > until:
                self._bucket(key, expires)
                continue
            del counters[key]
            self.used -= 1 + len(key) // KEY_UNIT
            dropped += 1
        return dropped

    def _sweep(self, now: int, *, compact: bool = True) -> None:
        self._next_sweep = now + 1
        due = self._due
        while due and due[0] <= now:
            self._drop_due(now)
        counters = self._counters
        size = len(counters)
        if compact and self._peak >= _COMPACT_FROM and size < self._peak // 4:
            # A table keeps its largest size until rebuilt: give the rest back.
            freed = (self._peak - size) * _KEY_BYTES
            self._counters = type(counters)(counters)
            self._peak = size
            self._trimmer.freed(freed)


def create_memory_backend(
    settings: Settings,
    health: Health | None = None,
    stats: StatsStore | None = None,
    clock: Callable[[], float] = time.time,
) -> MemoryBackend:
    """The registry factory: counters in this process (EXPIRATION_JITTER_MAX_SECONDS)."""
    cache = settings.cache
    return MemoryBackend(
        cache.expiration_jitter_max_seconds,
        clock=clock,
        max_keys=cache.memory_max_keys,
        budget_max_transactions=cache.budget_max_transactions,
        max_budget_transactions=cache.memory_max_budget_transactions,
    )


def simulate(ops: Sequence[Op], states: Sequence[Any], now: int) -> list[Any]:
    """What `increment(ops)` returns on a store holding `states` (one per op: a counter, a
    sliding-window or token-bucket state tuple, or None when absent): a dry run of any store
    that keeps its states as this one does, with the same maths."""
    scratch = MemoryBackend()
    for op, state in zip(ops, states, strict=True):
        if state is not None:
            scratch._counters[op.key] = stored(state, EXPIRY_MASK)  # never expires
    return scratch.increment_now(ops, now)


def stored(state: Any, expires: int) -> Any:
    """What the counter map holds for a counter (an int) or a state tuple expiring at
    `expires` (Unix seconds)."""
    if type(state) is int:
        return state << EXPIRY_BITS | expires
    return [state, expires]


def unpack(entry: Any) -> tuple[Any, int]:
    """What `stored` packed: (counter or state tuple, expires)."""
    if type(entry) is int:
        return entry >> EXPIRY_BITS, entry & EXPIRY_MASK
    return entry[0], entry[1]


def _live(entry: Any, now: int) -> Any:
    """An entry's counter or state tuple, None when absent or expired at `now`."""
    if entry is None:
        return None
    if type(entry) is int:
        return entry >> EXPIRY_BITS if entry & EXPIRY_MASK > now else None
    return entry[0] if entry[1] > now else None


def _expiry(entry: Any) -> int:
    """An entry's expiry (Unix seconds)."""
    return entry & EXPIRY_MASK if type(entry) is int else entry[1]  # type: ignore[no-any-return]
