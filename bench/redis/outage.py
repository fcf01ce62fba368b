"""A stalled or restarted Redis under steady load, through the daemon.

A real redis-server, a real `ratelimitd serve` on it (REDIS_REQUEST_TIMEOUT=50ms,
BACKEND_BREAKER_FAILURES=5, BACKEND_BREAKER_PROBE_INTERVAL=1s, MAX_INFLIGHT_DECISIONS=2000,
BACKEND_FAILURE_POLICY=error: the reference's answer, UNKNOWN), and a steady RATE decisions/s
over gRPC (ratelimitd.transport.client, one channel) from this process. After BEFORE seconds
Redis is stopped for OUTAGE seconds, then the load goes on for AFTER seconds:

- `sigstop`: SIGSTOP (Redis hangs with its sockets open: every round trip waits for its
  timeout), then SIGCONT;
- `restart`: SIGKILL, then a new redis-server on the same port (counters before it are gone).

Reported per scenario: latency (p50 / p99 / max) of the decisions sent before the outage,
during it until the breaker opened, during it with the breaker open, and after it closed;
when the breaker opened and closed (polled on `/healthcheck?detail` every 10 ms) relative to
the stop and the resume; the daemon's RSS during the outage; and the count check: per phase,
the Redis counter against the decisions answered OK (a decision sent to a hung Redis and
answered UNKNOWN may still be applied when Redis resumes: those are reported, not hidden).

    .venv/bin/python bench/redis/outage.py [--rate 1000] [--outage 10]

Prints a Markdown table and one JSON line; bench/results/redis_outage.md keeps a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import uvloop
from support.core import suite_config
from support.daemon import daemon_environment, start_daemon, write_config
from support.machine import machine_info
from support.redis_server import RedisServers

from ratelimitd.transport.client import RateLimitClient, RateLimitError

# d: k 10^9 per hour, a limit the load never reaches.
CONFIG = suite_config("bench_far_limit")
BEFORE, AFTER = 5.0, 8.0
PROBE_INTERVAL = 1.0
TIMEOUT_MS = 50


class Run:
    """What one scenario observed."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, str, str]] = []  # (sent, latency, phase, outcome)
        self.transitions: list[tuple[float, str]] = []  # (time, breaker state)
        self.rss: list[int] = []  # KiB, during the outage
        self.stopped_at = self.resumed_at = 0.0


async def get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def watch_breaker(port: int, run: Run, done: asyncio.Event) -> None:
    state = "closed"
    while not done.is_set():
        try:
            _, body = await get(port, "/healthcheck?detail")
            now = json.loads(body)["breakers"]["redis"]
        except (OSError, ValueError, KeyError):
            now = state
        if now != state:
            run.transitions.append((time.monotonic(), now))
            state = now
        await asyncio.sleep(0.01)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def load(
    client: RateLimitClient, rate: int, until: float, run: Run, phase: list[str]
) -> None:
    """RATE decisions/s, sent on a 1 ms ticker whatever the answers take (open loop)."""
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        p = phase[0]
        sent = time.monotonic()
        try:
            response = await client.should_rate_limit("d", [[("k", p)]], timeout=2)
            outcome = "ok" if response.overall_code == 1 else f"code{response.overall_code}"
        except RateLimitError as exc:
            outcome = "open" if "circuit breaker open" in exc.details else exc.code.name
        run.calls.append((sent, time.monotonic() - sent, p, outcome))

    start = time.monotonic()
    sent = 0
    while (now := time.monotonic()) < until:
        due = int((now - start) * rate) - sent
        for _ in range(due):
            t = asyncio.ensure_future(one())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        sent += max(due, 0)
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)


async def scenario(workdir: Path, kind: str, rate: int, outage: float) -> dict:
    servers = RedisServers(workdir / kind)
    server = servers()
    env = daemon_environment(
        workdir / kind / "runtime",
        BACKEND_TYPE="redis",
        REDIS_SOCKET_TYPE="tcp",
        REDIS_URL=server.address,
        REDIS_REQUEST_TIMEOUT=f"{TIMEOUT_MS}ms",
        BACKEND_FAILURE_POLICY="error",
        BACKEND_BREAKER_FAILURES="5",
        BACKEND_BREAKER_PROBE_INTERVAL=f"{PROBE_INTERVAL:g}s",
        MAX_INFLIGHT_DECISIONS="2000",
        LOG_LEVEL="warning",
    )
    write_config(env, "d.yaml", CONFIG)
    daemon = start_daemon(env, workdir / kind)
    run = Run()
    phase = ["before"]
    done = asyncio.Event()
    client = RateLimitClient(daemon.grpc_target)
    try:
        watcher = asyncio.ensure_future(watch_breaker(daemon.http_port, run, done))
        t0 = time.monotonic()
        loader = asyncio.ensure_future(load(client, rate, t0 + BEFORE + outage + AFTER, run, phase))
        await asyncio.sleep(BEFORE)
        port = server.port
        run.stopped_at = time.monotonic()
        phase[0] = "outage"
        if kind == "sigstop":
            server.pause()
        else:
            os.kill(server.pid, signal.SIGKILL)
        while time.monotonic() < run.stopped_at + outage:
            run.rss.append(rss_kib(daemon.pid))
            await asyncio.sleep(0.5)
        if kind == "sigstop":
            server.resume()
        else:
            server = servers(port=port)
        run.resumed_at = time.monotonic()
        phase[0] = "after"
        await loader
        done.set()
        await watcher
        counted = {
            p: sum(int(server.client().get(k) or 0) for k in server.client().keys(f"d_k_{p}_*"))
            for p in ("before", "outage", "after")
        }
    finally:
        await client.close()
        daemon.close()
        servers.stop_all()
    return summarize(kind, run, counted)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def summarize(kind: str, run: Run, counted: dict[str, int]) -> dict:
    opened = next((t for t, s in run.transitions if s == "open"), None)
    closed = next((t for t, s in run.transitions if s == "closed" and t >= run.resumed_at), None)
    windows = {
        "before": lambda s: s < run.stopped_at,
        "stopped, breaker closed": lambda s: run.stopped_at <= s < (opened or run.resumed_at),
        "stopped, breaker open": lambda s: (opened or 1e18) <= s < run.resumed_at,
        "after, breaker closed": lambda s: closed is not None and s >= closed,
    }
    latency = {}
    for name, inside in windows.items():
        lat = [lat for sent, lat, _, _ in run.calls if inside(sent)]
        latency[name] = {
            "n": len(lat),
            "p50_ms": round(pct(lat, 0.5), 2),
            "p99_ms": round(pct(lat, 0.99), 2),
            "max_ms": round(pct(lat, 1.0), 2),
        }
    phases = {}
    for p in ("before", "outage", "after"):
        outcomes: dict[str, int] = {}
        for _, _, q, outcome in run.calls:
            if q == p:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        phases[p] = {"outcomes": outcomes, "redis_count": counted[p]}
    return {
        "scenario": kind,
        "breaker_opened_after_stop_ms": round((opened - run.stopped_at) * 1000, 1)
        if opened
        else None,
        "breaker_closed_after_resume_ms": round((closed - run.resumed_at) * 1000, 1)
        if closed
        else None,
        "transitions": len(run.transitions),
        "rss_kib_during_outage": [min(run.rss), max(run.rss)] if run.rss else None,
        "latency": latency,
        "phases": phases,
    }


def table(results: list[dict], rate: int, outage: float) -> str:
    lines = [
        f"Steady {rate} decisions/s over gRPC, Redis stopped {outage:g} s after {BEFORE:g} s, "
        f"{AFTER:g} s after; REDIS_REQUEST_TIMEOUT={TIMEOUT_MS}ms, breaker after 5 failures, "
        f"probe every {PROBE_INTERVAL:g} s, policy error.",
        "",
        "| scenario | window | decisions | p50 ms | p99 ms | max ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        for name, w in r["latency"].items():
            lines.append(
                f"| {r['scenario']} | {name} | {w['n']} | {w['p50_ms']} | {w['p99_ms']} | "
                f"{w['max_ms']} |"
            )
    lines += [
        "",
        "| scenario | breaker opened after stop | closed after resume | RSS during outage KiB |",
    ]
    lines.append("|---|---:|---:|---|")
    for r in results:
        lines.append(
            f"| {r['scenario']} | {r['breaker_opened_after_stop_ms']} ms | "
            f"{r['breaker_closed_after_resume_ms']} ms | {r['rss_kib_during_outage']} |"
        )
    lines += ["", "| scenario | phase | answers | Redis counter |", "|---|---|---|---:|"]
    for r in results:
        for p, v in r["phases"].items():
            answers = ", ".join(f"{k} {n}" for k, n in sorted(v["outcomes"].items()))
            lines.append(f"| {r['scenario']} | {p} | {answers} | {v['redis_count']} |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--outage", type=float, default=10.0)
    parser.add_argument("--scenario", choices=("sigstop", "restart", "both"), default="both")
    args = parser.parse_args()
    kinds = ("sigstop", "restart") if args.scenario == "both" else (args.scenario,)
    with tempfile.TemporaryDirectory() as tmp:
        results = [await scenario(Path(tmp), k, args.rate, args.outage) for k in kinds]
    print(table(results, args.rate, args.outage))
    print(json.dumps({"machine": machine_info(), "rate": args.rate, "results": results}))


if __name__ == "__main__":
    uvloop.run(main())
