"""The embedded in-memory backend: counters with TTL, no external server.

It is the default when no Redis or memcached is configured, and the baseline of tests
and benchmarks. Semantics are Redis INCRBY + EXPIRE: an increment creates the counter
at 0 if absent or expired, adds the hits, and (re)sets the TTL to unit + jitter.
Expired counters are reclaimed by an incremental sweep, so memory stays bounded by the
live keys without a stop-the-world scan.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence

# Keys examined per increment call by the incremental sweep.
SWEEP_STEP = 64


class MemoryBackend:
    """Process-local fixed-window counters."""

    name = "memory"

    def __init__(
        self, jitter_max_seconds: int = 0, clock: Callable[[], float] = time.time
    ) -> None:
        self._counters: dict[str, list[int]] = {}  # key -> [value, expires_at]
        self._jitter = jitter_max_seconds
        self._clock = clock
        self._sweep: Iterator[str] | None = None

    def __len__(self) -> int:
        return len(self._counters)

    def increment_now(self, ops: Sequence[tuple[str, int, int]]) -> list[int]:
        """The synchronous core of `increment`."""
        now = int(self._clock())
        counters = self._counters
        jitter = self._jitter
        out = []
        for key, hits, seconds in ops:
            entry = counters.get(key)
            if entry is None or entry[1] <= now:
                entry = counters[key] = [0, 0]
            entry[0] += hits
            entry[1] = now + seconds + (random.randrange(jitter) if jitter > 0 else 0)
            out.append(entry[0])
        self._reclaim(now)
        return out

    async def increment(self, ops: Sequence[tuple[str, int, int]]) -> list[int]:
        """INCRBY + EXPIRE for each op; the counters after."""
        return self.increment_now(ops)

    async def get(self, keys: Sequence[tuple[str, int]]) -> list[int]:
        """Current values (0 when absent or expired)."""
        now = int(self._clock())
        out = []
        for key, _seconds in keys:
            entry = self._counters.get(key)
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

    def _reclaim(self, now: int) -> None:
        # Walk a snapshot of the keys a few at a time; start a new pass when done.
        if self._sweep is None:
            self._sweep = iter(list(self._counters))
        counters = self._counters
        for _ in range(SWEEP_STEP):
            key = next(self._sweep, None)
            if key is None:
                self._sweep = None
                return
            entry = counters.get(key)
            if entry is not None and entry[1] <= now:
                del counters[key]
