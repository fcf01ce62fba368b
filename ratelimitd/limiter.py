"""Fixed-window counting for one request: cache keys, backend round, statuses, stats.

This is the reference's base limiter plus its Redis `DoLimit` (`src/limiter`, `src/redis`), written
against the backend contract so every backend shares it: total_hits counted at key generation,
the local over-limit cache consulted first, one backend round for all remaining keys (two with
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), then status and the over/near/within/shadow split of
the reference's `GetResponseDescriptorStatus` (`keys.settle` / `keys.over`, compiled with the
rest of the counter maths, are the one place it is written).

The service hands over one `Check` per descriptor that has a limit; the backend gets `Op`s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from . import keys
from .backends.base import FIXED_WINDOW, Backend, Op, SyncBackend
from .keys import METER_TTL_SECONDS, meter_key
from .localcache import LocalCache
from .messages import OK, Descriptor, Status

__all__ = ["NO_LIMIT", "Check", "Limiter", "Meter"]

# The status of a descriptor with no limit; shared, never mutated.
NO_LIMIT = Status(OK)


class Check(msgspec.Struct, gc=False):
    """One descriptor of the request that has a limit: what the limiter counts and decides."""

    index: int  # the descriptor's position in the request
    rule: Any  # config.Rule: the limit
    stats: Any  # stats.RuleStats: where its counters go
    share: tuple[str, ...] | None  # share_threshold patterns replacing values in the key
    hits: int
    # is_negative_hits: `hits` are refunded (the counters decremented), not consumed.
    refund: bool = False


class Meter(msgspec.Struct, gc=False):
    """One metered descriptor (`meter: true`): its hits go into its day bucket."""

    index: int
    hits: int


class _Pending(msgspec.Struct, gc=False):
    """One backend op of a check: its cache key and the limit it counts.

    A reference check has one; an extended one (`Rule.extended`) one per limit, in a row,
    the first carrying how many (`n`) and the others 0.
    """

    check: Check
    key: str
    limit: Any  # config.Rule: the check's rule, or one of its `limits`
    n: int = 1


class Limiter:
    """Counts hits against limits in a backend.

    The backend is fixed when the limiter is built: a `SyncBackend` without
    STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT makes the limiter `synchronous`, and the service
    then calls `do_limit_now` (no coroutine on the hot path) instead of `do_limit`.
    `impl` names the `keys` implementation ("compiled", "pure"; None: the selected one).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        near_limit_ratio: float = 0.8,
        cache_key_prefix: str = "",
        local_cache: LocalCache | None = None,
        stop_increment_when_over_limit: bool = False,
        clock: Callable[[], float] = time.time,
        impl: str | None = None,
    ) -> None:
        self._backend = backend
        self.stop_increment = stop_increment_when_over_limit
        self.near_limit_ratio = near_limit_ratio
        self.prefix = cache_key_prefix
        self.local_cache = local_cache
        self.clock = clock
        k = keys.implementation(impl)
        self._keys = k
        self._cache_key: Callable[..., str] = k.cache_key
        # (rule, stats, hits, counter after, near ratio, now) -> Status, and its over branch.
        self._settle: Callable[[Any, Any, int, int, float, int], Status] = k.settle
        self._over: Callable[[Any, Any, int, int], Status] = k.over
        # Chosen once: checking before incrementing needs the async GET round. The sync
        # backend's methods are bound here, once, for the hot path.
        self._increment_now: Callable[[list[Op], int], list[int]] | None = None
        self._increment_one: Callable[[str, int, int, int], int] | None = None
        self._decide_now: Callable[..., tuple[int, int]] | None = None
        if isinstance(backend, SyncBackend) and not self.stop_increment:
            self._increment_now = backend.increment_now
            self._increment_one = backend.increment_one
            self._decide_now = backend.decide_now
        self._state_key: Callable[..., str] = k.state_key
        self._verdict: Callable[..., Status] = k.verdict
        self.synchronous = self._increment_one is not None

    @property
    def backend(self) -> Backend:
        """The counter store (fixed at construction: the fast path was chosen for it)."""
        return self._backend

    async def do_limit(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        checks: list[Check],
        meters: Sequence[Meter] = (),
    ) -> list[Status]:
        """One Status per descriptor.

        `checks` holds one Check per descriptor that has a limit, in descriptor order;
        every other descriptor gets `{OK, no limit}`. The day buckets of `meters` are
        incremented in the same backend round (see `keys.meter_key`).
        """
        t = self.clock()
        now = int(t)
        statuses, pending, ops, any_cached = self._prepare(domain, descriptors, checks, t)
        if ops and self.stop_increment:
            ops = await self._selective_ops(ops, pending, any_cached)
        if meters:
            ops += self._meter_ops(domain, descriptors, meters, now)
        if ops:
            increment_now = self._increment_now
            if increment_now is not None:
                counters = increment_now(ops, now)
            else:
                counters = await self._backend.increment(ops)
            self._finish(statuses, pending, counters, t)
        return statuses

    def do_limit_now(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        checks: list[Check],
        meters: Sequence[Meter] = (),
    ) -> list[Status]:
        """`do_limit` for a synchronous backend: no coroutine on the hot path.

        Without a local cache each descriptor can be counted and decided in turn: a
        counter's value after INCRBY is the same whether the request's increments are sent
        as one batch or one by one, so the statuses and stats are those of `do_limit`.
        (With a local cache they are not: a key that goes over would answer a repeated
        descriptor of the same request from the cache, so that case takes the batch path.)
        """
        t = self.clock()
        now = int(t)
        increment_now, increment = self._increment_now, self._increment_one
        assert increment_now is not None and increment is not None  # `synchronous` said so
        if self.local_cache is not None:
            batch, pending, ops, _ = self._prepare(domain, descriptors, checks, t)
            if meters:
                ops += self._meter_ops(domain, descriptors, meters, now)
            if ops:
                self._finish(batch, pending, increment_now(ops, now), t)
            return batch
        if meters:
            for op in self._meter_ops(domain, descriptors, meters, now):
                increment(op.key, op.hits, op.seconds, now)
        cache_key = self._cache_key
        settle = self._settle
        prefix = self.prefix
        ratio = self.near_limit_ratio
        statuses: list[Status] = [NO_LIMIT] * len(descriptors)
        for check in checks:
            if check.refund:
                entries = descriptors[check.index].entries
                limits, ops = self._refund_ops(domain, entries, check, t)
                statuses[check.index] = _refunded(limits, increment_now(ops, now), now)
                continue
            rule = check.rule
            if rule.extended:  # an algorithm, a multiplier or several limits
                entries = descriptors[check.index].entries
                h = check.hits
                check.stats.total_hits += h
                if rule.limits is None and rule.algorithm:  # one store-decided limit
                    tick = rule.tick
                    after, ticks = self._decide_now(  # type: ignore[misc]
                        self._state_key(prefix, domain, entries, check.share, rule.key_suffix),
                        rule.algorithm,
                        h,
                        rule.window_ticks,
                        rule.requests_per_unit,
                        tick,
                        int(t * 1000) // tick,
                        now,
                    )
                    statuses[check.index] = self._verdict(
                        rule, check.stats, h, after, ratio, -(-ticks * tick // 1000)
                    )
                    continue
                limits, ops = self._limit_ops(domain, entries, check, t)
                statuses[check.index] = self._decide(check, limits, increment_now(ops, now), t)
                continue
            st = check.stats
            i = check.index
            h = check.hits
            seconds = rule.unit_seconds
            st.total_hits += h
            after = increment(
                cache_key(prefix, domain, descriptors[i].entries, check.share, seconds, now),
                h,
                seconds,
                now,
            )
            statuses[i] = settle(rule, st, h, after, ratio, now)
        return statuses

    def _meter_ops(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        meters: Sequence[Meter],
        now: int,
    ) -> list[Op]:
        prefix = self.prefix
        ops = []
        for m in meters:
            key = meter_key(prefix, domain, descriptors[m.index].entries, now)
            ops.append(Op(key, m.hits, METER_TTL_SECONDS))
        return ops

    def _prepare(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        checks: list[Check],
        t: float,
    ) -> tuple[list[Status], list[_Pending], list[Op], bool]:
        """Cache keys, total_hits and the local cache: what is left for the backend."""
        cache_key = self._cache_key
        over = self._over
        prefix = self.prefix
        local = self.local_cache
        now = int(t)
        statuses: list[Status] = [NO_LIMIT] * len(descriptors)
        pending: list[_Pending] = []
        ops: list[Op] = []
        any_cached = False
        for check in checks:
            rule = check.rule
            h = check.hits
            seconds = rule.unit_seconds
            entries = descriptors[check.index].entries
            if check.refund:  # never answered from the local cache: it clears it
                limits, refund_ops = self._refund_ops(domain, entries, check, t)
                n = len(limits)
                for limit, op in zip(limits, refund_ops, strict=True):
                    pending.append(_Pending(check, op.key, limit, n))
                    n = 0
                ops += refund_ops
                continue
            st = check.stats
            st.total_hits += h
            if rule.extended:
                if rule.limits is None and rule.algorithm:  # one store-decided limit
                    key = self._state_key(prefix, domain, entries, check.share, rule.key_suffix)
                    if local is not None and local.contains(key, now):
                        any_cached = True
                        st.over_limit_with_local_cache += h
                        statuses[check.index] = self._keys.refuse(
                            rule, st, h, max(1, local.expiry(key) - now)
                        )
                        continue
                    tick = rule.tick
                    pending.append(_Pending(check, key, rule))
                    ops.append(
                        Op(
                            key,
                            h,
                            seconds,
                            rule.unit == 1,
                            rule.algorithm,
                            rule.requests_per_unit,
                            tick,
                            int(t * 1000) // tick,
                        )
                    )
                    continue
                limits, limit_ops = self._limit_ops(domain, entries, check, t)
                cached = self._cached(check, limits, limit_ops, now)
                if cached is not None:
                    any_cached = True
                    statuses[check.index] = cached
                    continue
                n = len(limits)
                for limit, op in zip(limits, limit_ops, strict=True):
                    pending.append(_Pending(check, op.key, limit, n))
                    n = 0
                ops += limit_ops
                continue
            key = cache_key(prefix, domain, entries, check.share, seconds, now)
            if local is not None and local.contains(key, now):
                # Known over limit: answered without touching the backend.
                any_cached = True
                st.over_limit_with_local_cache += h
                statuses[check.index] = over(rule, st, h, now)
                continue
            pending.append(_Pending(check, key, rule))
            ops.append(Op(key, h, seconds))
        return statuses, pending, ops, any_cached

    def _finish(
        self,
        statuses: list[Status],
        pending: list[_Pending],
        counters: Sequence[Any],
        t: float,
    ) -> None:
        """Statuses and stats from the counters after; over-limit keys go to the local cache."""
        local = self.local_cache
        settle = self._settle
        ratio = self.near_limit_ratio
        now = int(t)
        for j, p in enumerate(pending):
            check = p.check
            if check.refund:
                if p.n:  # the first op of its check
                    limits = [q.limit for q in pending[j : j + p.n]]
                    statuses[check.index] = _refunded(limits, counters[j : j + p.n], now)
                continue
            rule = check.rule
            if rule.extended:
                if rule.limits is None and rule.algorithm:  # one store-decided limit
                    self._decided(statuses, p, counters[j], t)
                    continue
                if p.n:  # the first op of its check: decide on all of them
                    statuses[check.index] = self._decide(
                        check,
                        [q.limit for q in pending[j : j + p.n]],
                        counters[j : j + p.n],
                        t,
                        [q.key for q in pending[j : j + p.n]],
                    )
                continue
            after = counters[j]
            statuses[check.index] = settle(rule, check.stats, check.hits, after, ratio, now)
            if local is not None and after > rule.requests_per_unit:
                # Over until its window ends.
                seconds = rule.unit_seconds
                local.add(p.key, now + seconds - now % seconds)

    async def _selective_ops(
        self, ops: list[Op], pending: list[_Pending], any_cached: bool
    ) -> list[Op]:
        """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: increment only would-exceed keys.

        A local-cache hit means the request is over already: nothing is incremented.
        Otherwise one GET round decides: if some key would exceed (GET + hits > limit)
        only those keys get their hits, else everything is incremented as usual.
        Non-incremented keys still get INCRBY 0 so their TTL is refreshed. Refunds are
        neither checked nor held back.
        """
        if any_cached:
            return [op if op.refund else _without_hits(op) for op in ops]
        # Refunds skip the check and always count, as the reference's negative hits.
        asked = [op for op in ops if not op.refund]
        if not asked:
            return ops
        values = iter(await self._backend.get(asked))
        exceed = [
            not op.refund and next(values) + p.check.hits > p.limit.requests_per_unit
            for op, p in zip(ops, pending, strict=True)
        ]
        if not any(exceed):
            return ops
        return [op if exceed[j] or op.refund else _without_hits(op) for j, op in enumerate(ops)]

    def _refund_ops(
        self, domain: str, entries: Sequence[tuple[str, str]], check: Check, t: float
    ) -> tuple[Sequence[Any], list[Op]]:
        """A refund's ops: one per (fixed-window) limit, each decrementing its counter.

        Counts `total_negative_hits`, and drops the keys from this process's local
        over-limit cache: the counter may be under its limit again (the reference leaves
        the cache answering OVER_LIMIT until the window ends, its open issue #1230).
        """
        rule = check.rule
        h = check.hits
        check.stats.total_negative_hits += h
        if rule.extended:  # the service lets only fixed windows through
            limits, counted = self._limit_ops(domain, entries, check, t)
            ops = [Op(op.key, h, op.seconds, op.per_second, refund=True) for op in counted]
        else:
            seconds = rule.unit_seconds
            key = self._cache_key(self.prefix, domain, entries, check.share, seconds, int(t))
            limits, ops = (rule,), [Op(key, h, seconds, refund=True)]
        local = self.local_cache
        if local is not None:
            for op in ops:
                local.discard(op.key)
        return limits, ops

    def keys_for(
        self,
        domain: str,
        entries: Sequence[tuple[str, str]],
        rule: Any,
        share: tuple[str, ...] | None,
        hits: int,
        t: float,
    ) -> list[tuple[Any, Op]]:
        """Each limit of `rule` with the op a decision at `t` would send, counting nothing
        (no stats, no store): what the admin endpoints show, read and reset."""
        if rule.extended and rule.limits is None and rule.algorithm:
            tick = rule.tick
            key = self._state_key(self.prefix, domain, entries, share, rule.key_suffix)
            op = Op(
                key,
                hits,
                rule.unit_seconds,
                rule.unit == 1,
                rule.algorithm,
                rule.requests_per_unit,
                tick,
                int(t * 1000) // tick,
            )
            return [(rule, op)]
        if rule.extended:
            limits, ops = self._limit_ops(domain, entries, Check(0, rule, None, share, hits), t)
            return list(zip(limits, ops, strict=True))
        seconds = rule.unit_seconds
        key = self._cache_key(self.prefix, domain, entries, share, seconds, int(t))
        return [(rule, Op(key, hits, seconds))]

    # -- the extension: algorithms, N-unit windows, several limits (README, "Algorithms") --

    def _limit_ops(
        self, domain: str, entries: Sequence[tuple[str, str]], check: Check, t: float
    ) -> tuple[Sequence[Any], list[Op]]:
        """One op per limit of an extended check (one for a single extended rule)."""
        rule = check.rule
        limits = rule.limits or (rule,)
        share = check.share
        prefix = self.prefix
        h = check.hits
        now = int(t)
        now_ms = int(t * 1000)
        state = None
        ops = []
        for limit in limits:
            seconds = limit.unit_seconds
            per_second = limit.unit == 1
            if limit.algorithm == FIXED_WINDOW:
                key = self._cache_key(prefix, domain, entries, share, seconds, now)
                ops.append(Op(key + limit.key_suffix, h, seconds, per_second))
                continue
            if state is None:
                state = self._state_key(prefix, domain, entries, share)
            tick = limit.tick
            ops.append(
                Op(
                    state + limit.key_suffix,
                    h,
                    seconds,
                    per_second,
                    limit.algorithm,
                    limit.requests_per_unit,
                    tick,
                    now_ms // tick,
                )
            )
        return limits, ops

    def _decided(self, statuses: list[Status], p: _Pending, result: Any, t: float) -> None:
        """`_decide` for a single sliding-window or token-bucket limit (no lists)."""
        check = p.check
        rule = check.rule
        after, ticks = result
        reset_ms = ticks * rule.tick
        statuses[check.index] = self._verdict(
            rule, check.stats, check.hits, after, self.near_limit_ratio, -(-reset_ms // 1000)
        )
        local = self.local_cache
        if local is not None and after > rule.requests_per_unit:
            until = (int(t * 1000) + reset_ms) // 1000  # never beyond the true wait
            if until > int(t):
                local.add(p.key, until)

    def _cached(
        self, check: Check, limits: Sequence[Any], ops: list[Op], now: int
    ) -> Status | None:
        """The local cache's answer for an extended check: over if any limit is known over."""
        local = self.local_cache
        if local is None:
            return None
        for limit, op in zip(limits, ops, strict=True):
            if local.contains(op.key, now):
                st = check.stats
                st.over_limit_with_local_cache += check.hits
                reset = max(1, local.expiry(op.key) - now)
                return self._keys.refuse(limit, st, check.hits, reset)  # type: ignore[no-any-return]
        return None

    def _decide(
        self,
        check: Check,
        limits: Sequence[Any],
        results: Sequence[Any],
        t: float,
        keys_: Sequence[str] | None = None,
    ) -> Status:
        """The status of an extended check from its limits' results, stats counted once.

        The deciding limit: an over-limit one, the one over the longest if several (the
        first listed on a tie); otherwise the one with the least remaining.
        """
        now = int(t)
        best = None
        best_after = best_reset = 0
        best_over = False
        local = self.local_cache
        for j, limit in enumerate(limits):
            result = results[j]
            rpu = limit.requests_per_unit
            if limit.algorithm == FIXED_WINDOW:
                after = result
                seconds = limit.unit_seconds
                reset = seconds - now % seconds
                until = now + reset
            else:
                after, ticks = result
                reset_ms = ticks * limit.tick
                reset = -(-reset_ms // 1000)
                until = (int(t * 1000) + reset_ms) // 1000  # never beyond the true wait
            over = after > rpu
            if over and local is not None and keys_ is not None and until > now:
                local.add(keys_[j], until)
            if best is None:
                take = True
            elif over:
                take = not best_over or reset > best_reset
            else:
                take = not best_over and rpu - after < best.requests_per_unit - best_after
            if take:
                best, best_after, best_reset, best_over = limit, after, reset, over
        return self._keys.verdict(  # type: ignore[no-any-return]
            best, check.stats, check.hits, best_after, self.near_limit_ratio, best_reset
        )


def _refunded(limits: Sequence[Any], counters: Sequence[int], now: int) -> Status:
    """A refund's status: always OK, with the remaining of the most constrained limit
    (`max(0, limit - counter after)`); no over/near/within stats, no local cache."""
    best = limits[0]
    remaining = max(0, best.requests_per_unit - counters[0])
    for limit, after in zip(limits[1:], counters[1:], strict=True):
        left = max(0, limit.requests_per_unit - after)
        if left < remaining:
            best, remaining = limit, left
    seconds = best.unit_seconds
    return Status(OK, best, remaining, seconds - now % seconds)


def _without_hits(op: Op) -> Op:
    """The op checking without counting (INCRBY 0 keeps the reference's TTL refresh)."""
    return Op(op.key, 0, op.seconds, op.per_second, op.algorithm, op.limit, op.tick, op.now)
