"""gRPC load generator for ShouldRateLimit: the public client (ratelimitd.transport.client,
grpc.aio) on uvloop, N concurrent calls spread over a few clients (each its own TCP
connection), a fixed number of requests.

Closed loop by default (saturation); with --rate the calls are paced to that many per second
(open loop: call k is due at start + k/rate, so a slow server does not slow the schedule).
Latency is measured from each call's send to its reply.

It reports requests/s, p50/p99/p99.9 latency, the server's CPU seconds per 10 000 decisions
(utime+stime of --pid and its descendants from /proc, read before and after: the stable
figure on a shared machine) and, with --redis, Redis writes and commands per decision from
INFO commandstats deltas.

    .venv/bin/python bench/load/grpc_load.py --target 127.0.0.1:8081 --pid 1234 \\
        --requests 20000 --concurrency 64 --channels 8 [--rate 2000] [--redis 127.0.0.1:6379]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import uvloop

from ratelimitd.transport.client import RateLimitClient, RateLimitError
from ratelimitd.transport.protocodec import decode_response, encode_request

OK = 1


@dataclass
class LoadResult:
    """One run's figures (percentiles in milliseconds; `latencies` raw, in seconds)."""

    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    server_cpu_s: float | None = None
    cpu_per_10k: float | None = None
    redis_writes_per_decision: float | None = None
    redis_commands_per_decision: float | None = None
    target_rps: float | None = None
    # `measure`'s `others`: CPU seconds per 10 000 decisions of each named process (the store).
    others_cpu_per_10k: dict[str, float] = field(default_factory=dict)
    error_codes: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list, repr=False)

    @classmethod
    def of_latencies(
        cls, latencies: list[float], errors: int, seconds: float, target_rps: float | None
    ) -> LoadResult:
        """The figures of the answered calls' sorted `latencies` (seconds) over `seconds`,
        with `errors` failed calls (CPU and Redis figures are the caller's to add)."""
        done = len(latencies)
        return cls(
            requests=done,
            errors=errors,
            seconds=seconds,
            rps=done / seconds if seconds else 0.0,
            p50_ms=percentile(latencies, 50) * 1000,
            p99_ms=percentile(latencies, 99) * 1000,
            p999_ms=percentile(latencies, 99.9) * 1000,
            target_rps=target_rps,
            latencies=latencies,
        )

    def summary(self) -> dict[str, float | int | None]:
        """The figures without the raw latencies."""
        out = asdict(self)
        del out["latencies"]
        return out


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(
        0, min(len(sorted_values) - 1, math.ceil(round(q * len(sorted_values) / 100, 9)) - 1)
    )
    return sorted_values[rank]


def request_bytes(domain: str, descriptor: tuple[tuple[str, str], ...]) -> bytes:
    """A serialized RateLimitRequest with one descriptor."""
    return encode_request(domain, [list(descriptor)])


@dataclass(frozen=True)
class Load:
    """What one run sends: `requests` calls of `payload` to `target`, `concurrency` of them
    in flight over `channels` clients, paced at `rate` calls/s (None: closed loop)."""

    target: str
    payload: bytes
    requests: int
    concurrency: int = 64
    channels: int = 4
    rate: float | None = None
    # Call k's request, when they differ (distinct descriptor values); `payload` is then
    # what the warm-up and the connections' first call send.
    payloads: Callable[[int], bytes] | None = None


async def drive(
    load: Load,
    *,
    warmup: int = 500,
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> tuple[list[float], dict[str, int], float]:
    """Send the load's calls; (latencies in seconds, failures by status, elapsed seconds).

    `on_start` runs after the warm-up, just before the clock starts; `on_end` right after
    the last reply: the server-side snapshots go there so they cover only measured calls.
    """
    # Locals: read on every call of the loops below.
    payload, requests, channels, rate = load.payload, load.requests, load.channels, load.rate
    payloads = load.payloads
    clients = [RateLimitClient(load.target, timeout=30) for _ in range(channels)]
    for client in clients:
        # A local subchannel pool per client: otherwise grpc shares one connection among
        # them and SO_REUSEPORT workers would only ever see a single client connection.
        client.options.append(("grpc.use_local_subchannel_pool", 1))
    calls = [client.should_rate_limit_bytes for client in clients]
    try:
        for call in calls:  # every connection up, and the request allowed
            first = decode_response(await call(payload, timeout=15))
            if first.overall_code != OK:
                raise RuntimeError(f"the benchmark request is not allowed: {first}")
        sem = asyncio.Semaphore(load.concurrency)

        async def one(i: int) -> None:
            # A warm-up failure is not measured; failures in the measured calls are counted.
            async with sem:
                with contextlib.suppress(RateLimitError):
                    await calls[i % channels](payload)

        await asyncio.gather(*(one(i) for i in range(warmup)))

        latencies: list[float] = []
        codes: dict[str, int] = {}
        next_index = 0
        clock = time.perf_counter
        if on_start is not None:
            on_start()
        start = clock()

        async def worker(w: int) -> None:
            nonlocal next_index
            call = calls[w % channels]
            record = latencies.append
            while next_index < requests:
                k = next_index
                next_index += 1
                if rate is not None:
                    delay = start + k / rate - clock()
                    if delay > 0:
                        await asyncio.sleep(delay)
                body = payload if payloads is None else payloads(k)
                t = clock()
                try:
                    await call(body)
                except RateLimitError as err:
                    name = f"{err.code.name}: {err.details}"[:120]
                    codes[name] = codes.get(name, 0) + 1
                    continue
                record(clock() - t)

        await asyncio.gather(*(worker(w) for w in range(load.concurrency)))
        elapsed = clock() - start
        if on_end is not None:
            on_end()
        return latencies, codes, elapsed
    finally:
        for client in clients:
            await client.close()


def measure(
    load: Load,
    *,
    cpu: Callable[[], float] | None = None,
    redis_stats: Callable[[], tuple[int, int]] | None = None,
    others: dict[str, Callable[[], float]] | None = None,
) -> LoadResult:
    """Run `drive` on a fresh uvloop loop with the server's CPU and Redis counts around it
    (and the CPU seconds of each of `others`, by name)."""
    marks: dict[str, list[float]] = {"cpu": [], "writes": [], "commands": []}
    others = others or {}

    def snapshot() -> None:
        if cpu is not None:
            marks["cpu"].append(cpu())
        for name, probe in others.items():
            marks.setdefault(name, []).append(probe())
        if redis_stats is not None:
            writes, commands = redis_stats()
            marks["writes"].append(writes)
            marks["commands"].append(commands)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        latencies, codes, elapsed = runner.run(drive(load, on_start=snapshot, on_end=snapshot))
    latencies.sort()
    errors = sum(codes.values())
    result = LoadResult.of_latencies(latencies, errors, elapsed, load.rate)
    result.error_codes = codes
    decisions = result.requests + errors
    if cpu is not None and decisions:
        used = marks["cpu"][1] - marks["cpu"][0]
        result.server_cpu_s = used
        result.cpu_per_10k = used / decisions * 10_000
    for name in others:
        if decisions:
            result.others_cpu_per_10k[name] = (marks[name][1] - marks[name][0]) / decisions * 10_000
    if redis_stats is not None and decisions:
        result.redis_writes_per_decision = (marks["writes"][1] - marks["writes"][0]) / decisions
        result.redis_commands_per_decision = (
            marks["commands"][1] - marks["commands"][0]
        ) / decisions
    return result


def combine(results: list[LoadResult]) -> LoadResult:
    """Several runs of one scenario as one: totals, and percentiles over all latencies."""
    latencies = sorted(x for r in results for x in r.latencies)
    seconds = sum(r.seconds for r in results)
    errors = sum(r.errors for r in results)
    out = LoadResult.of_latencies(latencies, errors, seconds, results[0].target_rps)
    for r in results:
        for code, n in r.error_codes.items():
            out.error_codes[code] = out.error_codes.get(code, 0) + n
    decisions = out.requests + out.errors
    if decisions and all(r.server_cpu_s is not None for r in results):
        out.server_cpu_s = sum(r.server_cpu_s or 0.0 for r in results)
        out.cpu_per_10k = out.server_cpu_s / decisions * 10_000
    if decisions and all(r.redis_writes_per_decision is not None for r in results):
        each = [(r.requests + r.errors) for r in results]
        out.redis_writes_per_decision = (
            sum((r.redis_writes_per_decision or 0) * n for r, n in zip(results, each, strict=True))
            / decisions
        )
        out.redis_commands_per_decision = (
            sum(
                (r.redis_commands_per_decision or 0) * n for r, n in zip(results, each, strict=True)
            )
            / decisions
        )
    return out


def main() -> None:
    """Command line entry point: prints one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port of the RLS server")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--rate", type=float, help="pace to this many requests/s")
    parser.add_argument("--pid", type=int, help="server pid: report its (tree's) CPU")
    parser.add_argument("--redis", help="host:port of the redis-server: report its writes")
    parser.add_argument("--domain", default="bench")
    parser.add_argument(
        "--descriptor", default="generic_key=bench", help="k=v[,k=v...]: the one descriptor"
    )
    args = parser.parse_args()

    descriptor = tuple(tuple(kv.split("=", 1)) for kv in args.descriptor.split(","))
    payload = request_bytes(args.domain, descriptor)  # type: ignore[arg-type]
    cpu = redis_stats = None
    if args.pid:
        from support.process import cpu_seconds, process_tree

        def cpu() -> float:
            return cpu_seconds(process_tree(args.pid))

    if args.redis:
        from harness import redis_delta
        from support.redis_server import redis_commandstats

        host, _, port = args.redis.rpartition(":")

        def redis_stats() -> tuple[int, int]:
            return redis_delta({}, redis_commandstats(host, int(port)))

    load = Load(args.target, payload, args.requests, args.concurrency, args.channels, args.rate)
    result = measure(load, cpu=cpu, redis_stats=redis_stats)
    print(json.dumps(result.summary()))


if __name__ == "__main__":
    main()
