"""StreamRateLimitQuotas on both gRPC transports: thin adapters around `quota.QuotaService`.

The stream's messages go to its `QuotaStream` as raw bytes, in order; what the service sends
goes back as raw bytes, and the status it ends the call with becomes the call's status.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio

from ..quota import QuotaService
from ..quota.codec import METHOD_NAME, METHOD_PATH, SERVICE_NAME

__all__ = ["METHOD_PATH", "NativeQuotaRoute", "register_grpcio"]

# grpc's StatusCode by number.
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


def register_grpcio(server: grpc.aio.Server, quota: QuotaService) -> None:
    """Add StreamRateLimitQuotas (raw bytes in and out) to a grpc.aio server."""

    async def stream_quotas(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        out: asyncio.Queue[bytes | tuple[int, str]] = asyncio.Queue()
        stream = quota.open(
            out.put_nowait, lambda code, text: out.put_nowait((code, text)), context.peer()
        )

        async def pump() -> None:
            async for message in requests:
                stream.receive(message)
            stream.receive(None)

        reader = asyncio.get_running_loop().create_task(pump())
        try:
            while True:
                item = await out.get()
                if isinstance(item, bytes):
                    yield item
                    continue
                code, text = item
                if code:
                    await context.abort(_STATUS_CODES[code], text)
                return
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            stream.cancel()

    handler = grpc.stream_stream_rpc_method_handler(stream_quotas)
    server.add_registered_method_handlers(SERVICE_NAME, {METHOD_NAME: handler})


class NativeQuotaRoute:
    """The native transport's route of StreamRateLimitQuotas (a streaming path of the core:
    dispatched at its HEADERS, its messages handed to `stream.work.receive`)."""

    path = METHOD_PATH.encode()

    def __init__(self, quota: QuotaService) -> None:
        self.quota = quota

    def __call__(self, stream: Any, proto: Any) -> None:
        peer = proto.transport.get_extra_info("peername") if proto.transport else None
        stream.work = self.quota.open(
            lambda data: proto.send_message(stream, data),
            lambda code, text: proto.finish(stream, code, text),
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or ""),
        )
