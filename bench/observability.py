"""Decision throughput over gRPC in-process with stats and tracing on vs off, in one run.

    .venv/bin/python bench/observability.py [--requests 20000] [--concurrency 32] [--rounds 3]

Each mode serves ShouldRateLimit from a GrpcTransport on a grpc.aio server (uvloop, port 0)
deciding on the memory backend, and the public client (ratelimitd.transport.client) in the same loop
sends `--requests` calls from `--concurrency` tasks. Modes run interleaved, round after
round, so drift on a shared VM hits all of them alike; the figures are the median
decisions/s and the median process CPU per decision for each mode, and their ratios to
"off". Modes:

* off:            null sink (DISABLE_STATS), no interceptor, tracing disabled
* statsd:         statsd sink flushing every 1 s to a TCP listener in this process, plus
                  the response-time interceptor
* prometheus:     Prometheus sink (scraped every 1 s), plus the interceptor
* statsd+trace0:  statsd as above, tracing on with TRACING_SAMPLING_RATE=0
* statsd+trace1:  statsd as above, tracing on, every request sampled (server span + backend
                  child span), spans exported by a BatchSpanProcessor to an exporter that
                  drops them (the cost of an OTLP collector is not ours to measure)

Prints one JSON object (machine, versions, per-round and median figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import grpc
import grpc.aio
import uvloop
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from support.core import suite_config
from support.machine import machine_info

from ratelimitd._proto import rls_pb2
from ratelimitd.backends import MemoryBackend, load_settings
from ratelimitd.config import ConfigFile
from ratelimitd.core import build_core
from ratelimitd.settings import ListenerSettings
from ratelimitd.stats import StatsStore
from ratelimitd.stats.sinks import create_sink
from ratelimitd.stats.tracing import create_tracing
from ratelimitd.transport.client import RateLimitClient
from ratelimitd.transport.grpc import GrpcTransport
from ratelimitd.transport.http import HttpServer
from ratelimitd.transport.spans import ServerInterceptor, server_interceptor

CONFIG = suite_config("bench_observability")

MODES = ("off", "statsd", "prometheus", "statsd+trace0", "statsd+trace1")


class FakeContext:
    """The part of grpc.aio.ServicerContext the handler and interceptor use."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = tuple(_Metadatum(k, v) for k, v in metadata)

    def invocation_metadata(self) -> tuple[Any, ...]:
        return self._metadata

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(details)

    def code(self) -> Any:
        return None


class _Metadatum:
    __slots__ = ("key", "value")

    def __init__(self, key: str, value: str) -> None:
        self.key, self.value = key, value


class DropExporter(SpanExporter):
    """Accepts spans and forgets them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def request_bodies() -> list[bytes]:
    """256 serialized requests: two descriptors, both limited, distinct users."""
    bodies = []
    for i in range(256):
        msg = rls_pb2.RateLimitRequest(domain="bench")
        d = msg.descriptors.add()
        d.entries.add(key="user", value=f"u{i}")
        d = msg.descriptors.add()
        d.entries.add(key="path", value="/a")
        d.entries.add(key="method", value="GET")
        bodies.append(msg.SerializeToString())
    return bodies


def request_metadata(mode: str) -> tuple[tuple[str, str], ...]:
    """An incoming sampled trace in the fully traced mode; none otherwise, so that with
    TRACING_SAMPLING_RATE=0 the parent-based sampler drops every request."""
    if mode == "statsd+trace1":
        return (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
    return ()


async def run_mode(
    mode: str, path: str, requests: int, concurrency: int
) -> tuple[float, float, dict[str, Any]]:
    """(decisions/s, process CPU µs per decision, what the sink/exporter saw) for one mode.

    path "grpc": the public client (ratelimitd.transport.client) in this loop calls the server over
    loopback.
    path "handler": the transport's raw-bytes handler, wrapped by the interceptor exactly as
    grpc wraps it, is awaited directly (no sockets: the steadier measure of our own cost).
    """
    stats = StatsStore()
    env = {"BACKEND_TYPE": "memory", "STATS_FLUSH_INTERVAL": "1s"}
    statsd_server: asyncio.Server | None = None
    received = [0]
    if mode == "off":
        env["DISABLE_STATS"] = "true"
    elif mode == "prometheus":
        env.update(USE_STATSD="false", USE_PROMETHEUS="true", PROMETHEUS_ADDR="127.0.0.1:0")
    else:

        async def consume(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                received[0] += data.count(b"\n")
            writer.close()

        statsd_server = await asyncio.start_server(consume, "127.0.0.1", 0)
        env.update(
            STATSD_HOST="127.0.0.1", STATSD_PORT=str(statsd_server.sockets[0].getsockname()[1])
        )
    if "trace" in mode:
        env.update(TRACING_ENABLED="true", TRACING_SAMPLING_RATE=mode[-1])
    settings = load_settings(env)
    sink = create_sink(settings, stats, serve=HttpServer)
    exporter = DropExporter()
    tracing = create_tracing(settings, exporter=exporter)

    core = build_core(settings, backend=MemoryBackend(0), stats=stats, tracing=tracing)
    core.load([ConfigFile("bench.yaml", CONFIG)])
    core.health.register("backend", True)
    transport = GrpcTransport(
        replace(settings, listeners=ListenerSettings(grpc_host="127.0.0.1", grpc_port=0)),
        core.service,
        core.health,
        stats,
        response_timer=sink.timer,
    )
    interceptor = server_interceptor(tracing)
    await sink.start()

    scrapes = 0
    scraper: asyncio.Task[None] | None = None
    if mode == "prometheus":

        async def scrape() -> None:
            nonlocal scrapes
            while True:
                await asyncio.sleep(1.0)
                port = sink.port  # type: ignore[attr-defined]
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                await reader.read()
                writer.close()
                scrapes += 1

        scraper = asyncio.create_task(scrape())

    bodies = request_bodies()
    metadata = request_metadata(mode)
    per_task = requests // concurrency
    server: grpc.aio.Server | None = None
    client: RateLimitClient | None = None
    if path == "grpc":
        server = grpc.aio.server(interceptors=[interceptor] if interceptor else [])
        transport.register(server)
        port = transport.bind(server)
        await server.start()
        client = RateLimitClient(f"127.0.0.1:{port}")
        call = client.should_rate_limit_bytes

        async def worker(offset: int) -> None:
            for i in range(per_task):
                await call(bodies[(offset + i) % len(bodies)], metadata=metadata)

    else:
        handler: Any = transport.should_rate_limit
        if isinstance(interceptor, ServerInterceptor):
            handler = interceptor._wrap(handler)
        context = FakeContext(metadata)

        async def worker(offset: int) -> None:
            for i in range(per_task):
                await handler(bodies[(offset + i) % len(bodies)], context)
                if i % 8 == 7:
                    # The memory backend never suspends; a server's loop runs its I/O
                    # (here: the sink's flushes) between requests.
                    await asyncio.sleep(0)

    await asyncio.gather(*(worker(t) for t in range(concurrency)))  # warm-up round
    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(t) for t in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started

    if scraper is not None:
        scraper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await scraper
    if client is not None:
        await client.close()
    if server is not None:
        await server.stop(0)
    await sink.stop()
    if tracing is not None:
        await tracing.shutdown()
    if statsd_server is not None:
        await asyncio.sleep(0.05)
        statsd_server.close()
    n = per_task * concurrency
    seen = {"statsd_lines": received[0], "spans": exporter.spans, "scrapes": scrapes}
    return n / elapsed, cpu / n * 1e6, seen


def summary(rounds: dict[str, list[float]]) -> dict[str, Any]:
    """Per-round figures, median, best, and the ratio of each mode's median to "off"."""
    median = {m: statistics.median(v) for m, v in rounds.items()}
    return {
        "rounds": rounds,
        "median": median,
        "ratio_to_off": {m: round(median[m] / median["off"], 3) for m in rounds},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "machine": machine_info(("opentelemetry-sdk", "prometheus-client")),
        "requests_per_round": args.requests // args.concurrency * args.concurrency,
        "concurrency": args.concurrency,
    }
    for path in args.paths.split(","):
        rates: dict[str, list[float]] = {m: [] for m in MODES}
        cpus: dict[str, list[float]] = {m: [] for m in MODES}
        seen: dict[str, Any] = {}
        for _ in range(args.rounds):
            for mode in MODES:
                rate, cpu_us, seen[mode] = await run_mode(
                    mode, path, args.requests, args.concurrency
                )
                rates[mode].append(round(rate))
                cpus[mode].append(round(cpu_us, 1))
        out[path] = {
            "decisions_per_second": summary(rates),
            # Process CPU per decision (client included on the grpc path): steadier than
            # wall-clock throughput on a shared machine.
            "cpu_us_per_decision": summary(cpus),
            "last_round_seen": seen,
        }
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--paths", default="handler,grpc", help="handler, grpc or both")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        print(json.dumps(runner.run(main(parser.parse_args())), indent=2))
