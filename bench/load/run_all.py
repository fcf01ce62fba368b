"""Every load benchmark in one invocation; writes bench/results/load.md.

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
  the pinned-core section (bench/load/native_bench.py): (a), (b), (c), an empty native server (e)
  and ratelimitd on grpc.aio (f), each pinned to one core and driven by h2load on the other;
  then bench/load/keyspace.py: distinct values over key spaces of 1 to 1M, Redis and Valkey
  with their servers' CPU, unknown domains, one worker against two, Envoy-driven runs
  (saturated, trickled, paced at half saturation), instructions per call under callgrind,
  and that section's targets with the gap of each one missed (servers of its own).

    .venv/bin/python bench/load/run_all.py            # full: a few minutes
    .venv/bin/python bench/load/run_all.py --quick    # smoke: about a minute

This script starts and measures; bench/load/load_report.py renders the results.
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

from grpc_load import Load, LoadResult, combine, measure, request_bytes
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
from keyspace import render as render_keyspace
from keyspace import run as run_keyspace
from load_report import NAMES, render
from native_bench import run_native
from support.envoy_server import envoy_binary
from support.machine import machine_info as support_machine_info
from support.machine import version
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

        # The native transport on one pinned core, driven by h2load (C).
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
                        Load(
                            server.grpc_target,
                            payload,
                            plan.requests,
                            plan.concurrency,
                            plan.channels,
                        ),
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
            requests = max(500, int(rate * plan.paced_seconds))
            r = measure(
                Load(server.grpc_target, payload, requests, plan.concurrency, plan.channels, rate),
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
            requests = int(rate * (seconds + 2))
            measure(
                Load(servers[key].grpc_target, payload, requests, plan.concurrency, plan.channels)
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
    if not args.no_keyspace:
        results["keyspace"] = run_keyspace(workdir, args.quick, log)
    results["machine"]["load average at end"] = " ".join(
        Path("/proc/loadavg").read_text().split()[:3]
    )
    return results


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
    parser.add_argument("--no-keyspace", action="store_true", help="skip keyspace.py's section")
    parser.add_argument(
        "--daemon-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for every ratelimitd (e.g. REDIS_PIPELINE_WINDOW=150us)",
    )
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "load.md")
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("bench/.results/load.json"),
        help="the raw results, written before the report is rendered (re-render from them)",
    )
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
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    argv = [".venv/bin/python", "bench/load/run_all.py", *sys.argv[1:]]
    text = render(results, shlex.join(argv), started, elapsed)
    if "keyspace" in results:
        text = text.rstrip("\n") + "\n\n" + render_keyspace(results["keyspace"])
    args.output.write_text(text)
    log(f"wrote {args.output} ({elapsed:.0f} s)")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
