"""Token budgets for tests and benchmarks: the stores on a real redis-server (single or
cluster) through the backend's own instance and pipeline, and one user's budget driven
through a decision core as Envoy drives it (reserve; settle then close at stream end)."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

from ratelimitd.admin import Admin
from ratelimitd.backends import memory_budget
from ratelimitd.backends.redis import RedisBackend
from ratelimitd.backends.redis.budget import RedisBudgets, _scripted_dry_run
from ratelimitd.messages import Descriptor, Response
from ratelimitd.settings import RedisSettings


async def redis_budgets(
    address: str, *, cluster: bool = False, pool_size: int = 2
) -> tuple[RedisBackend, RedisBudgets]:
    """A connected Redis backend on `address` (host:port, or the nodes of a cluster,
    comma-separated) and budgets on its main instance; close the backend when done."""
    backend = RedisBackend(
        RedisSettings(
            type="cluster" if cluster else "single",
            socket_type="tcp",
            url=address,
            pool_size=pool_size,
            startup_max_elapsed_time=5.0,
            startup_initial_interval=0.05,
            request_timeout=2.0,
        )
    )
    await backend.connect()
    return backend, RedisBudgets(backend.main)


class Scripted:
    """`RedisBudgets` with every budget kept by the script (as one with an outbox is)."""

    def __init__(self, budgets: RedisBudgets) -> None:
        self.instance = budgets.instance
        self.run = budgets.scripted

    async def dry_run(self, calls: Any) -> Any:
        return await _scripted_dry_run(self.instance, calls)


def call(phase: str, txn: str, hits: int, user: str = "ann") -> Descriptor:
    """A budget call's descriptor as the examples' Envoy sends it (phase, user, txn)."""
    return Descriptor((("phase", phase), ("user", user), ("txn", txn)), hits_addend=hits)


class Budget:
    """User `ann`'s budget in domain `llm` (a `user` rule with `budget:`), through a core
    (a support.core.Decider): reserve, the stream end, what it holds, its series."""

    SERIES = "ratelimit.service.rate_limit.llm.user."

    def __init__(self, decider: Any) -> None:
        self.d = decider
        self.admin = Admin(decider.service)

    async def reserve(self, txn: str, estimate: int) -> Response:
        response: Response = await self.d.decide("llm", call("reserve", txn, estimate))
        return response

    async def end(self, txn: str, usage: int | None, status: int = 200) -> Response:
        """The stream end as Envoy sends it: settle then close, or the close alone."""
        close = call("close", txn, status)
        calls = [close] if usage is None else [call("settle", txn, usage), close]
        response: Response = await self.d.decide("llm", *calls)
        return response

    async def held(self) -> tuple[int, int]:
        """(used, reserved) of the hour, as /counters shows them."""
        shown = await self.admin.counter("llm", [("user", "ann")])
        (window,) = shown["windows"]
        return window["value"], window["reserved"]

    def series(self) -> dict[str, float]:
        """The rule's series by their last name (total_hits, budget_reserved, ...)."""
        n = len(self.SERIES)
        return {k[n:]: v for k, v in self.d.stats.snapshot().items() if k.startswith(self.SERIES)}


def uncompiled_memory() -> ModuleType:
    """The budget maths' source (`ratelimitd.backends.memory_budget`, compiled in a normal install)
    run by the interpreter, as it runs where the extension is not built."""
    source = memory_budget.__file__.rsplit("/", 1)[0] + "/memory_budget.py"
    spec = importlib.util.spec_from_file_location("ratelimitd.backends._budget_source", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
