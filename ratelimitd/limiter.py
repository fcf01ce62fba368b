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
from .keys import cache_key, evaluate, near_threshold, reset_seconds
from .localcache import LocalCache
from .messages import OK, OVER_LIMIT, Descriptor, Status


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
        self.backend = backend
        self.near_limit_ratio = near_limit_ratio
        self.prefix = cache_key_prefix
        self.local_cache = local_cache
        self.stop_increment = stop_increment_when_over_limit
        self.clock = clock

    async def do_limit(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        rules: Sequence[Any],
        stats: Sequence[Any],
        shares: Sequence[tuple[str, ...] | None],
        hits: Sequence[int],
        now: int,
    ) -> list[Status]:
        """One Status per descriptor; `rules[i]` is None where no limit applies."""
        n = len(rules)
        prefix = self.prefix
        local = self.local_cache
        keys: list[str | None] = [None] * n
        cached = [False] * n
        ops: list[tuple[str, int, int]] = []
        index: list[int] = []
        for i in range(n):
            rule = rules[i]
            if rule is None:
                continue
            key = cache_key(prefix, domain, descriptors[i].entries, shares[i], rule.unit_seconds, now)
            keys[i] = key
            stats[i].total_hits += hits[i]
            if local is not None and local.contains(key, now):
                cached[i] = True
            else:
                ops.append((key, hits[i], rule.unit_seconds))
                index.append(i)

        counters: list[int] = []
        if ops:
            if self.stop_increment:
                ops = await self._selective_ops(ops, index, rules, hits, any(cached))
            counters = await self.backend.increment(ops)

        statuses: list[Status] = [None] * n  # type: ignore[list-item]
        j = 0  # next backend result: results follow descriptor order
        for i in range(n):
            rule = rules[i]
            if rule is None:
                statuses[i] = Status(OK)
                continue
            st = stats[i]
            h = hits[i]
            reset = reset_seconds(now, rule.unit_seconds)
            if cached[i]:
                st.over_limit += h
                st.over_limit_with_local_cache += h
                if rule.shadow_mode:
                    st.shadow_mode += h
                    statuses[i] = Status(OK, rule, 0, reset)
                else:
                    statuses[i] = Status(OVER_LIMIT, rule, 0, reset)
                continue
            after = counters[j]
            j += 1
            limit = rule.requests_per_unit
            over, remaining, over_add, near_add, within_add = evaluate(
                limit, h, after, near_threshold(limit, self.near_limit_ratio)
            )
            if over:
                st.over_limit += over_add
                st.near_limit += near_add
                if local is not None:
                    local.add(keys[i], now - now % rule.unit_seconds + rule.unit_seconds)  # type: ignore[arg-type]
                if rule.shadow_mode:
                    st.shadow_mode += over_add
                    statuses[i] = Status(OK, rule, 0, reset)
                else:
                    statuses[i] = Status(OVER_LIMIT, rule, 0, reset)
            else:
                st.within_limit += within_add
                st.near_limit += near_add
                statuses[i] = Status(OK, rule, remaining, reset)
        return statuses

    async def _selective_ops(
        self,
        ops: list[tuple[str, int, int]],
        index: list[int],
        rules: Sequence[Any],
        hits: Sequence[int],
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
            current[j] + hits[i] > rules[i].requests_per_unit for j, i in enumerate(index)
        ]
        if not any(exceed):
            return ops
        return [
            (key, h if exceed[j] else 0, seconds) for j, (key, h, seconds) in enumerate(ops)
        ]
