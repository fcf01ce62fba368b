"""Latency of the queries apps make, on a Carris-Metropolitana-shaped deployment: the real CM
stops.txt (12,580 stops), CM-style lines and about 860,000 stop_times (make_feed.py), 1,024
vehicles on its trips (GTFS-RT, CM's `41|1160` ids), served by gunicorn with 2 uvicorn
workers, as `python -m sidecars.transit` runs it.

    .venv/bin/python bench/transit/queries.py            # ~3 minutes
    .venv/bin/python bench/transit/queries.py --quick    # smoke: 2 s per endpoint
    .venv/bin/python bench/transit/queries.py --only arrivals,vehicles --out ...  # a subset
    .venv/bin/python bench/transit/queries.py --before d421260   # and that revision, side by side

wrk -t2 -c16 on each endpoint (after a 2 s warm-up), `--rounds` times: median requests/s, p50
and p99; the RSS of each worker once loaded and after the load; the load average before and
after (the machine is shared: other work competes for the same 2 cores, and wrk shares them
with the server). With `--before REV`, that revision (a temporary git worktree) is served from
the same data at the same time, and each endpoint's rounds alternate between the two servers,
so the ratios compare like with like on a shared machine. Results:
bench/results/transit_queries.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scale.py beside this file

from scale import REPO, git, heading, serve, worker_rss_mb
from support.machine import SIDECAR_PACKAGES, describe, machine_info
from support.wrk import run_wrk

# The project's shared data sits beside the checkout (or beside the worktrees' folder).
CM_STOPS = next(
    (
        d / "shared/data/gtfs/carrismetropolitana_partial/stops.txt"
        for d in (REPO.parent, REPO.parent.parent)
        if (d / "shared/data/gtfs/carrismetropolitana_partial/stops.txt").is_file()
    ),
    REPO.parent / "shared/data/gtfs/carrismetropolitana_partial/stops.txt",
)
NOW = "2026-03-24T08:00:00+00:00"  # a Tuesday, 08:00 in Lisbon
OUT = REPO / "bench" / "results" / "transit_queries"
# Gare do Oriente, Lisbon: a dense part of the network.
NEAR = (38.7678, -9.0990)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def make_data(tmp: Path, stops_file: Path) -> tuple[Path, Path]:
    """The CM-shaped feed and its vehicles."""
    feed, vehicles = tmp / "cm.zip", tmp / "cm_vp.pb"
    subprocess.run(
        [sys.executable, str(REPO / "bench/transit/network/make_feed.py"), str(feed),
         "--stops-file", str(stops_file), "--lines", "760", "--trips-per-route", "15",
         "--stops-per-trip", "38", "--vehicles", "1024", str(vehicles), "--now", NOW],
        check=True,
    )  # fmt: skip
    return feed, vehicles


def cases(base: str) -> dict[str, str]:
    """The endpoints, with a busy stop (most patterns) for the arrivals."""
    stops = httpx.get(base + "/v2/stops", timeout=60).json()
    busiest = max(stops, key=lambda s: len(s["pattern_ids"]))["id"]
    vehicle = httpx.get(base + "/v2/vehicles", timeout=60).json()[0]
    lat, lon = NEAR
    paths = [
        f"/v2/stops?lat={lat}&lon={lon}&radius=300",
        f"/v2/stops?lat={lat}&lon={lon}&radius=1000",
        f"/v2/arrivals/by_stop/{busiest}",
        f"/v2/arrivals/by_stop/{busiest}?limit=10",
        "/v2/vehicles",
        f"/v2/vehicles?line_id={vehicle['line_id']}",
        f"/v2/vehicles/{vehicle['id']}",
    ]
    out = {f"GET {path}": path for path in paths}
    out["GET /v2/stops (all, gzip)"] = "/v2/stops"
    return out


def measure(
    bases: dict[str, str], seconds: int, rounds: int, only: list[str] | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """wrk on each case (`only`: the cases whose name contains one of these words), per
    server in `bases` (label -> base URL), the servers' rounds alternating."""
    out: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in bases}
    first = next(iter(bases.values()))
    for name, path in cases(first).items():
        if only and not any(word in name for word in only):
            continue
        headers = {"Accept-Encoding": "gzip"} if "gzip" in name else None
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in bases}
        for base in bases.values():
            run_wrk(base + path, 2, connections=16, threads=2, headers=headers)  # warm-up
        for n in range(rounds):
            # Each round in the other order: neither server always runs right after the other.
            order = list(bases.items())
            for label, base in order if n % 2 == 0 else order[::-1]:
                r = run_wrk(base + path, seconds, connections=16, threads=2, headers=headers)
                runs[label].append(
                    {k: round(r[k], 2) for k in ("rps", "p50_ms", "p99_ms", "non2xx")}
                )
                print(f"    {label} {name}: {runs[label][-1]}", flush=True)
        for label, base in bases.items():
            sizes = httpx.get(base + path, timeout=60)
            body = sizes.json()
            out[label][name] = {
                **{
                    k: round(statistics.median(r[k] for r in runs[label]), 2)
                    for k in ("rps", "p50_ms", "p99_ms")
                },
                "non2xx": sum(r["non2xx"] for r in runs[label]),
                "body_bytes": len(sizes.content),
                "items": len(body) if isinstance(body, list) else 1,
                "rounds": runs[label],
            }
    return out


def render(results: dict[str, Any]) -> str:
    lines = [
        *heading(
            "Transit API: queries on a CM-shaped deployment (bench/transit/queries.py)", results
        ),
        f"Feed: {results['feed']}. gunicorn, 2 uvicorn workers; wrk -t2 -c16, medians of "
        f"{results['rounds']} rounds of {results['seconds']} s. **Shared machine**: load "
        f"average {results['load_before']} before, {results['load_after']} after (2 cores, "
        "wrk on the same cores as the server): compare within this table, not across runs.",
        "",
        *describe(results["machine"]),
        "",
        "| endpoint | items | body bytes | req/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    before = results.get("before")
    if before:
        lines[-2:] = [
            f"| endpoint | items | body bytes | req/s | p50 ms | p99 ms | before ({before}): "
            "req/s, p50, p99 ms |",
            "|---|---|---|---|---|---|---|",
        ]
    for name, r in results["load"].items():
        bad = f" ({r['non2xx']} non-2xx)" if r["non2xx"] else ""
        row = (
            f"| {name} | {r['items']:,} | {r['body_bytes']:,} | {r['rps']:,.0f}{bad} | "
            f"{r['p50_ms']} | {r['p99_ms']} |"
        )
        if before:
            b = results["before_load"][name]
            row += f" {b['rps']:,.0f}, {b['p50_ms']}, {b['p99_ms']} ({b['items']:,} items) |"
        lines.append(row)
    lines += [
        "",
        f"Worker RSS (MB): loaded {results['rss_loaded']}, after the load "
        f"{results['rss_after']}. Both workers serving after {results['ready_seconds']} s. "
        f"First /health of a worker (per-agency trips running): "
        f"{results.get('first_health_ms', '-')} ms.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops-file", type=Path, default=CM_STOPS, help="CM's stops.txt")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", help="comma-separated words: run the cases naming one")
    parser.add_argument("--before", help="git revision served beside this tree, side by side")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    args = parser.parse_args()
    only = args.only.split(",") if args.only else None
    if args.render:
        results = json.loads(args.out.with_suffix(".json").read_text())
        for load in (results["load"], results.get("before_load", {})):
            for r in load.values():
                for k in ("rps", "p50_ms", "p99_ms"):
                    r[k] = round(r[k], 2)
        args.out.with_suffix(".md").write_text(render(results))
        return
    seconds, rounds = (2, 1) if args.quick else (args.seconds, args.rounds)
    machine = machine_info(SIDECAR_PACKAGES)
    results: dict[str, Any] = {
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", "bench/transit/queries.py", *sys.argv[1:]]),
        "machine": machine,
        "seconds": seconds,
        "rounds": rounds,
    }
    with tempfile.TemporaryDirectory(prefix="transit-queries-") as tmp_name:
        tmp = Path(tmp_name)
        feed, vehicles = make_data(tmp, args.stops_file)
        env = {
            "TRANSIT_GTFS_SOURCE": str(feed),
            "TRANSIT_VEHICLES_SOURCE": str(vehicles),
            "TRANSIT_NOW": NOW,
            "TRANSIT_REALTIME_REFRESH_SECONDS": "10",
        }
        started = datetime.now(UTC)
        server = serve(REPO, env, tmp / "gunicorn.log")
        old = None
        try:
            results["ready_seconds"] = round((datetime.now(UTC) - started).total_seconds(), 1)
            results["rss_loaded"] = worker_rss_mb(server)
            health = httpx.get(server.base + "/health", timeout=30).json()
            results["feed"] = (
                f"{args.stops_file.name} ({len(httpx.get(server.base + '/v2/stops').json()):,} "
                f"stops), version {health['feed']['version']}, "
                f"{health['vehicles']['entities']:,} vehicles"
            )
            # The first /health of a worker counts the trips running per agency (once per
            # feed version and operational day): what that costs at this scale.
            first = httpx.get(server.base + "/health", timeout=60)
            results["first_health_ms"] = round(first.elapsed.total_seconds() * 1000, 1)
            bases = {"after": server.base}
            if args.before:
                git(REPO, "worktree", "add", "--detach", str(tmp / "before"), args.before)
                old = serve(tmp / "before", env, tmp / "gunicorn-before.log")
                bases = {"before": old.base, "after": server.base}
                results["before"] = args.before
            results["load_before"] = loadavg()
            load = measure(bases, seconds, rounds, only)
            results["load"] = load["after"]
            if args.before:
                results["before_load"] = load["before"]
            results["load_after"] = loadavg()
            results["rss_after"] = worker_rss_mb(server)
        finally:
            server.terminate(60)
            if old is not None:
                old.terminate(60)
            if args.before:
                git(REPO, "worktree", "remove", "--force", str(tmp / "before"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
