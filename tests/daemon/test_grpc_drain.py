"""Drain and deadlines on both gRPC transports: `stop` lets in-flight calls finish and
refuses new connections; a call past its deadline cancels the decision it was waiting for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from support.grpc_rls import (
    CONFIG,
    KV,
    TIMEOUT,
    call,
    request,
    rpc_error,
)

from ratelimitd._proto import rls_pb2_grpc
from ratelimitd.health import Health
from ratelimitd.messages import OK, Request, Response
from ratelimitd.service import settled

# -- drain and deadlines (both transports) -----------------------------------------------


class Gate:
    """A service stand-in whose decisions wait until `release()`."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, req: Request) -> Response:
        self.entered.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await settled(self.real(req))  # type: ignore[no-any-return]


def gated_harness(harness: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Gate]:
    """A harness on CONFIG whose service decides only once its Gate is released."""
    h = harness(CONFIG)
    # The gate is the service's one entry: its answer, awaited, is the real one's.
    gate = Gate(h.service.decide)
    monkeypatch.setattr(h.service, "decide", gate)
    # A limiter that waits (as Redis does): the native transport takes its task path.
    monkeypatch.setattr(h.limiter, "synchronous", False)
    return h, gate


async def test_stop_drains_in_flight_calls(
    harness: Callable[..., Any], serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, gate = gated_harness(harness, monkeypatch)
    health = Health()
    health.register("backend", True)
    served = await serve(h.service, h.stats, health=health)
    async with served.channel() as channel:
        in_flight = asyncio.ensure_future(call(channel, request("test", KV)))
        await asyncio.wait_for(gate.entered.wait(), TIMEOUT)
        stopping = asyncio.ensure_future(served.transport.stop(TIMEOUT))
        await asyncio.sleep(0.2)
        assert not stopping.done()  # waiting for the call
        # No new connections once stopping.
        async with served.channel() as late:
            err = await rpc_error(call(late, request("test", KV)))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
        gate.gate.set()
        assert (await in_flight).overall_code == OK
        await asyncio.wait_for(stopping, TIMEOUT)
    assert h.stats.service.total_requests == 1


async def test_deadline_exceeded_cancels_the_pending_work(
    harness: Callable[..., Any], serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, gate = gated_harness(harness, monkeypatch)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        err = await rpc_error(stub.ShouldRateLimit(request("test", KV), timeout=0.3))
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server side gave up too: the waiting decision was cancelled.
        await asyncio.wait_for(_until(lambda: gate.cancelled == 1), TIMEOUT)
        gate.gate.set()
        assert (await call(channel, request("test", KV))).overall_code == OK


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)
