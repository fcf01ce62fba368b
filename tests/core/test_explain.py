"""`/explain` is the service's own dry run: for random configs, settings and requests on the
memory backend, what it predicts is what the service then decides, and it counts nothing
(support.decisions; tests/redis/test_explain.py is the same on a real Redis)."""

from __future__ import annotations

import asyncio

import uvloop
from hypothesis import HealthCheck, given, settings
from support.core import memory_decider
from support.decisions import explain_then_decide, modes, scenarios

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
