"""Stream-end budget calls the store could not take, sent again from a bounded buffer.

Envoy sends a stream's settle and close once, at stream end, and discards the answer: if
the store fails then, the usage would be lost (and the reservation held until its TTL). The
service keeps such calls here instead, at most CAPACITY of them (past it the oldest are
dropped, and counted), and sends them again, in the order they came, until the store takes
them: first after RETRY_FIRST seconds, then backing off to RETRY_LONGEST.

A retry is safe: a call that did reach the store before its reply was lost finds its
transaction finished (its tombstone) and changes nothing, so nothing is charged twice. Each
call keeps its own instant, so a late settle still goes to the window its reservation was
made in; one that comes after the reservation's TTL finds it expired (and ended by the
rule's policy), which is why the TTL should outlast an outage the buffer is meant to ride.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from ..backends.base import Backend, BackendError
from ..config.budget_store import RELEASE, SETTLE
from ..runtime.aio import cancel
from .calls import budget_status

log = logging.getLogger("ratelimitd.budget")

__all__ = ["CAPACITY", "StreamEnds"]

CAPACITY = 10_000
RETRY_FIRST, RETRY_LONGEST = 0.5, 10.0
_BATCH = 256  # calls per retried round


class StreamEnds:
    """The stream-end calls waiting for the store (module docstring)."""

    def __init__(
        self,
        backend: Backend,
        ratio: float,
        stats: Any,
        *,
        capacity: int = CAPACITY,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.backend = backend
        self.ratio = ratio  # NEAR_LIMIT_RATIO, for the statistics of a retried call
        self.stats = stats  # the service's counters (budget_retried, budget_retry_dropped)
        self.capacity = capacity
        self._sleep = sleep
        self._calls: deque[tuple[int, Any, Any]] = deque()  # (sequence, op, item)
        self._seq = 0
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._calls)

    def keep(self, plan: Any) -> int:
        """Keep the settles and closes of a plan whose store round failed (its `ops`, in
        item order); how many. The retries start in the background."""
        kept = 0
        ops = plan.ops
        for item in plan.items:
            call = item.budget
            if call is None or call[0] not in (SETTLE, RELEASE) or item.first < 0:
                continue
            self._seq += 1
            self._calls.append((self._seq, ops[item.first], item))
            kept += 1
        while len(self._calls) > self.capacity:
            self._calls.popleft()
            self.stats.budget_retry_dropped += 1
        if kept and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return kept

    async def flush(self) -> bool:
        """Send the oldest waiting calls (one round); True when the store took them."""
        batch = list(self._calls)[:_BATCH]
        if not batch:
            return True
        try:
            results = await self.backend.increment([op for _, op, _ in batch])
        except BackendError:
            return False
        last = batch[-1][0]
        while self._calls and self._calls[0][0] <= last:  # some may have been dropped
            self._calls.popleft()
        for (_, _, item), result in zip(batch, results, strict=True):
            budget_status(item, result, self.ratio)  # its statistics, as if on time
        self.stats.budget_retried += len(batch)
        return True

    async def _drain(self) -> None:
        wait = RETRY_FIRST
        while self._calls:
            await self._sleep(wait)
            wait = RETRY_FIRST if await self.flush() else min(wait * 2, RETRY_LONGEST)

    async def close(self) -> None:
        """Shutdown: one last round for what waits, then stop retrying (what is left is
        lost, and logged)."""
        await cancel(self._task)
        self._task = None
        while self._calls and await self.flush():
            pass
        if self._calls:
            log.warning(
                "%d token budget settles and closes could not reach the store before "
                "shutdown: their reservations end by their TTL",
                len(self._calls),
            )
