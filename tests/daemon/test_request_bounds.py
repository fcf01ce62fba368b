"""Large requests are bounded and never stall the others.

Before: one 4 MB request (349,524 descriptors) blocked the loop for 1.2 s, and on Redis any
request with more than 4,096 descriptors failed with `redis pipeline full`. Now a request past
MAX_DESCRIPTORS_PER_REQUEST (default 1,024) or MAX_ENTRIES_PER_DESCRIPTOR (default 64) is
refused before any work (gRPC RESOURCE_EXHAUSTED, /json 400); a large valid one is matched in
slices that let other requests run, and succeeds on Redis whatever its size.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from support.attacks import many_descriptors
from support.core import memory_decider
from support.daemon import write_config

from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.service import SLICE, RequestTooLarge
from ratelimitd.settings import ReloadOptions
from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.protocodec import decode_response, encode_request

CONFIG = """\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


def descriptors(n: int, entries: int = 1, tag: object = "") -> list[list[tuple[str, str]]]:
    return [[("k", f"v{tag}{i}")] + [("e", str(j)) for j in range(entries - 1)] for i in range(n)]


async def call(target: str, request: bytes) -> Any:
    async with grpc.aio.insecure_channel(target) as channel:
        return await channel.unary_unary(METHOD_PATH)(request, timeout=30)


async def test_limits_refuse_before_any_work(grpc_env: dict[str, str], start_daemon: Any) -> None:
    env = dict(grpc_env, BACKEND_TYPE="memory", MAX_DESCRIPTORS_PER_REQUEST="100")
    write_config(env, "d.yaml", CONFIG)
    d = start_daemon(env)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(d.grpc_target, encode_request("d", descriptors(101)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (
        info.value.details() == "101 descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST=100)"
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(d.grpc_target, encode_request("d", descriptors(1, entries=65)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "65 entries (MAX_ENTRIES_PER_DESCRIPTOR=64)" in (info.value.details() or "")
    body = json.dumps(
        {
            "domain": "d",
            "descriptors": [{"entries": [{"key": "k", "value": f"v{i}"}]} for i in range(101)],
        }
    ).encode()
    assert d.http("/json", body)[0] == 400
    # Nothing was counted: the first request of the limit at 100 descriptors is still OK.
    reply = decode_response(await call(d.grpc_target, encode_request("d", descriptors(100))))
    assert reply.overall_code == OK


async def test_requests_past_the_bounds_are_refused_while_decoded(
    grpc_env: dict[str, str], start_daemon: Any
) -> None:
    """A 466,000-descriptor request and a 4,097-byte descriptor value: RESOURCE_EXHAUSTED
    naming the bound (gRPC, both transports), 400 (/json), counted as service errors."""
    env = dict(grpc_env, BACKEND_TYPE="memory")
    write_config(env, "d.yaml", CONFIG)
    d = start_daemon(env)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(d.grpc_target, many_descriptors("d", 466_000))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == (
        "466000 descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST=1024)"
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(d.grpc_target, encode_request("d", [[("k", "v" * 4097)]]))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == (
        "a descriptor value of 4097 bytes (MAX_DESCRIPTOR_VALUE_LENGTH=4096)"
    )
    body = {"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v" * 4097}]}]}
    assert d.http("/json", json.dumps(body).encode())[0] == 400
    assert d.stats()["ratelimit.service.call.should_rate_limit.service_error"] == 3
    at_limit = encode_request("d", [[("k", "v" * 4096)]])
    assert decode_response(await call(d.grpc_target, at_limit)).overall_code == OK


async def test_the_memory_store_keeps_at_most_memory_max_keys(
    daemon_env: dict[str, str], start_daemon: Any
) -> None:
    """30,000 new keys into a store of 20,000: the oldest counters (the first to expire)
    make room; before, every key stayed until its window ended."""
    env = dict(
        daemon_env,
        BACKEND_TYPE="memory",
        MEMORY_MAX_KEYS="20000",
        EXPIRATION_JITTER_MAX_SECONDS="0",
    )
    write_config(env, "d.yaml", CONFIG.replace("requests_per_unit: 1", "requests_per_unit: 9"))
    d = start_daemon(env)
    first = encode_request("d", [[("k", "first")]])
    assert decode_response(await call(d.grpc_target, first)).statuses[0].limit_remaining == 8
    for batch in range(30):
        await call(d.grpc_target, encode_request("d", descriptors(1000, entries=1, tag=batch)))
    again = decode_response(await call(d.grpc_target, first))
    assert again.statuses[0].limit_remaining == 8  # counted from 0 again: it was evicted


async def test_a_large_request_is_sliced_on_the_native_memory_path(
    grpc_env: dict[str, str], start_daemon: Any
) -> None:
    env = dict(grpc_env, BACKEND_TYPE="memory")
    write_config(env, "d.yaml", CONFIG)
    d = start_daemon(env)
    n = 3 * SLICE + 1
    reply = decode_response(await call(d.grpc_target, encode_request("d", descriptors(n))))
    assert reply.overall_code == OK and len(reply.statuses) == n
    again = decode_response(await call(d.grpc_target, encode_request("d", descriptors(n))))
    assert again.overall_code == OVER_LIMIT


async def test_other_requests_run_between_the_slices_of_a_large_one() -> None:
    decider = memory_decider(CONFIG)
    done: list[str] = []

    async def decide(name: str, n: int) -> None:
        await decider.decide("d", *descriptors(n))
        done.append(name)

    big = asyncio.ensure_future(decide("big", 4 * SLICE))
    await asyncio.sleep(0)  # the big one starts and yields after its first slice
    await decide("small", 1)
    await big
    assert done == ["small", "big"]


async def test_the_limits_are_options() -> None:
    decider = memory_decider(CONFIG, options=ReloadOptions(max_descriptors=2, max_entries=1))
    with pytest.raises(RequestTooLarge):
        await decider.decide("d", *descriptors(3))
    with pytest.raises(RequestTooLarge):
        await decider.decide("d", *descriptors(1, entries=2))
    assert decider.stat("ratelimit.service.call.should_rate_limit.service_error") == 2
