"""A circuit breaker per Redis instance, main and per-second (extension).

Why: behind a stalled store every decision waits its full REDIS_REQUEST_TIMEOUT before it
fails, so a hung Redis turns into latency and pile-ups for as long as it hangs (upstream
#462, #978). After BACKEND_BREAKER_FAILURES consecutive failures (errors or timeouts) the
breaker opens: calls fail at once with `BreakerOpen` without touching the store, and the
service answers them with BACKEND_FAILURE_POLICY. Once BACKEND_BREAKER_PROBE_INTERVAL has
passed it half-opens: the next call goes to the store as the one probe (others still fail
at once); the probe's success closes the breaker, its failure opens it for another interval.

A success resets the failure count, so only an unbroken run of failures opens it. A call
cancelled before it finished (a client's deadline) counts as neither. (The memcache backend
has none: it fails open, as the reference's, so no failure ever reaches the service.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from .base import BackendError

log = logging.getLogger(__name__)

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "STATE_NAMES",
    "Breaker",
    "BreakerOpen",
    "WithBreakers",
    "add_breaker_stats",
    "breaker_args",
]

# The `breaker_state` gauge's values: 0 is the healthy state, so a sum over instances or
# workers that is not 0 says some breaker is not closed.
CLOSED, HALF_OPEN, OPEN = 0, 1, 2
STATE_NAMES = ("closed", "half_open", "open")


def breaker_args(cache: Any) -> tuple[int, float] | None:
    """(failures, probe interval) from CacheSettings when BACKEND_BREAKER_FAILURES is set."""
    if not cache.breaker_failures:
        return None
    return cache.breaker_failures, cache.breaker_probe_interval


class BreakerOpen(BackendError):
    """A call refused by an open (or probing) breaker: the store was not asked."""


class Breaker:
    """The state machine of one store instance's breaker; `call` runs a store call through it."""

    def __init__(
        self,
        name: str,
        failures: int,
        probe_interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        before_probe: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        # Run before the probe's call (the Redis instance dials a pool left with no
        # connection), so a store that is back closes the breaker at the first probe.
        self.before_probe = before_probe
        self.threshold = failures
        self.probe_interval = probe_interval
        self.clock = clock
        self.state = CLOSED
        self.failures = 0  # consecutive, while closed
        self.opened_at = 0.0
        self.probing = False
        self.opened = 0  # times it opened (a counter stat)
        self.refused = 0  # calls refused without touching the store (a counter stat)

    @property
    def state_name(self) -> str:
        """closed, half_open or open."""
        return STATE_NAMES[self.state]

    async def call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> Any:
        """`await fn(*args, **kw)` if the breaker lets it through; BreakerOpen otherwise."""
        if self.state == CLOSED:  # the hot path: one comparison before the call
            try:
                result = await fn(*args, **kw)
            except BackendError:
                self.failed()
                raise
            self.failures = 0
            return result
        if self.probing or self.clock() - self.opened_at < self.probe_interval:
            self.refused += 1
            raise BreakerOpen(f"{self.name}: circuit breaker open, the store was not asked")
        self.state = HALF_OPEN
        self.probing = True
        try:
            if self.before_probe is not None:
                await self.before_probe()
            result = await fn(*args, **kw)
        except BackendError as exc:
            self._open(f"probe failed: {exc}")
            raise
        except BaseException:  # cancelled: no verdict, the next call probes again
            self.probing = False
            self.state = OPEN
            raise
        self.probing = False
        self.state = CLOSED
        self.failures = 0
        log.warning("%s: circuit breaker closed (probe succeeded)", self.name)
        return result

    def failed(self) -> None:
        """A call let through while closed failed (a success just sets `failures` to 0)."""
        if self.state != CLOSED:  # a call from before it opened: the probe decides now
            return
        self.failures += 1
        if self.failures >= self.threshold:
            self._open(f"{self.failures} consecutive failures")

    def _open(self, why: str) -> None:
        if self.state != OPEN:
            self.opened += 1
            log.warning(
                "%s: circuit breaker open (%s); probing every %gs",
                self.name,
                why,
                self.probe_interval,
            )
        self.state = OPEN
        self.probing = False
        self.failures = 0
        self.opened_at = self.clock()


@runtime_checkable
class WithBreakers(Protocol):
    """A store with circuit breakers (BACKEND_BREAKER_FAILURES): /healthcheck?detail shows them."""

    def breakers(self) -> list[Breaker]:
        """One per store instance."""
        ...


def add_breaker_stats(stats: Any, scope: str, breaker: Breaker) -> None:
    """`<scope>breaker_state` (0 closed, 1 half-open, 2 open), `<scope>breaker_opened`
    (times it opened) and `<scope>breaker_refused` (calls answered without the store)."""
    stats.add_gauge(scope + "breaker_state", lambda: breaker.state)
    stats.add_gauge(scope + "breaker_opened", lambda: breaker.opened)
    stats.add_gauge(scope + "breaker_refused", lambda: breaker.refused)
