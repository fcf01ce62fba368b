"""`/explain` is the service's own dry run, on a real Redis: for random configs, settings and
requests, what it predicts (its states read with GET / HMGET and counted on a scratch
store, with the scripts' maths) is what the service then decides through the scripts, and
it writes nothing (support.decisions; tests/core/test_explain.py is the same on memory)."""

from __future__ import annotations

import asyncio
import itertools
import time

import uvloop
from hypothesis import HealthCheck, given, settings
from support.clock import Clock
from support.core import Decider
from support.decisions import explain_then_decide, modes, scenarios
from support.redis_server import RedisServer, RedisServers

from ratelimitd.backends import load_settings
from ratelimitd.core import build_core

# Each example counts under its own CACHE_KEY_PREFIX on the module's one server.
_examples = itertools.count()


def decider(server: RedisServer, mode: dict, config: str, clock: Clock) -> Decider:
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": server.address,
        "REDIS_POOL_SIZE": "1",
        "REDIS_REQUEST_TIMEOUT": "2s",
        "EXPIRATION_JITTER_MAX_SECONDS": "0",
        "CACHE_KEY_PREFIX": f"x{next(_examples)}:",
        "SHADOW_MODE": str(mode["shadow"]).lower(),
        "QUOTA_MODE": str(mode["quota"]).lower(),
        "LOCAL_CACHE_SIZE_IN_BYTES": "1048576" if mode["local_cache"] else "0",
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": str(mode["stop_increment"]).lower(),
    }
    d = Decider(build_core(load_settings(env), clock=clock), clock)
    d.load(config)
    return d


def test_explain_predicts_the_decision(module_servers: RedisServers) -> None:
    server = module_servers()

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(scenarios(), modes)
    def check(scenario: tuple, mode: dict) -> None:
        config, steps = scenario
        # The limiter's clock (keys, windows, the scripts' time) follows real time, so that
        # the fixed windows' TTLs, which Redis counts, agree with it.
        clock = Clock(time.time())

        async def run() -> None:
            d = decider(server, mode, config, clock)
            await d.backend.connect()
            try:
                for pause, request in steps:
                    clock.advance(pause)
                    await explain_then_decide(d.service, d.stats, request)
            finally:
                await d.backend.close()

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run())

    check()
