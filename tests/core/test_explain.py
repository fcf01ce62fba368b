"""`/explain` is the service's own dry run: for random configs, settings and requests on the
memory backend, what it predicts is what the service then decides, and it counts nothing
(support.decisions; tests/redis/test_explain.py is the same on a real Redis). And the decision
model decides alike on the compiled leaves (`match`, `keys`) and on their pure twins."""

from __future__ import annotations

import asyncio

import uvloop
from hypothesis import HealthCheck, given, settings
from support.core import Decider, memory_decider
from support.decisions import decided, explain_then_decide, modes, scenarios

from ratelimitd.messages import ServiceError
from ratelimitd.settings import ReloadOptions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), modes)
def test_explain_predicts_the_decision(scenario: tuple, mode: dict) -> None:
    config, steps = scenario
    h = memory_decider(
        config,
        options=ReloadOptions(shadow_mode=mode["shadow"], quota_mode=mode["quota"]),
        local_cache_bytes=1 << 20 if mode["local_cache"] else 0,
        stop_increment=mode["stop_increment"],
    )

    async def run() -> None:
        for pause, request in steps:
            h.clock.advance(pause)
            await explain_then_decide(h.service, h.stats, request)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), modes)
def test_compiled_and_pure_leaves_decide_alike(scenario: tuple, mode: dict) -> None:
    """The decision model on the compiled leaves and on their twins (`build_core(impl=)`):
    the same responses and the same statistics, request after request."""
    config, steps = scenario
    options = ReloadOptions(shadow_mode=mode["shadow"], quota_mode=mode["quota"])
    cores = [
        memory_decider(
            config,
            options=options,
            local_cache_bytes=1 << 20 if mode["local_cache"] else 0,
            stop_increment=mode["stop_increment"],
            impl=impl,
        )
        for impl in ("compiled", "pure")
    ]

    async def run(h: Decider) -> list:
        out = []
        for pause, request in steps:
            h.clock.advance(pause)
            try:
                out.append(decided(await h.service.should_rate_limit(request)))
            except ServiceError as exc:
                out.append(("refused", str(exc)))
        return out

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        compiled, pure = (runner.run(run(h)) for h in cores)
    assert compiled == pure
    assert cores[0].stats.snapshot() == cores[1].stats.snapshot()
