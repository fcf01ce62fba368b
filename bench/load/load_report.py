"""bench/results/load.md from the raw results of bench/load/run_all.py: the scenario names,
the tables of every section (saturation, paced, /json, Envoy, the pinned-core native section via
native_bench.render_native, the profile) and the targets, met or not.

Imported by run_all.py.
"""

from __future__ import annotations

from typing import Any

from native_bench import native_targets, render_native
from support.machine import describe

# The scenarios, as the report and run_all.py's progress log name them.
NAMES = {
    "a": "(a) empty grpc.aio server",
    "b": "(b) ratelimitd (native gRPC), memory",
    "c": "(c) ratelimitd (native gRPC), Redis",
    "d": "(d) ratelimitd (native gRPC), 2 workers, memory",
}


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
    out += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for target, measured, met in targets(results):
        out.append(f"| {target} | {measured} | {met} |")
    native = results.get("native")
    if native:
        out += ["", *render_native(native)]
        out += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
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
