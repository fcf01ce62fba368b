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
        checks: list[tuple[int, Any, Any, tuple[str, ...] | None, int]],
    ) -> list[Status]:
        """One Status per descriptor.

        `checks` holds one (index, rule, stats, share, hits) per descriptor that has a
        limit, in descriptor order; every other descriptor gets `{OK, no limit}`.
        """
        now = int(self.clock())
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
                statuses[i] = Status(code, rule, 0, reset_seconds(now, seconds))
                continue
            pending.append((i, rule, st, h, key))
            ops.append((key, h, seconds))
        if not ops:
            return statuses

        if self.stop_increment:
            ops = await self._selective_ops(ops, pending, any_cached)
        backend = self.backend
        increment_now = getattr(backend, "increment_now", None)
        # A synchronous backend (memory) is called directly: no coroutine per request.
        counters = increment_now(ops) if increment_now else await backend.increment(ops)

        ratio = self.near_limit_ratio
        for j, (i, rule, st, h, key) in enumerate(pending):
            limit = rule.requests_per_unit
            over, remaining, over_add, near_add, within_add = evaluate(
                limit, h, counters[j], near_threshold(limit, ratio)
            )
            seconds = rule.unit_seconds
            st.near_limit += near_add
            if over:
                st.over_limit += over_add
                if local is not None:
                    local.add(key, now - now % seconds + seconds)
                code = OVER_LIMIT
                if rule.shadow_mode:
                    # The rule is only observed: its status passes, the stats still count.
                    st.shadow_mode += over_add
                    code = OK
                statuses[i] = Status(code, rule, 0, reset_seconds(now, seconds))
            else:
                st.within_limit += within_add
                statuses[i] = Status(OK, rule, remaining, reset_seconds(now, seconds))
        return statuses

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
        return [
            (key, h if exceed[j] else 0, seconds) for j, (key, h, seconds) in enumerate(ops)
        ]
