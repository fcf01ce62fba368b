"""An RLS server that does nothing: every ShouldRateLimit call gets the same serialized OK.

It is the transport ceiling the ratelimitd figures are compared with: grpc.aio on uvloop with
a raw-bytes handler (no serializers), exactly the registration the daemon uses, minus all
decision work. With --http-port it also answers POST /json with a fixed OK body on the
daemon's own HTTP/1.1 server (ratelimitd.transport.http), the ceiling for /json.

    .venv/bin/python bench/load/empty_server.py --port 8081 [--http-port 8080]
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc
import grpc.aio
import uvloop

from ratelimitd.transport.http import JSON, HttpRequest, HttpServer, Reply
from ratelimitd.transport.protocodec import METHOD_NAME, SERVICE_NAME

# RateLimitResponse{overall_code: OK, statuses: [{code: OK}]}: field 1 varint 1, then one
# length-delimited DescriptorStatus (field 2) holding code OK (its field 1 varint 1).
OK_RESPONSE = b"\x08\x01\x12\x02\x08\x01"
OK_JSON: Reply = (200, JSON, b'{"overallCode":"OK","statuses":[{"code":"OK"}]}')


async def should_rate_limit(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """Always OK, whatever was asked."""
    return OK_RESPONSE


async def json_ok(request: HttpRequest) -> Reply:
    """Always OK, whatever was posted."""
    return OK_JSON


async def until_stopped() -> None:
    """Return at the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(host: str, port: int, http_port: int | None) -> None:
    """Serve until SIGTERM/SIGINT."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME, {METHOD_NAME: grpc.unary_unary_rpc_method_handler(should_rate_limit)}
    )
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    http = None
    if http_port is not None:
        http = HttpServer({"/json": json_ok})
        await http.start(host, http_port)
    await until_stopped()
    if http is not None:
        await http.close(1)
    await server.stop(1)


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="gRPC port")
    parser.add_argument("--http-port", type=int, help="also serve POST /json here")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.host, args.port, args.http_port))


if __name__ == "__main__":
    main()
