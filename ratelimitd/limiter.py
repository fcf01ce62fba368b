"""Fixed-window counting for one request: cache keys, backend round, statuses, stats.

This is the reference's base limiter plus its Redis `DoLimit` (sections 7 and 8.1/8.3),
written against the backend protocol so every backend shares it: total_hits counted at
key generation, the local over-limit cache consulted first, one backend round for all
remaining keys (two with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), then status and the
over/near/within/shadow split of section 7.3.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .backends.base import Backend
from .keys import cache_key, evaluate, near_threshold
from .localcache import LocalCache
from .messages import OK, OVER_LIMIT, Descriptor, Status

# Metered usage (the `meter: true` config extension) is kept per UTC day for 35 days, so
# a billing cycle or a rolling 30-day window can always be summed from it.
METER_TTL_SECONDS = 35 * 86400


def meter_key(prefix: str, domain: str, entries: Sequence[tuple[str, str]], now: int) -> str:
    """`<prefix>meter_<domain>_<k>_<v>[_<k>_<v>..]_<UTC day start>`: one day's usage bucket."""
    return cache_key(prefix + "meter_", domain, entries, None, 86400, now)


# The status of a descriptor with no limit; shared, never mutated.
NO_LIMIT = Status(OK)


class Limiter:
    """Counts hits against limits in a backend."""

    def __init__(
        self,
        backend: Backend,
        *,
        near_limit_ratio: float = 0.8,
        cache_key_prefix: str = "",
        local_cache: LocalCache | None = None,
        stop_increment_when_over_limit: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stop_increment = stop_increment_when_over_limit
        self.backend = backend
        self.near_limit_ratio = near_limit_ratio
        self.prefix = cache_key_prefix
        self.local_cache = local_cache
        self.clock = clock

    @property
    def backend(self) -> Backend:
        """The counter store."""
        return self._backend

    @backend.setter
    def backend(self, backend: Backend) -> None:
        self._backend = backend
        # A synchronous backend (memory) is called directly, without a coroutine:
        # `synchronous` tells the service that `do_limit_now` can decide without awaiting.
        self._increment_now: Callable[[list[tuple[str, int, int]], int], list[int]] | None = (
            getattr(backend, "increment_now", None)
        )
        self._increment_one: Callable[[str, int, int, int], int] | None = getattr(
            backend, "increment_one", None
        )
        self.synchronous = self._increment_now is not None and not self.stop_increment

    async def do_limit(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        checks: list[tuple[int, Any, Any, tuple[str, ...] | None, int]],
        meters: Sequence[tuple[int, int]] = (),
    ) -> list[Status]:
        """One Status per descriptor.

        `checks` holds one (index, rule, stats, share, hits) per descriptor that has a
        limit, in descriptor order; every other descriptor gets `{OK, no limit}`.
        `meters` holds (index, hits) per metered descriptor: their day buckets are
        incremented in the same backend round (see `meter_key`).
        """
        now = int(self.clock())
        statuses, pending, ops, any_cached = self._prepare(domain, descriptors, checks, now)
        if ops and self.stop_increment:
            ops = await self._selective_ops(ops, pending, any_cached)
        if meters:
            ops += self._meter_ops(domain, descriptors, meters, now)
        if ops:
            if self._increment_now is not None:
                counters = self._increment_now(ops, now)
            else:
                counters = await self.backend.increment(ops)
            self._finish(statuses, pending, counters, now)
        return statuses

    def _meter_ops(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        meters: Sequence[tuple[int, int]],
        now: int,
    ) -> list[tuple[str, int, int]]:
        return [
            (meter_key(self.prefix, domain, descriptors[i].entries, now), h, METER_TTL_SECONDS)
            for i, h in meters
        ]

    def do_limit_now(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        checks: list[tuple[int, Any, Any, tuple[str, ...] | None, int]],
        meters: Sequence[tuple[int, int]] = (),
    ) -> list[Status]:
        """`do_limit` for a synchronous backend: no coroutine on the hot path.

        Without a local cache each descriptor can be counted and decided in turn: a
        counter's value after INCRBY is the same whether the request's increments are sent
        as one batch or one by one, so the statuses and stats are those of `do_limit`.
        (With a local cache they are not: a key that goes over would answer a repeated
        descriptor of the same request from the cache, so that case takes the batch path.)
        """
        now = int(self.clock())
        increment_now, increment = self._increment_now, self._increment_one
        assert increment_now is not None and increment is not None  # `synchronous` said so
        if self.local_cache is not None:
            batch, pending, ops, _ = self._prepare(domain, descriptors, checks, now)
            if meters:
                ops += self._meter_ops(domain, descriptors, meters, now)
            if ops:
                self._finish(batch, pending, increment_now(ops, now), now)
            return batch
        for key, h, seconds in self._meter_ops(domain, descriptors, meters, now) if meters else ():
            increment(key, h, seconds, now)
        prefix = self.prefix
        ratio = self.near_limit_ratio
        statuses: list[Status] = [NO_LIMIT] * len(descriptors)
        for i, rule, st, share, h in checks:
            seconds = rule.unit_seconds
            limit = rule.requests_per_unit
            st.total_hits += h
            after = increment(
                cache_key(prefix, domain, descriptors[i].entries, share, seconds, now),
                h,
                seconds,
                now,
            )
            over, remaining, over_add, near_add, within_add = evaluate(
                limit, h, after, near_threshold(limit, ratio)
            )
            if near_add:
                st.near_limit += near_add
            if over:
                st.over_limit += over_add
                code = OVER_LIMIT
                if rule.shadow_mode:
                    st.shadow_mode += over_add
                    code = OK
                statuses[i] = Status(code, rule, 0, seconds - now % seconds)
            else:
                st.within_limit += within_add
                statuses[i] = Status(OK, rule, remaining, seconds - now % seconds)
        return statuses

    def _prepare(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        checks: list[tuple[int, Any, Any, tuple[str, ...] | None, int]],
        now: int,
    ) -> tuple[
        list[Status], list[tuple[int, Any, Any, int, str]], list[tuple[str, int, int]], bool
    ]:
        """Cache keys, total_hits and the local cache: what is left for the backend."""
        prefix = self.prefix
        local = self.local_cache
        statuses: list[Status] = [NO_LIMIT] * len(descriptors)
        pending: list[tuple[int, Any, Any, int, str]] = []
        ops: list[tuple[str, int, int]] = []
        any_cached = False
        for i, rule, st, share, h in checks:
            seconds = rule.unit_seconds
            key = cache_key(prefix, domain, descriptors[i].entries, share, seconds, now)
            st.total_hits += h
            if local is not None and local.contains(key, now):
                # Known over limit: answered without touching the backend.
                any_cached = True
                st.over_limit += h
                st.over_limit_with_local_cache += h
                code = OVER_LIMIT
                if rule.shadow_mode:
                    st.shadow_mode += h
                    code = OK
                statuses[i] = Status(code, rule, 0, seconds - now % seconds)
                continue
            pending.append((i, rule, st, h, key))
            ops.append((key, h, seconds))
        return statuses, pending, ops, any_cached

    def _finish(
        self,
        statuses: list[Status],
        pending: list[tuple[int, Any, Any, int, str]],
        counters: Sequence[int],
        now: int,
    ) -> None:
        """Statuses and the over/near/within/shadow split from the counters after."""
        local = self.local_cache
        ratio = self.near_limit_ratio
        for j, (i, rule, st, h, key) in enumerate(pending):
            limit = rule.requests_per_unit
            over, remaining, over_add, near_add, within_add = evaluate(
                limit, h, counters[j], near_threshold(limit, ratio)
            )
            seconds = rule.unit_seconds
            reset = seconds - now % seconds
            if near_add:
                st.near_limit += near_add
            if over:
                st.over_limit += over_add
                if local is not None:
                    local.add(key, now + reset)
                code = OVER_LIMIT
                if rule.shadow_mode:
                    # The rule is only observed: its status passes, the stats still count.
                    st.shadow_mode += over_add
                    code = OK
                statuses[i] = Status(code, rule, 0, reset)
            else:
                st.within_limit += within_add
                statuses[i] = Status(OK, rule, remaining, reset)

    async def _selective_ops(
        self,
        ops: list[tuple[str, int, int]],
        pending: list[tuple[int, Any, Any, int, str]],
        any_cached: bool,
    ) -> list[tuple[str, int, int]]:
        """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: increment only would-exceed keys.

        A local-cache hit means the request is over already: nothing is incremented.
        Otherwise one GET round decides: if some key would exceed (GET + hits > limit)
        only those keys get their hits, else everything is incremented as usual.
        Non-incremented keys still get INCRBY 0 so their TTL is refreshed.
        """
        if any_cached:
            return [(key, 0, seconds) for key, _hits, seconds in ops]
        current = await self.backend.get([(key, seconds) for key, _hits, seconds in ops])
        exceed = [
            current[j] + h > rule.requests_per_unit
            for j, (_i, rule, _st, h, _key) in enumerate(pending)
        ]
        if not any(exceed):
            return ops
        return [(key, h if exceed[j] else 0, seconds) for j, (key, h, seconds) in enumerate(ops)]
