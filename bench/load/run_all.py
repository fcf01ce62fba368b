"""Every load benchmark of issues 6 and 13 in one invocation; writes bench/results/load.md.

Started side by side (all idle while another is measured), then measured in interleaved rounds
so drift on this shared machine hits every scenario alike:

  gRPC ShouldRateLimit, one descriptor (bench/load/grpc_load.py, closed loop):
    (a) the empty grpc.aio server (bench/load/empty_server.py): the transport ceiling
    (b) ratelimitd, memory backend
    (c) ratelimitd, Redis backend (a redis-server of its own on a free port)
    (d) ratelimitd, RATELIMITD_WORKERS=2, memory backend
  then each paced at half of its own saturation throughput, for p99;
  /json over HTTP/1.1 with wrk against (b), (c), (d), and (a)'s fixed-reply HTTP server;
  Envoy -> ratelimitd (c) -> Redis with wrk, against Envoy with no rate-limit call;
  a cProfile of (c) under load from the daemon's debug endpoint (top five by own time);
  issue 13's section (bench/load/native_bench.py): (a), (b), (c), an empty native server (e)
  and ratelimitd on grpc.aio (f), each pinned to one core and driven by h2load on the other.

    .venv/bin/python bench/load/run_all.py            # full: a few minutes
    .venv/bin/python bench/load/run_all.py --quick    # smoke: about a minute
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpc_load import LoadResult, combine, measure, request_bytes
from harness import (
    DESCRIPTOR,
    DOMAIN,
    EmptyNativeServer,
    redis_delta,
    start_bench_daemon,
    start_bench_envoy,
    start_empty_server,
    start_redis,
)
from native_bench import native_targets, render_native, run_native
from support.envoy_server import envoy_binary
from support.machine import describe, version
from support.machine import machine_info as support_machine_info
from support.process import REPO, Proc, start_bound
from support.ready import wait_for
from support.redis_server import RedisServer
from support.wrk import run_wrk

JSON_BODY = json.dumps(
    {
        "domain": DOMAIN,
        "descriptors": [{"entries": [{"key": k, "value": v} for k, v in DESCRIPTOR]}],
    }
).encode()
NAMES = {
    "a": "(a) empty grpc.aio server",
    "b": "(b) ratelimitd (native gRPC), memory",
    "c": "(c) ratelimitd (native gRPC), Redis",
    "d": "(d) ratelimitd (native gRPC), 2 workers, memory",
}


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_info() -> dict[str, object]:
    """What the numbers were measured on (support.machine) plus Envoy's and wrk's versions."""
    info = support_machine_info()
    try:
        info["envoy"] = version([envoy_binary(), "--version"]).rpartition("version: ")[2]
    except AssertionError:
        info["envoy"] = "not installed"
    info["wrk"] = version(["wrk", "--version"])
    return info


def cpu_of(*procs: Proc) -> Callable[[], float]:
    """A CPU-seconds probe over the process trees of `procs`."""
    return lambda: sum(p.cpu() for p in procs)


def redis_probe(redis: RedisServer | None) -> Callable[[], tuple[int, int]] | None:
    """(writes, commands) so far on `redis`, or None without Redis."""
    if redis is None:
        return None
    return lambda: redis_delta({}, redis.commandstats())


def wrk_measure(
    url: str,
    body: bytes | None,
    seconds: float,
    procs: dict[str, Proc],
    redis: RedisServer | None,
    warmup: float = 0.0,
) -> dict[str, Any]:
    """One wrk -t1 -c32 run (POST `body` as JSON, or GET) with CPU (per named process tree)
    and Redis deltas around it."""
    headers = {"Content-Type": "application/json"} if body is not None else None
    if warmup:
        run_wrk(url, warmup, headers=headers, body=body)
    cpu0 = {name: p.cpu() for name, p in procs.items()}
    r0 = redis_delta({}, redis.commandstats()) if redis else (0, 0)
    out: dict[str, Any] = run_wrk(url, seconds, headers=headers, body=body)
    cpu1 = {name: p.cpu() for name, p in procs.items()}
    r1 = redis_delta({}, redis.commandstats()) if redis else (0, 0)
    n = out["requests"]
    out["cpu_per_10k"] = {name: (cpu1[name] - cpu0[name]) / n * 10_000 for name in procs}
    if redis is not None:
        out["redis_writes_per_decision"] = (r1[0] - r0[0]) / n
        out["redis_commands_per_decision"] = (r1[1] - r0[1]) / n
    return out


PROFILE_ROW = re.compile(
    r"^\s*(?P<ncalls>[\d/]+)\s+(?P<tottime>[\d.]+)\s+[\d.]+\s+(?P<cumtime>[\d.]+)\s+[\d.]+\s+"
    r"(?P<where>.+)$"
)


def top_costs(report: str, n: int = 5) -> dict[str, Any]:
    """The `n` functions with the most own time in a pstats report: overall and ours only."""
    rows: list[dict[str, Any]] = []
    # Longest first: site-packages lies inside the venv's lib directory.
    prefixes = sorted({str(REPO), *sysconfig.get_paths().values()}, key=len, reverse=True)
    for line in report.splitlines():
        m = PROFILE_ROW.match(line)
        if m:
            where = m["where"]
            for prefix in prefixes:
                where = where.replace(prefix + "/", "")
            rows.append(
                {
                    "where": where,
                    "ncalls": m["ncalls"],
                    "tottime": float(m["tottime"]),
                    "cumtime": float(m["cumtime"]),
                }
            )
    total = sum(float(r["tottime"]) for r in rows) or 1.0
    rows.sort(key=lambda r: r["tottime"], reverse=True)
    for r in rows:
        r["share"] = r["tottime"] / total
    return {
        "top": rows[:n],
        "top_ratelimitd": [r for r in rows if r["where"].startswith("ratelimitd/")][:n],
        "total_s": total,
    }


class Plan:
    """Sizes of every run: --quick shrinks them all."""

    def __init__(self, args: argparse.Namespace) -> None:
        quick = args.quick
        self.requests = args.requests or (6_000 if quick else 30_000)
        self.rounds = args.rounds or (1 if quick else 3)
        self.paced_seconds = 3.0 if quick else 8.0
        self.wrk_seconds = args.wrk_seconds or (3.0 if quick else 10.0)
        self.wrk_warmup = 0.0 if quick else 2.0
        self.profile_seconds = 3 if quick else 6
        self.h2load_seconds = 5.0 if quick else 15.0
        self.concurrency = args.concurrency
        self.channels = args.channels


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Start everything, measure everything; the raw results."""
    plan = Plan(args)
    results: dict[str, Any] = {"machine": machine_info(), "notes": [], "plan": vars(plan)}
    extra = dict(kv.split("=", 1) for kv in args.daemon_env)
    procs: list[Proc] = []
    try:
        redis: RedisServer | None = None
        try:
            redis = start_redis(workdir)
            procs.append(redis)
            results["machine"]["redis-server"] = f"{redis.version()} (INFO server)"
        except AssertionError as exc:
            results["notes"].append(f"(c) skipped: no redis-server ({exc})")

        log("starting (a) empty server, (b) memory, (c) redis, (d) 2 workers")
        servers: dict[str, Any] = {"a": start_empty_server(workdir)}
        procs.append(servers["a"])
        servers["b"] = start_bench_daemon("memory", workdir, **extra)
        procs.append(servers["b"])
        if redis is not None:
            try:
                redis_env = {
                    "BACKEND_TYPE": "redis",
                    "REDIS_SOCKET_TYPE": "tcp",
                    "REDIS_URL": redis.address,
                    **extra,
                }
                servers["c"] = start_bench_daemon("redis", workdir, **redis_env)
                procs.append(servers["c"])
            except AssertionError as exc:
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                results["notes"].append(
                    "(c) skipped: ratelimitd with BACKEND_TYPE=redis did not start: "
                    + (lines[-1] if lines else "?")
                )
        workers = start_bench_daemon("workers", workdir, RATELIMITD_WORKERS="2", **extra)
        procs.append(workers)
        servers["d"] = workers
        wait_for(lambda: len(workers.worker_pids()) >= 2, what="2 workers")

        payload = request_bytes(DOMAIN, DESCRIPTOR)
        redis_for = {k: (redis if k == "c" else None) for k in servers}

        # Issue 13: the native transport on one pinned core, driven by h2load (C).
        if not args.no_h2load:
            log("starting (e) empty native server, (f) ratelimitd on grpc.aio")
            pinned = {"a": servers["a"], "b": servers["b"], "c": servers.get("c")}
            pinned["e"] = start_bound(lambda: EmptyNativeServer(workdir))
            procs.append(pinned["e"])
            pinned["f"] = start_bench_daemon("grpcio", workdir, GRPC_TRANSPORT="grpcio", **extra)
            procs.append(pinned["f"])
            results["native"] = run_native(
                {k: v for k, v in pinned.items() if v is not None},
                payload,
                seconds=plan.h2load_seconds,
                rounds=plan.rounds,
                paced_seconds=plan.h2load_seconds,
                log=log,
            )

        # Saturation, interleaved rounds.
        runs: dict[str, list[LoadResult]] = {k: [] for k in servers}
        for rnd in range(plan.rounds):
            for key, server in servers.items():
                log(f"gRPC round {rnd + 1}/{plan.rounds}: {NAMES[key]}")
                runs[key].append(
                    measure(
                        server.grpc_target,
                        payload,
                        requests=plan.requests,
                        concurrency=plan.concurrency,
                        channels=plan.channels,
                        cpu=cpu_of(server),
                        redis_stats=redis_probe(redis_for[key]),
                    )
                )
        grpc_results = {k: combine(v) for k, v in runs.items()}
        results["grpc"] = {k: r.summary() for k, r in grpc_results.items()}

        # Paced at half of each one's saturation throughput.
        results["paced"] = {}
        for key, server in servers.items():
            rate = grpc_results[key].rps / 2
            log(f"gRPC paced at {rate:.0f}/s: {NAMES[key]}")
            r = measure(
                server.grpc_target,
                payload,
                requests=max(500, int(rate * plan.paced_seconds)),
                concurrency=plan.concurrency,
                channels=plan.channels,
                rate=rate,
                cpu=cpu_of(server),
                redis_stats=redis_probe(redis_for[key]),
            )
            results["paced"][key] = r.summary()

        # /json over HTTP/1.1 with wrk.
        results["json"] = {}
        for key in ("a", "b", "c", "d"):
            if key not in servers:
                continue
            server = servers[key]
            log(f"/json with wrk: {NAMES[key]}")
            results["json"][key] = wrk_measure(
                f"http://127.0.0.1:{server.http_port}/json",
                JSON_BODY,
                plan.wrk_seconds,
                {"server": server},
                redis_for[key],
                plan.wrk_warmup,
            )

        # Envoy with and without the rate-limit call.
        rls_key = "c" if "c" in servers else "b"
        rls = servers[rls_key]
        limited = start_bench_envoy(workdir, rls.grpc_port)
        procs.append(limited)
        plain = start_bench_envoy(workdir, None)
        procs.append(plain)
        results["envoy"] = {"rls": NAMES[rls_key]}
        for name, envoy in (("ratelimited", limited), ("plain", plain)):
            log(f"Envoy with wrk: {name}")
            before = envoy.stats().get("cluster.backend.ratelimit.ok", 0)
            named: dict[str, Proc] = {"envoy": envoy}
            if envoy is limited:
                named["ratelimitd"] = rls
            out = wrk_measure(
                f"http://127.0.0.1:{envoy.port}/",
                None,
                plan.wrk_seconds,
                named,
                redis if (envoy is limited and rls_key == "c") else None,
                plan.wrk_warmup,
            )
            out["rls_ok"] = envoy.stats().get("cluster.backend.ratelimit.ok", 0) - before
            results["envoy"][name] = out

        # A profile of the Redis path under load (not part of any figure above).
        if not args.no_profile:
            key = "c" if "c" in servers else "b"
            prof: dict[str, str] = {}
            seconds = plan.profile_seconds

            def take() -> None:
                prof["report"] = servers[key].profile(seconds)

            log(f"profiling {NAMES[key]} for {seconds} s under load")
            t = threading.Thread(target=take)
            t.start()
            rate = grpc_results[key].rps
            measure(
                servers[key].grpc_target,
                payload,
                requests=int(rate * (seconds + 2)),
                concurrency=plan.concurrency,
                channels=plan.channels,
            )
            t.join(120)
            results["profile"] = {
                "scenario": NAMES[key],
                "seconds": seconds,
                **top_costs(prof.get("report", "")),
            }
    finally:
        for p in reversed(procs):
            p.terminate(15)
    results["machine"]["load average at end"] = " ".join(
        Path("/proc/loadavg").read_text().split()[:3]
    )
    return results


def _f(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def render(results: dict[str, Any], command: str, started: str, elapsed: float) -> str:
    """bench/results/load.md."""
    g = results["grpc"]
    base = g["a"]
    out = [
        "# Load benchmarks",
        "",
        f"Generated {started} in {elapsed / 60:.1f} min by:",
        "",
        "```",
        command,
        "```",
        "",
        "**Caveat:** the load generator, the servers (and Envoy, wrk, redis-server) share the",
        "machine's cores, and other work ran on this shared VM at the same time (see the load",
        "average below). Absolute requests/s and latencies move by ±20 % or more from run to run;",
        "quote the ratios measured within this one run, and prefer server CPU seconds per",
        "10 000 decisions (from /proc utime+stime of the server's process tree) over requests/s.",
        "",
        "## Machine",
        "",
        *describe(results["machine"]),
        "",
    ]
    notes = [
        *results["notes"],
        "(d) runs two worker processes sharing the ports (SO_REUSEPORT); on the memory backend "
        "each worker keeps its own counters. Its CPU is the supervisor's and both workers'.",
        "Every ratelimitd serves one rule (generic_key=bench, 10^9 per hour), so every "
        "decision is OK and every decision touches the backend.",
        "Every ratelimitd runs with DISABLE_STATS=true (no stats sink; counters still kept) "
        "and otherwise default settings, e.g. REDIS_REQUEST_TIMEOUT=50ms: a decision whose "
        "Redis reply takes longer fails with UNKNOWN and is counted under *failed*.",
    ]
    out += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    plan = results["plan"]
    out += [
        "## gRPC ShouldRateLimit, one descriptor (saturation)",
        "",
        f"`bench/load/grpc_load.py`: grpc.aio client on uvloop, {plan['concurrency']} concurrent "
        f"calls over {plan['channels']} channels, {plan['rounds']} interleaved round(s) of "
        f"{plan['requests']:,} requests per scenario (after a warm-up).",
        "",
        "| scenario | answered | failed | req/s | p50 ms | p99 ms | p99.9 ms "
        "| server CPU s / 10k | CPU ÷ (a) | req/s ÷ (a) | Redis writes / decision "
        "| Redis commands / decision |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in g.items():
        cpu_ratio = r["cpu_per_10k"] / base["cpu_per_10k"] if base["cpu_per_10k"] else None
        out.append(
            f"| {NAMES[key]} | {r['requests']:,} | {r['errors']:,} | {r['rps']:,.0f} "
            f"| {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {_f(r['cpu_per_10k'], '{:.2f}')} "
            f"| {_f(cpu_ratio, '{:.2f}×')} | {r['rps'] / base['rps']:.2f}× "
            f"| {_f(r['redis_writes_per_decision'], '{:.2f}')} "
            f"| {_f(r['redis_commands_per_decision'], '{:.2f}')} |"
        )
    failures = [
        f"- {NAMES[key]}{' (paced)' if run == 'paced' else ''}: {n:,} × `{code}`"
        for run in ("grpc", "paced")
        for key, r in results[run].items()
        for code, n in r["error_codes"].items()
    ]
    if failures:
        out += ["", "Failed calls by status:", "", *failures]
    out += [
        "",
        "## p99 at half of saturation throughput (gRPC, paced)",
        "",
        "Open loop: call k is due at start + k / rate; latency is send-to-reply. The Python "
        "generator shares the cores with the server: where even the empty server's p99 is "
        "high, the generator and the machine, not the server, set these figures.",
        "",
        "| scenario | target req/s | achieved req/s | failed | p50 ms | p99 ms | p99.9 ms "
        "| server CPU s / 10k |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in results["paced"].items():
        out.append(
            f"| {NAMES[key]} | {r['target_rps']:,.0f} | {r['rps']:,.0f} | {r['errors']:,} "
            f"| {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {_f(r['cpu_per_10k'], '{:.2f}')} |"
        )
    wrk_conn = "wrk -t1 -c32"
    out += [
        "",
        "## /json over HTTP/1.1 (wrk)",
        "",
        f"`{wrk_conn} -d{plan['wrk_seconds']:.0f}s` POSTing the same one-descriptor request "
        "as JSON (Lua script generated by the runner). (a) answers a fixed OK body from the "
        "daemon's own HTTP/1.1 server (`ratelimitd.transport.http`): the /json ceiling.",
        "",
        "| scenario | requests | req/s | p50 ms | p99 ms | p99.9 ms | non-2xx / errors "
        "| server CPU s / 10k | CPU ÷ (a) | req/s ÷ (a) | req/s ÷ same process's gRPC req/s "
        "| Redis writes / decision |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    j0 = results["json"]["a"]
    for key, r in results["json"].items():
        cpu = r["cpu_per_10k"]["server"]
        name = "(a) empty server, fixed /json reply" if key == "a" else NAMES[key]
        out.append(
            f"| {name} | {r['requests']:,} | {r['rps']:,.0f} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {r['non2xx']} / {r['errors']} "
            f"| {cpu:.2f} | {cpu / j0['cpu_per_10k']['server']:.2f}× "
            f"| {r['rps'] / j0['rps']:.2f}× | {r['rps'] / g[key]['rps']:.2f}× "
            f"| {_f(r.get('redis_writes_per_decision'), '{:.2f}')} |"
        )
    e = results["envoy"]
    out += [
        "",
        "## Envoy → ratelimitd → Redis vs Envoy with no rate-limit call (wrk)",
        "",
        f"Envoy 1.40 `--concurrency 1`; `{wrk_conn} -d{plan['wrk_seconds']:.0f}s` GET /; the "
        f"rate-limited listener calls {e['rls']} once per request (generic_key descriptor, "
        "`failure_mode_deny: true`); the upstream is a direct_response listener of the same "
        "Envoy.",
        "",
        "| Envoy | requests | req/s | p50 ms | p99 ms | p99.9 ms | non-2xx / errors "
        "| RLS calls ok | Envoy CPU s / 10k | ratelimitd CPU s / 10k | Redis writes / request |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("ratelimited", "plain"):
        r = e[name]
        out.append(
            f"| {'with rate limit' if name == 'ratelimited' else 'no rate-limit call'} "
            f"| {r['requests']:,} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {r['p999_ms']:.2f} | {r['non2xx']} / {r['errors']} | {r['rls_ok']:,} "
            f"| {r['cpu_per_10k']['envoy']:.2f} "
            f"| {_f(r['cpu_per_10k'].get('ratelimitd'), '{:.2f}')} "
            f"| {_f(r.get('redis_writes_per_decision'), '{:.2f}')} |"
        )
    out.append("")
    out.append(
        f"Throughput with the rate-limit call: "
        f"{e['ratelimited']['rps'] / e['plain']['rps']:.2f}× of Envoy without it."
    )
    out += ["", "## Targets (issue 6)", "", "| target | measured | met |", "|---|---|---|"]
    for target, measured, met in targets(results):
        out.append(f"| {target} | {measured} | {met} |")
    native = results.get("native")
    if native:
        out += ["", *render_native(native)]
        out += ["## Targets (issue 13)", "", "| target | measured | met |", "|---|---|---|"]
        for target, measured, met in native_targets(native, results.get("envoy")):
            out.append(f"| {target} | {measured} | {met} |")
    prof = results.get("profile")
    if prof:
        out += [
            "",
            f"## Profile: {prof['scenario']} under gRPC load",
            "",
            f"cProfile of the daemon's event-loop thread for {prof['seconds']} s "
            "(`/debug/pprof/profile`), ranked by own time; the second table keeps only "
            "ratelimitd's own functions. cProfile adds overhead per Python call, sees only "
            "Python frames of the event-loop thread (not grpc's C core) and counts each "
            f"resumption of a coroutine as a call. Own time profiled: {prof['total_s']:.2f} s.",
            "",
        ]
        for title, key in (("All functions", "top"), ("ratelimitd only", "top_ratelimitd")):
            out += [
                f"{title}:",
                "",
                "| # | function | calls | own s | share of own time | cumulative s |",
                "|---:|---|---:|---:|---:|---:|",
            ]
            for i, row in enumerate(prof[key], 1):
                out.append(
                    f"| {i} | `{row['where']}` | {row['ncalls']} | {row['tottime']:.3f} "
                    f"| {row['share']:.0%} | {row['cumtime']:.3f} |"
                )
            out.append("")
    out.append("")
    return "\n".join(out)


def targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, met) rows for the issue's targets."""
    g = results["grpc"]
    rows = []

    def ratio(key: str) -> float | None:
        if key not in g or not g["a"]["cpu_per_10k"]:
            return None
        return float(g[key]["cpu_per_10k"] / g["a"]["cpu_per_10k"])

    for key, limit, label in (("b", 1.10, "memory"), ("c", 1.25, "Redis")):
        r = ratio(key)
        rows.append(
            (
                f"server CPU per decision, {label} ≤ {limit:.2f}× empty server",
                _f(r, "{:.2f}×"),
                "n/a" if r is None else ("yes" if r <= limit else "no"),
            )
        )
    paced = results["paced"].get("c")
    rows.append(
        (
            "p99 at half of saturation, Redis ≤ 5 ms",
            "n/a"
            if paced is None
            else f"{paced['p99_ms']:.2f} ms (empty server: "
            f"{results['paced']['a']['p99_ms']:.2f} ms at half its saturation)",
            "n/a" if paced is None else ("yes" if paced["p99_ms"] <= 5 else "no"),
        )
    )
    for key in ("b", "c"):
        j = results["json"].get(key)
        if j is None:
            continue
        x = j["rps"] / g[key]["rps"]
        rows.append(
            (
                f"/json decisions/s ≥ 2× gRPC decisions/s, {NAMES[key]}",
                f"{x:.2f}×",
                "yes" if x >= 2 else "no",
            )
        )
    return rows


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    parser.add_argument("--requests", type=int, help="gRPC requests per scenario per round")
    parser.add_argument("--rounds", type=int, help="interleaved gRPC rounds")
    parser.add_argument("--wrk-seconds", type=float, help="duration of each wrk run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--no-h2load", action="store_true", help="skip the h2load section")
    parser.add_argument(
        "--daemon-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for every ratelimitd (e.g. REDIS_PIPELINE_WINDOW=150us)",
    )
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "load.md")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, configs)")
    args = parser.parse_args()

    try:
        envoy_binary()
    except AssertionError as exc:
        parser.error(str(exc))
    if shutil.which("wrk") is None:
        parser.error("missing wrk (apt-get install wrk)")
    if shutil.which("redis-server") is None:
        log("no redis-server: (c) will be skipped (apt-get install redis-server)")
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="ratelimitd-load-"))
    try:
        results = run(args, workdir)
    except BaseException:
        log(f"failed; logs kept in {workdir}")
        raise
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        log(f"work dir: {workdir}")
    elapsed = time.monotonic() - t0
    argv = [".venv/bin/python", "bench/load/run_all.py", *sys.argv[1:]]
    text = render(results, shlex.join(argv), started, elapsed)
    args.output.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    log(f"wrote {args.output} ({elapsed:.0f} s)")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
