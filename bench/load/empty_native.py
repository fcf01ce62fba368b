"""An RLS server on the native HTTP/2 transport that does nothing: every call gets a fixed OK.

The native transport's ceiling, as `empty_server.py` is grpc.aio's: the same core, protocol
and server as the daemon (`ratelimitd.transport.h2`), with a dispatch that answers the
serialized OK at once, so the difference to ratelimitd is the decision path itself.

    .venv/bin/python bench/load/empty_native.py --port 8081
"""

from __future__ import annotations

import argparse
from typing import Any

import uvloop
from empty_server import OK_RESPONSE, until_stopped

from ratelimitd.transport.h2 import H2Protocol, H2Server


def answer(stream: Any, proto: H2Protocol) -> None:
    """Always OK, whatever was asked."""
    proto.answer(stream, 0, OK_RESPONSE)


async def serve(host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT."""
    server = H2Server(answer, max_concurrent_streams=256)
    await server.start(host, port)
    await until_stopped()
    await server.stop(1)


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="gRPC port")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
