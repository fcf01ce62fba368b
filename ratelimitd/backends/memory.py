"""The embedded in-memory backend: counters with TTL, no external server.

It is the default when no Redis or memcached is configured, and the baseline of tests
and benchmarks. Semantics are Redis INCRBY + EXPIRE: an increment creates the counter
at 0 if absent or expired, adds the hits, and (re)sets the TTL to unit + jitter.

Memory stays bounded by the live keys: each key sits in exactly one expiry bucket (the
second it was due to expire when last bucketed). Once per second the due buckets are
swept; a key whose TTL was refreshed since is moved to its new bucket, an expired one is
deleted. The hot path pays a bucket append only when it creates a key.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Sequence

from .base import Op


class MemoryBackend:
    """Process-local fixed-window counters: a `SyncBackend` (see base)."""

    name = "memory"

    def __init__(self, jitter_max_seconds: int = 0, clock: Callable[[], float] = time.time) -> None:
        self._counters: dict[str, list[int]] = {}  # key -> [value, expires_at]
        self._buckets: dict[int, list[str]] = {}  # expiry second -> keys
        self._due: list[int] = []  # heap of bucket seconds
        self._jitter = jitter_max_seconds
        self._clock = clock
        self._next_sweep = 0

    def __len__(self) -> int:
        return len(self._counters)

    async def connect(self) -> None:
        """Nothing to reach."""

    def increment_now(self, ops: Sequence[Op], now: int) -> list[int]:
        """The synchronous core of `increment` at Unix time `now` (the limiter's clock)."""
        if now >= self._next_sweep:
            self._sweep(now)
        counters = self._counters
        jitter = self._jitter
        out = []
        for op in ops:
            key = op.key
            hits = op.hits
            expires = now + op.seconds
            if jitter > 0:
                expires += int(random.random() * jitter)
            entry = counters.get(key)
            if entry is None:
                entry = counters[key] = [hits, expires]
                self._bucket(key, expires)
            elif entry[1] <= now:  # expired, not swept yet: a fresh counter
                entry[0] = hits
                entry[1] = expires
            else:
                entry[0] += hits
                entry[1] = expires
            out.append(entry[0])
        return out

    def increment_one(self, key: str, hits: int, seconds: int, now: int) -> int:
        """`increment_now` for a single op (the limiter's per-descriptor fast path)."""
        if now >= self._next_sweep:
            self._sweep(now)
        expires = now + seconds
        if self._jitter > 0:
            # int(random() * n) is uniform on [0, n) like randrange, at a tenth of its cost.
            expires += int(random.random() * self._jitter)
        entry = self._counters.get(key)
        if entry is None:
            self._counters[key] = [hits, expires]
            self._bucket(key, expires)
            return hits
        if entry[1] <= now:  # expired, not swept yet: a fresh counter
            entry[0] = hits
        else:
            entry[0] += hits
        entry[1] = expires
        return entry[0]

    async def increment(self, ops: Sequence[Op]) -> list[int]:
        """INCRBY + EXPIRE for each op; the counters after."""
        return self.increment_now(ops, int(self._clock()))

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """Current values (0 when absent or expired)."""
        now = int(self._clock())
        out = []
        for op in ops:
            entry = self._counters.get(op.key)
            out.append(entry[0] if entry is not None and entry[1] > now else 0)
        return out

    def ttl(self, key: str) -> int:
        """Seconds to expiry (-2 when absent), like Redis TTL; for tests."""
        entry = self._counters.get(key)
        now = int(self._clock())
        if entry is None or entry[1] <= now:
            return -2
        return entry[1] - now

    async def close(self) -> None:
        """Nothing to release."""
        self._counters.clear()
        self._buckets.clear()
        self._due.clear()

    def _bucket(self, key: str, expires: int) -> None:
        bucket = self._buckets.get(expires)
        if bucket is None:
            bucket = self._buckets[expires] = []
            heapq.heappush(self._due, expires)
        bucket.append(key)

    def _sweep(self, now: int) -> None:
        self._next_sweep = now + 1
        counters = self._counters
        due = self._due
        while due and due[0] <= now:
            second = heapq.heappop(due)
            for key in self._buckets.pop(second, ()):
                entry = counters.get(key)
                if entry is None:
                    continue
                if entry[1] <= now:
                    del counters[key]
                else:
                    self._bucket(key, entry[1])
