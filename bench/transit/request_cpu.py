"""CPU time per request of the transit API's query endpoints, in process, for this tree and a
git revision, on the same CM-shaped data as bench/transit/queries.py: a measure of what a
change costs that the shared machine's load does not blur (wrk's latencies under a load
average of 5-9 do).

    .venv/bin/python bench/transit/request_cpu.py --before d421260

Each tree runs in its own interpreter (the two cannot share one), twice, alternating; each
endpoint: 50 warm-up requests, then the fastest of 3 batches of 300 through the whole ASGI
app (falcon's ASGIConductor: middleware included, no sockets), in process CPU microseconds.
Results: bench/results/transit_request_cpu.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench" / "results" / "transit_request_cpu"
NOW = "2026-03-24T08:00:00+00:00"


def one_tree(data: Path) -> dict[str, float]:
    """Run in the child interpreter: the tree first on sys.path is the one measured."""
    import falcon.testing

    from sidecars.transit.app import Services, create_app
    from sidecars.transit.settings import TransitSettings

    env = {
        "TRANSIT_GTFS_SOURCE": str(data / "cm.zip"),
        "TRANSIT_VEHICLES_SOURCE": str(data / "vp.pb"),
        "TRANSIT_NOW": NOW,
        "TRANSIT_LOCATIONS_DIR": "",
        "TRANSIT_FACILITIES_DIR": "",
    }
    settings = TransitSettings.from_env(env)
    services = Services(settings)
    assert services.store.load_static()
    services.store.poll_realtime()
    app = create_app(settings, services=services)

    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        async with falcon.testing.ASGIConductor(app) as client:
            stops = (await client.simulate_get("/v2/stops")).json
            busiest = max(stops, key=lambda s: len(s["pattern_ids"]))["id"]
            vehicle = (await client.simulate_get("/v2/vehicles")).json[0]
            paths = {
                "GET /v2/stops?lat&lon&radius=300": "/v2/stops?lat=38.7678&lon=-9.099&radius=300",
                "GET /v2/arrivals/by_stop/<busiest>": f"/v2/arrivals/by_stop/{busiest}",
                "GET /v2/arrivals/by_stop/<busiest>?limit=10": (
                    f"/v2/arrivals/by_stop/{busiest}?limit=10"
                ),
                "GET /v2/vehicles": "/v2/vehicles",
                "GET /v2/vehicles?line_id=<line>": f"/v2/vehicles?line_id={vehicle['line_id']}",
                "GET /v2/vehicles/<id>": f"/v2/vehicles/{vehicle['id']}",
                "GET /v2/lines": "/v2/lines",
            }
            for name, path in paths.items():
                for _ in range(50):
                    await client.simulate_get(path)
                best = []
                for _ in range(3):
                    started = time.process_time()
                    for _ in range(300):
                        result = await client.simulate_get(path)
                    best.append((time.process_time() - started) / 300 * 1e6)
                assert result.status_code == 200, (path, result.status_code)
                out[name] = round(min(best), 1)
        return out

    return asyncio.run(run())


def child(tree: Path, data: Path) -> dict[str, float]:
    """Measure `tree` in a fresh interpreter."""
    code = (
        f"import sys, json; sys.path.insert(0, {str(tree)!r}); "
        f"sys.path.insert(1, {str(REPO / 'bench' / 'transit')!r}); "
        "from pathlib import Path; from request_cpu import one_tree; "
        f"print(json.dumps(one_tree(Path({str(data)!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tree
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision measured beside this tree")
    parser.add_argument("--stops-file", type=Path, required=False)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from queries import CM_STOPS, make_data

    with tempfile.TemporaryDirectory(prefix="transit-cpu-") as tmp_name:
        tmp = Path(tmp_name)
        feed, vehicles = make_data(tmp, args.stops_file or CM_STOPS)
        feed.rename(tmp / "cm.zip")
        vehicles.rename(tmp / "vp.pb")
        before = tmp / "before"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), args.before],
            check=True,
            capture_output=True,
        )
        load_before = loadavg()
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        try:
            for _ in range(2):
                runs["before"].append(child(before, tmp))
                runs["after"].append(child(REPO, tmp))
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=True
            )
    results: dict[str, Any] = {
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", "bench/transit/request_cpu.py", *sys.argv[1:]]),
        "before": args.before,
        "load_before": load_before,
        "load_after": loadavg(),
        "runs": runs,
    }
    lines = [
        "# Transit API: CPU time per request, in process (bench/transit/request_cpu.py)",
        "",
        f"Generated {results['generated']} by `{results['command']}`.",
        "",
        "CM-shaped data of bench/transit/queries.py (12,581 stops, 866,400 stop_times, 1,024 "
        "vehicles). Fastest of 3 batches of 300 requests through the whole ASGI app, process "
        f"CPU µs per request, two runs per tree alternating. Load average {load_before} "
        f"before, {results['load_after']} after (CPU time is little affected by it).",
        "",
        f"| endpoint | before ({args.before}), µs | after, µs | after / before |",
        "|---|---|---|---|",
    ]
    for name in runs["after"][0]:
        b = min(r[name] for r in runs["before"])
        a = min(r[name] for r in runs["after"])
        lines.append(f"| {name} | {b} | {a} | {a / b:.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
