"""The extension's algorithms in the real daemon, on real time: 200 concurrent gRPC callers on
one key over three 1-second windows, on the memory backend and on Redis with 2 workers
sharing it. The exact per-window counts on a controlled clock are in
tests/redis/test_algorithms.py; here the bounds are the same ones, measured against the
wall clock (the daemon's), with the slack of one request for where the test's clock reads.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.daemon import write_config

from ratelimitd.messages import OK
from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.protocodec import decode_response, encode_request

pytestmark = pytest.mark.slow

LIMIT = 20
WINDOWS = 3
CALLERS = 200
CONFIG = f"""
domain: api
descriptors:
  - key: fixed
    rate_limit: {{unit: second, requests_per_unit: {LIMIT}}}
  - key: sliding
    rate_limit: {{unit: second, requests_per_unit: {LIMIT}, algorithm: sliding_window}}
  - key: bucket
    rate_limit: {{unit: second, requests_per_unit: {LIMIT}, algorithm: token_bucket}}
"""


async def hammer(target: str, key: str, value: str) -> tuple[int, int, float, float, float]:
    """200 callers from just after a second boundary to 3/4 into the third window.

    Returns (admitted, admitted with the reply back before the third window ended, first
    send, last send, last reply) in wall-clock seconds. On a loaded machine a call sent
    before `stop` may be decided after the third window ended: it counts in the first
    figure only. Demand lasted until the last send (a call is never decided before it is
    sent); decisions, until the last reply at the latest (a reply can come back late: 200
    callers share the test's loop).
    """
    now = time.time()
    start = math.floor(now) + 1 + 0.02
    await asyncio.sleep(start - now)
    end = math.floor(start) + WINDOWS
    stop = end - 0.25
    request = encode_request("api", [[(key, value)]], 0)
    admitted = admitted_by_end = 0
    last = replied = start
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD_PATH)

        async def caller() -> None:
            nonlocal admitted, admitted_by_end, last, replied
            while (sent := time.time()) < stop:
                response = decode_response(await call(request, timeout=10))
                ok = response.statuses[0].code == OK
                now = time.time()
                admitted += ok
                admitted_by_end += ok and now < end
                last, replied = max(last, sent), max(replied, now)

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return admitted, admitted_by_end, start, last, replied


@pytest.fixture(params=["memory", "redis-2-workers"])
def daemon(
    request: pytest.FixtureRequest, daemon_env: dict[str, str], start_daemon: Any, redis_server: Any
) -> Any:
    env = dict(daemon_env, BACKEND_TYPE="memory")
    if request.param != "memory":
        env.update(
            BACKEND_TYPE="redis",
            REDIS_SOCKET_TYPE="tcp",
            REDIS_URL=redis_server.address,
            RATELIMITD_WORKERS="2",
            # These tests count exactly; a reply may take longer than the 50 ms default on a
            # loaded 2-core machine, and a timed-out call would be an error, not a decision.
            REDIS_REQUEST_TIMEOUT="2s",
        )
    write_config(env, "algorithms.yaml", CONFIG)
    d = start_daemon(env)
    if request.param != "memory":
        assert len(d.worker_pids()) == 2
    return d


@pytest.mark.parametrize("key", ["fixed", "sliding", "bucket"])
async def test_200_callers_on_the_daemon(daemon: Any, key: str, tmp_path: Path) -> None:
    admitted, admitted_by_end, start, last, replied = await hammer(
        daemon.grpc_target, key, tmp_path.name
    )
    if key == "fixed":  # the limit in each of the three windows, whole or not
        assert admitted_by_end <= WINDOWS * LIMIT <= admitted
    elif key == "sliding":
        # At most the limit per window; under continuous demand the first (fresh) window
        # admits 20, the second 19 (the last slot opens at the boundary), the third by
        # 0.75 s 20 - ceil(19 x 0.25) = 15: 54, give or take where the test's clock reads.
        assert admitted >= WINDOWS * LIMIT - 9
        assert admitted_by_end <= WINDOWS * LIMIT
    else:  # the burst, then one token per 50 ms while the callers ran
        assert LIMIT + math.floor((last - start - 0.1) * LIMIT) - 1 <= admitted
        assert admitted <= LIMIT + math.ceil((replied - start) * LIMIT) + 1
