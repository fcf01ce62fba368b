"""The count step of a decision: a plan's windows against the counter store, one round.

This is the reference's base limiter plus its Redis `DoLimit` (`src/limiter`, `src/redis`),
written against the backend contract so every backend shares it: `decision.collect` makes
the store operations of every window of the plan (counting total_hits, answering from the
local over-limit cache), the store runs them in one round (two with
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), and `decision.settle` reads the results into
statuses (the verdict). `peek` is the same count with the store's read-only `peek`: what
`/explain` shows is what `count` would decide.

The limiter is synchronous (`count_now`, no coroutine on the hot path) when its backend is a
`SyncBackend` and nothing needs a second round; otherwise the service awaits `count`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any

from . import decision
from .backends.base import Backend, Op, SyncBackend
from .config import ConfigError, RuleSet, keys
from .config.budget_store import budget_keys
from .localcache import LocalCache
from .messages import Status

__all__ = ["Limiter"]


@dataclass(eq=False)
class Limiter:
    """Counts plans against a backend fixed at construction (the fast path is chosen for it).

    `impl` names the implementation of the compiled modules (`keys`, `decision`):
    "compiled", "pure", or None for the selected one.
    """

    _backend: Backend
    _: KW_ONLY
    near_limit_ratio: float = 0.8
    prefix: str = ""  # CACHE_KEY_PREFIX
    local_cache: LocalCache | None = None
    stop_increment: bool = False  # STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
    clock: Callable[[], float] = time.time
    impl: InitVar[str | None] = None

    def __post_init__(self, impl: str | None) -> None:
        self.keys = keys.implementation(impl)
        self.decision = decision.implementation(impl)
        # Chosen once: checking before incrementing needs the async GET round. The
        # synchronous store's method, bound once for the hot path (None: await `count`).
        self.increment_now: Callable[[list[Op], int], list[Any]] | None = None
        if isinstance(self._backend, SyncBackend) and not self.stop_increment:
            self.increment_now = self._backend.increment_now
        self.synchronous = self.increment_now is not None

    def check(self, ruleset: RuleSet) -> None:
        """Refuse (ConfigError) a config this limiter cannot count: token budgets under a
        CACHE_KEY_PREFIX that opens an empty Redis hash tag (a budget's two keys could then
        land in different Cluster slots)."""
        if ruleset.budgets:
            try:
                budget_keys(self.prefix, "", ())
            except ValueError as exc:
                raise ConfigError("CACHE_KEY_PREFIX", str(exc)) from None

    @property
    def backend(self) -> Backend:
        """The counter store (fixed at construction: the fast path was chosen for it)."""
        return self._backend

    def count_now(self, plan: decision.Plan) -> list[Status]:
        """`count` for a synchronous limiter: no coroutine, no loop round."""
        return self.decision.count_now(  # type: ignore[no-any-return]
            plan, self.clock(), self.prefix, self.local_cache, self.near_limit_ratio, self._backend
        )

    async def count(self, plan: decision.Plan) -> list[Status]:
        """One Status per descriptor of the plan; its meters counted in the same round."""
        d = self.decision
        t = self.clock()
        ops = d.collect(plan, t, self.prefix, self.local_cache)
        plan.t, plan.ops = t, ops  # what failed, should the store fail (budget settles)
        n = len(ops)
        if ops and self.stop_increment:
            ops = await self._selective(ops, plan.cached)
        if plan.meters:
            ops = ops + d.meter_ops(plan, t, self.prefix)
        results: Any = ()
        if ops:
            increment_now = self.increment_now
            if increment_now is not None:
                results = increment_now(ops, int(t))
            else:
                results = await self._backend.increment(ops)
        return d.settle(plan, ops[:n], results, t, self.near_limit_ratio, self.local_cache)  # type: ignore[no-any-return]

    async def peek(self, plan: decision.Plan, t: float) -> tuple[list[Op], list[Any], list[Status]]:
        """`count` at `t` as a dry run: the ops, their results and the statuses `count` would
        give, with the store's `peek` (nothing written) and nothing recorded in the local
        cache. The plan's items should carry throwaway stats."""
        d = self.decision
        ops = d.collect(plan, t, self.prefix, self.local_cache, False)
        if ops and self.stop_increment:
            ops = await self._selective(ops, plan.cached)
        results = await self._backend.peek(ops) if ops else []
        return ops, results, d.settle(plan, ops, results, t, self.near_limit_ratio, None)

    async def _selective(self, ops: list[Op], any_cached: bool) -> list[Op]:
        """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: increment only would-exceed keys.

        A local-cache hit means the request is over already: nothing is incremented.
        Otherwise one GET round decides: if some key would exceed (GET + hits > limit)
        only those keys get their hits, else everything is incremented as usual.
        Non-incremented keys still get INCRBY 0 so their TTL is refreshed. Refunds are
        neither checked nor held back, as the reference's negative hits, nor are budget
        calls (a budget checks before it counts, atomically).
        """
        if any_cached:
            return [op if _kept(op) else _without_hits(op) for op in ops]
        asked = [op for op in ops if not _kept(op)]
        if not asked:
            return ops
        values = iter(await self._backend.get(asked))
        exceed = [not _kept(op) and next(values) + op.hits > op.limit for op in ops]
        if not any(exceed):
            return ops
        return [op if exceed[j] or _kept(op) else _without_hits(op) for j, op in enumerate(ops)]


def _kept(op: Op) -> bool:
    """An op STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT leaves as it is."""
    return op.refund or op.budget is not None


def _without_hits(op: Op) -> Op:
    """The op checking without counting (INCRBY 0 keeps the reference's TTL refresh)."""
    return Op(op.key, 0, op.seconds, op.per_second, op.algorithm, op.limit, op.tick, op.now)
