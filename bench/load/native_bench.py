"""The native gRPC transport's load section of run_all.py, driven by h2load.

One interleaved set of rounds, each server pinned to CPU 0 while h2load runs pinned to CPU 1
(`clients` connections x `streams` concurrent streams), of:

  (a) the empty grpc.aio server          (e) the empty native server (fixed reply)
  (b) ratelimitd, native, memory         (c) ratelimitd, native, Redis
  (f) ratelimitd, grpc.aio, memory

then (b), (c) and (e) paced at half of their own saturation for p99. Reported per scenario:
decisions/s, server CPU per decision (/proc, the whole process tree) and, for Redis, round
trips per decision from the daemon's `ratelimit.redis_pool.pipeline_writes` gauge.

run_all.py runs it as one section of bench/results/load.md. Run alone, it starts (e), (b)
and (c) only (no Envoy, no grpc.aio), measures them in one interleaved run, and prints the
table with the load average, the machine and the ratio of each to the empty server:

    .venv/bin/python bench/load/native_bench.py                 # 3 rounds of 10 s
    .venv/bin/python bench/load/native_bench.py --seconds 5 --rounds 1 --json out.json

Server CPU per decision is read from /proc and is the figure to trust on a busy machine;
decisions/s need both cores idle but for this run (check `uptime` first).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpc_load import LoadResult, combine
from h2load_load import pin, run_h2load
from support.process import process_tree

NAMES = {
    "a": "(a) empty grpc.aio server",
    "e": "(e) empty native server",
    "b": "(b) ratelimitd native, memory",
    "c": "(c) ratelimitd native, Redis",
    "f": "(f) ratelimitd grpc.aio, memory",
}
ORDER = ("a", "e", "b", "c", "f")
SERVER_CPU, LOAD_CPU = 0, 1


def unpin(pid: int) -> None:
    """Let a server run on every CPU again."""
    for p in process_tree(pid):
        subprocess.run(["taskset", "-a", "-p", "-c", "0-1023", str(p)], capture_output=True)


def pipeline_writes(server: Any) -> Callable[[], float]:
    """Redis round trips so far: the daemon's pipeline_writes gauge(s)."""
    return lambda: sum(v for k, v in server.stats().items() if k.endswith("pipeline_writes"))


def run_native(
    servers: dict[str, Any],
    payload: bytes,
    *,
    seconds: float,
    rounds: int,
    paced_seconds: float,
    clients: int = 4,
    streams: int = 32,
    log: Callable[[str], None] = print,
    paced: bool = True,
) -> dict[str, Any]:
    """Saturation rounds and the paced runs; raw results by scenario key."""
    runs: dict[str, list[LoadResult]] = {k: [] for k in ORDER if k in servers}

    def one(key: str, rate: float | None = None) -> LoadResult:
        server = servers[key]
        pin(server.pid, SERVER_CPU, process_tree)
        try:
            return run_h2load(
                server.grpc_port,
                payload,
                seconds=seconds if rate is None else paced_seconds,
                clients=clients,
                streams=streams,
                rate=rate,
                load_cpu=LOAD_CPU,
                cpu=server.cpu,
                probe=pipeline_writes(server) if key == "c" else None,
            )
        finally:
            unpin(server.pid)

    for rnd in range(rounds):
        for key in runs:
            log(f"h2load round {rnd + 1}/{rounds}: {NAMES[key]}")
            runs[key].append(one(key))
    saturation = {k: combine(v) for k, v in runs.items()}
    out: dict[str, Any] = {
        "clients": clients,
        "streams": streams,
        "seconds": seconds,
        "rounds": rounds,
        "saturation": {k: r.summary() for k, r in saturation.items()},
        "paced": {},
    }
    for key in ("e", "b", "c") if paced else ():
        if key in saturation:
            rate = saturation[key].rps / 2
            log(f"h2load paced at {rate:.0f}/s: {NAMES[key]}")
            out["paced"][key] = one(key, rate).summary()
    return out


def _us(cpu_per_10k: float | None) -> str:
    return "n/a" if cpu_per_10k is None else f"{cpu_per_10k * 100:.1f}"


def render_native(n: dict[str, Any]) -> list[str]:
    """The section of bench/results/load.md."""
    sat = n["saturation"]
    out = [
        "## gRPC on one pinned core, driven by h2load",
        "",
        f"`bench/load/native_bench.py`: each server pinned to CPU {SERVER_CPU} (`taskset`), "
        f"h2load pinned to CPU {LOAD_CPU}, {n['clients']} connections x {n['streams']} "
        f"streams ({n['clients'] * n['streams']} concurrent calls), {n['rounds']} interleaved "
        f"round(s) of {n['seconds']:g} s per scenario after a 1 s warm-up. Redis round trips "
        "from `ratelimit.redis_pool.pipeline_writes` (default REDIS_PIPELINE_WINDOW=0).",
        "",
        "| scenario | decisions/s | server CPU µs / decision | ÷ (a) decisions/s "
        "| p50 ms | p99 ms | Redis round trips / decision |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = sat.get("a", {}).get("rps") or None
    for key, r in sat.items():
        ratio = "n/a" if base is None else f"{r['rps'] / base:.1f}×"
        trips = r["redis_writes_per_decision"]
        out.append(
            f"| {NAMES[key]} | {r['rps']:,.0f} | {_us(r['cpu_per_10k'])} | {ratio} "
            f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {'' if trips is None else f'{trips:.3f}'} |"
        )
    out += [
        "",
        "Paced at half of each one's saturation (h2load --rps):",
        "",
        "| scenario | target/s | achieved/s | p50 ms | p99 ms | p99.9 ms | CPU µs / decision |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in n["paced"].items():
        out.append(
            f"| {NAMES[key]} | {r['target_rps']:,.0f} | {r['rps']:,.0f} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {_us(r['cpu_per_10k'])} |"
        )
    out.append("")
    return out


def native_targets(n: dict[str, Any], envoy: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(target, measured, met) rows for the native transport on one pinned core."""
    sat, paced = n["saturation"], n["paced"]
    rows: list[tuple[str, str, str]] = []

    def row(target: str, measured: str, ok: bool | None) -> None:
        rows.append((target, measured, "n/a" if ok is None else ("yes" if ok else "no")))

    b, c, a, e = sat.get("b"), sat.get("c"), sat.get("a"), sat.get("e")
    if b and e and e["rps"]:
        x = b["rps"] / e["rps"]
        row("native + memory decisions/s ≥ 0.5× the empty native server's", f"{x:.2f}×", x >= 0.5)
        row("moonshot: native + memory ≥ 0.7× the empty native server's", f"{x:.2f}×", x >= 0.7)
    if c and c["cpu_per_10k"]:
        us = c["cpu_per_10k"] * 100
        row("native + Redis ≤ 7 µs server CPU per decision", f"{us:.1f} µs", us <= 7)
    if b:
        us = b["cpu_per_10k"] * 100 if b["cpu_per_10k"] else None
        row("native + memory ≥ 25,000 decisions/s on one core", f"{b['rps']:,.0f}/s",
            b["rps"] >= 25_000)  # fmt: skip
        row("native + memory ≤ 40 µs server CPU per decision", _us(b["cpu_per_10k"]) + " µs",
            None if us is None else us <= 40)  # fmt: skip
        if a and a["rps"]:
            x = b["rps"] / a["rps"]
            row("native + memory ≥ 8× the empty grpc.aio server", f"{x:.1f}×", x >= 8)
    if c:
        row("native + Redis ≥ 15,000 decisions/s on one core", f"{c['rps']:,.0f}/s",
            c["rps"] >= 15_000)  # fmt: skip
        rt = c["redis_writes_per_decision"]
        row("native + Redis ≤ 0.25 Redis round trips per decision",
            "n/a" if rt is None else f"{rt:.3f}", None if rt is None else rt <= 0.25)  # fmt: skip
    for key in ("b", "c"):
        if key in paced:
            p99 = paced[key]["p99_ms"]
            row(f"p99 ≤ 2 ms at half saturation, {NAMES[key]}", f"{p99:.2f} ms", p99 <= 2)
    if envoy:
        x = envoy["ratelimited"]["rps"] / envoy["plain"]["rps"]
        row("Envoy → ratelimitd → Redis ≥ 70% of Envoy alone", f"{x:.0%}", x >= 0.70)
    return rows


def main() -> int:
    """Run (e), (b) and (c) alone and print the table (see the module docstring)."""
    from grpc_load import request_bytes
    from harness import DESCRIPTOR, DOMAIN, EmptyNativeServer, start_bench_daemon, start_redis
    from support.machine import load_average, machine_info
    from support.process import Proc, start_bound

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each timed h2load run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved saturation rounds")
    parser.add_argument("--paced", action="store_true", help="also the paced p99 runs")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results: dict[str, Any] = {"machine": machine_info(), "load average at start": load_average()}
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory(prefix="native-bench-") as tmp:
        workdir = Path(tmp)
        try:
            servers: dict[str, Any] = {"e": start_bound(lambda: EmptyNativeServer(workdir))}
            procs.append(servers["e"])
            servers["b"] = start_bench_daemon("memory", workdir)
            procs.append(servers["b"])
            redis = start_redis(workdir)
            procs.append(redis)
            results["machine"]["redis-server"] = redis.version()
            redis_env = {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp"}
            servers["c"] = start_bench_daemon(
                "redis", workdir, REDIS_URL=redis.address, **redis_env
            )
            procs.append(servers["c"])
            native = run_native(
                servers,
                request_bytes(DOMAIN, DESCRIPTOR),
                seconds=args.seconds,
                rounds=args.rounds,
                paced_seconds=args.seconds,
                log=log,
                paced=args.paced,
            )
        finally:
            for p in reversed(procs):
                p.terminate(15)
    results["load average at end"] = load_average()
    results["native"] = native
    sat = native["saturation"]
    empty = sat["e"]["rps"]
    print(f"load average: {results['load average at start']} (start), "
          f"{results['load average at end']} (end)")  # fmt: skip
    print(f"{'scenario':34} {'calls/s':>10} {'CPU us/call':>12} {'x (e) calls/s':>14}")
    for key, r in sat.items():
        us = "n/a" if r["cpu_per_10k"] is None else f"{r['cpu_per_10k'] * 100:.2f}"
        ratio = f"{r['rps'] / empty:.2f}" if empty else "n/a"
        print(f"{NAMES[key]:34} {r['rps']:>10,.0f} {us:>12} {ratio:>14}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
