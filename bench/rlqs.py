"""Envoy's throughput with the rate_limit_quota filter (RLQS, ratelimitd assigning) against
the same Envoy with no rate limiting at all, side by side in one run; writes
bench/results/rlqs.md and bench/results/rlqs.json.

Two stock Envoys (`--concurrency 1`, support.envoy_rlqs) on free ports: one with the filter
reporting to a ratelimitd (memory backend) whose rule allows far more than the run sends,
one with no filter. wrk drives each in turn, interleaved rounds of the same length, after a
warm-up that lets the quota filter's demand reach the server (its first assignment is
sized from one request; the next reports show the real demand). Non-2xx answers are counted:
a run that was throttled would not measure the filter's cost.

    .venv/bin/python bench/rlqs.py [--seconds 10] [--rounds 3] [--connections 32]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

from support.daemon import daemon_environment, start_daemon, write_config
from support.envoy_rlqs import DOMAIN, rules, start_envoy_rlqs
from support.machine import describe, load_average, machine_info, version
from support.process import Proc
from support.wrk import run_wrk

HERE = Path(__file__).resolve().parent
RULES = rules(1_000_000_000, "hour")  # a limit the run never reaches
# Long enough for two report periods (Envoy reports every 5 s): the demand is known.
WARM_UP_SECONDS = 12


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    info = machine_info()
    from support.envoy_server import envoy_binary

    info["envoy"] = version([envoy_binary(), "--version"]).rpartition("version: ")[2]
    info["wrk"] = version(["wrk", "--version"])
    started = time.time()
    procs: list[Proc] = []
    results: dict[str, list[dict[str, float]]] = {"rlqs": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="rlqs-bench-") as tmp:
        workdir = Path(tmp)
        try:
            env = daemon_environment(
                workdir / "runtime",
                BACKEND_TYPE="memory",
                LOG_LEVEL="warning",
                RLQS_BUCKET_KEYS="name,user",
            )
            write_config(env, "rlqs.yaml", RULES)
            daemon = start_daemon(env, workdir)
            procs.append(daemon)
            envoys = {
                "rlqs": start_envoy_rlqs(workdir, daemon.grpc_port),
                "plain": start_envoy_rlqs(workdir, None),
            }
            procs.extend(envoys.values())
            headers = {"x-user": "bench"}
            urls = {name: f"http://127.0.0.1:{e.port}/" for name, e in envoys.items()}
            print(f"warm-up {WARM_UP_SECONDS}s", file=sys.stderr)
            run_wrk(urls["rlqs"], WARM_UP_SECONDS, args.connections, headers=headers)
            run_wrk(urls["plain"], 2, args.connections, headers=headers)
            for r in range(args.rounds):
                # Each round in the other order, so drift on the shared machine hits both.
                for name in ("rlqs", "plain") if r % 2 == 0 else ("plain", "rlqs"):
                    print(f"round {r + 1}: {name}", file=sys.stderr)
                    out = run_wrk(urls[name], args.seconds, args.connections, headers=headers)
                    results[name].append(out)
            quota = daemon.stats()
        finally:
            for proc in reversed(procs):
                proc.close()
    info["load average at end"] = load_average()
    write(args, info, results, quota, time.time() - started)
    return 0


def write(
    args: argparse.Namespace,
    info: dict[str, object],
    results: dict[str, list[dict[str, float]]],
    quota: dict[str, float],
    elapsed: float,
) -> None:
    def rps(name: str) -> float:
        runs = results[name]
        return sum(r["requests"] for r in runs) / sum(r["seconds"] for r in runs)

    ratio = rps("rlqs") / rps("plain")
    bucket = f"ratelimit.rlqs.bucket.{DOMAIN}.name_api.user_bench."
    payload = {
        "machine": info,
        "arguments": vars(args),
        "rounds": results,
        "rps": {"rlqs": rps("rlqs"), "plain": rps("plain")},
        "ratio": ratio,
        "quota": {k.removeprefix(bucket): v for k, v in quota.items() if k.startswith(bucket)},
    }
    (HERE / "results" / "rlqs.json").write_text(json.dumps(payload, indent=2) + "\n")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# RLQS: Envoy's throughput with the quota filter",
        "",
        f"Generated {now} in {elapsed / 60:.1f} min by:",
        "",
        "```",
        ".venv/bin/python bench/rlqs.py "
        f"--seconds {args.seconds:g} --rounds {args.rounds} --connections {args.connections}",
        "```",
        "",
        "Envoy 1.40 (`--concurrency 1`) with the `rate_limit_quota` filter, ratelimitd assigning "
        "its token buckets (memory backend, a limit the run never reaches), against the same "
        "Envoy with no rate limiting at all; wrk (1 thread, "
        f"{args.connections} connections) against each in turn, {args.rounds} interleaved "
        f"rounds (the order alternating) of {args.seconds:g} s after a {WARM_UP_SECONDS} s "
        "warm-up. Everything shares the machine's cores with other work (load averages "
        "below): quote the ratio, measured in this one run, not the absolute figures.",
        "",
        "| Envoy | requests/s | non-2xx | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in (("plain", "no rate limiting"), ("rlqs", "rate_limit_quota (RLQS)")):
        runs = results[name]
        non2xx = int(sum(r["non2xx"] for r in runs))
        p50 = sum(r["p50_ms"] for r in runs) / len(runs)
        p99 = sum(r["p99_ms"] for r in runs) / len(runs)
        lines.append(f"| {label} | {rps(name):,.0f} | {non2xx} | {p50:.2f} | {p99:.2f} |")
    lines += [
        "",
        f"**RLQS ÷ no limiting: {ratio:.3f}×** (target ≥ 0.95×: the filter enforces a local "
        "token bucket; the service is off the request path).",
        "",
        "Per round (requests/s): "
        + "; ".join(
            f"{r + 1}: RLQS {results['rlqs'][r]['rps']:,.0f} vs {results['plain'][r]['rps']:,.0f}"
            for r in range(args.rounds)
        )
        + ".",
        "",
        "What ratelimitd saw of the bucket over the whole run (warm-up included): "
        + ", ".join(f"{k} {v:g}" for k, v in payload["quota"].items())  # type: ignore[union-attr]
        + ".",
        "",
        "## Machine",
        "",
        *describe(info),
        "",
    ]
    (HERE / "results" / "rlqs.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
