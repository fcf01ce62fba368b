"""Scale check of the transit API on a Carris-Metropolitana-size feed, and the cost of its
worst request, for the code before and after a change (the network's scale and bounded requests).

    .venv/bin/python bench/transit/scale.py --before 36aa3a4     # a few minutes
    .venv/bin/python bench/transit/scale.py --quick              # smoke: this tree, 2 s runs

For each source tree (`--before REV` is checked out in a temporary git worktree; "after" is
this checkout):

1. ingest: `TransitStore.load_static()` of the synthetic feed (make_feed.py: 12,000 stops,
   4,032,000 stop_times) in a fresh child process: seconds and peak RSS (ru_maxrss);
2. serving: gunicorn with 2 uvicorn workers on that feed, one server per tree side by side;
   RSS of each worker once both have loaded it and again after the load; `wrk -t2 -c32`
   (after a 2 s warm-up) on `/v2/stops` (gzip), `/v2/arrivals/by_stop/:id`,
   `/v2/patterns/:id` and `POST /v2/pips/estimates` with 10 stops, the trees in turn for
   `--rounds` rounds: median requests/s, p50, p99;
3. worst request: gunicorn with 2 workers on the bundled Cairns feed; two concurrent
   `POST /v2/pips/estimates` of 100,000 stop ids (the 50 busiest stops over and over, about
   1 MB) and then two of the 50 busiest stops once, each while a client keeps asking
   `/v2/lines` over fresh connections: the POSTs' latency and status, and `/v2/lines`
   latency before and during them.

Results: bench/results/transit_scale.json and .md. wrk, the servers and this script share the
machine's cores, and the machine may be shared with other work (the load average is
recorded): compare before and after within one run, not with figures of other runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]

from support.machine import SIDECAR_PACKAGES, describe, machine_info  # noqa: E402
from support.process import process_tree  # noqa: E402
from support.sidecar import FRESH, Gunicorn  # noqa: E402
from support.wrk import run_wrk  # noqa: E402

CAIRNS = REPO / "sidecars" / "transit" / "data" / "cairns_gtfs.zip"
SYNTH_NOW = "2026-03-24T08:00:00+00:00"  # a Tuesday in the synthetic feed's year
CAIRNS_NOW = "2014-06-10T08:00:00+10:00"
STOP = "100000"
PATTERN = "1001_0_1"
PIP_STOPS = [f"{100000 + i}" for i in range(10)]
OUT = REPO / "bench" / "results" / "transit_scale"

INGEST = r"""
import json, resource, sys, time
from sidecars.transit.settings import FeedSettings, RealtimeSettings, TransitSettings
from sidecars.transit.store import TransitStore
settings = TransitSettings(
    feed=FeedSettings(source=sys.argv[1]), realtime=RealtimeSettings(vehicles_source=None)
)
store = TransitStore(settings)
t0 = time.perf_counter()
ok = store.load_static()
seconds = time.perf_counter() - t0
net = store.network
t1 = time.perf_counter()
if net is not None:
    net.pattern_body(next(iter(net.patterns)))
pattern_ms = (time.perf_counter() - t1) * 1000
print(json.dumps({
    "ok": ok,
    "seconds": round(seconds, 2),
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "stops": len(net.raw.stop_ids) if net else 0,
    "stop_times": len(net.raw.st_trip) if net else 0,
    "patterns": len(net.patterns) if net else 0,
    "first_pattern_encode_ms": round(pattern_ms, 1),
}))
"""


def tree_env(tree: Path, **extra: str) -> dict[str, str]:
    """The environment that makes Python import `sidecars` from `tree`."""
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore", **extra}


def ingest(tree: Path, feed: Path) -> dict[str, Any]:
    """Load the feed once in a fresh interpreter importing the tree's code."""
    out = subprocess.run(
        [sys.executable, "-c", INGEST, str(feed)],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def serve(tree: Path, env: dict[str, str], log: Path, workers: int = 2) -> Gunicorn:
    """gunicorn with uvicorn workers on port 0, importing the tree's code (`--chdir` puts it
    first on the workers' path), with the `TRANSIT_*` settings in `env`; returned once every
    worker serves its feed."""
    argv = [
        sys.executable, "-m", "gunicorn", "--chdir", str(tree),
        "--worker-class", "uvicorn.workers.UvicornWorker", "--workers", str(workers),
        "--bind", "127.0.0.1:0", "--log-level", "info", "--timeout", "600",
        "--no-control-socket", "sidecars.transit.asgi:app()",
    ]  # fmt: skip
    full = {
        "TRANSIT_GTFS_REFRESH_SECONDS": "0",
        "TRANSIT_LOG_LEVEL": "warning",
        # Not the tree: gunicorn only puts --chdir first on the path when it is not on it yet
        # (`python -m` has put this checkout's directory there already).
        "PYTHONPATH": "",
        "PYTHONWARNINGS": "ignore",
        **env,
    }
    server = Gunicorn(argv, full, log, workers=workers)
    try:
        server.wait_ready(60)
        server.wait_each_worker(
            "/health", lambda r: r.status_code == 200, header="transit-worker", timeout=900
        )
    except BaseException:
        server.terminate()
        raise
    return server


def feed_env(feed: Path, now: str) -> dict[str, str]:
    """An operator's deployment of `feed` at a pinned time, without realtime."""
    return {"TRANSIT_GTFS_SOURCE": str(feed), "TRANSIT_NOW": now, "TRANSIT_VEHICLES_SOURCE": ""}


def worker_rss_mb(server: Gunicorn) -> list[float]:
    """VmRSS of each worker process (the arbiter's children)."""
    out = []
    for pid in process_tree(server.pid)[1:]:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        out.append(round(kb / 1024, 1))
    return sorted(out)


CASES: dict[str, tuple[str, dict[str, str] | None, bytes | None]] = {
    "GET /v2/stops (gzip)": ("/v2/stops", {"Accept-Encoding": "gzip"}, None),
    f"GET /v2/arrivals/by_stop/{STOP}": (f"/v2/arrivals/by_stop/{STOP}", None, None),
    f"GET /v2/patterns/{PATTERN}": (f"/v2/patterns/{PATTERN}", None, None),
    "POST /v2/pips/estimates (10 stops)": (
        "/v2/pips/estimates",
        {"Content-Type": "application/json"},
        json.dumps({"stops": PIP_STOPS}).encode(),
    ),
}


def load(servers: dict[str, Gunicorn], seconds: int, rounds: int) -> dict[str, dict[str, Any]]:
    """wrk on the four endpoints, each server in turn, `rounds` times: the median of the
    rounds' requests/s, p50 and p99 (ms) per server, and every round. The servers run side by
    side and alternate, so a change in the shared machine's load hits each alike."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = {n: {} for n in servers}
    for case, (path, headers, body) in CASES.items():
        for server in servers.values():  # warm-up
            run_wrk(server.base + path, 2, connections=32, threads=2, headers=headers, body=body)
        for _ in range(rounds):
            for name, server in servers.items():
                r = run_wrk(
                    server.base + path, seconds, connections=32, threads=2, headers=headers,
                    body=body,
                )  # fmt: skip
                runs[name].setdefault(case, []).append(
                    {k: round(r[k], 2) for k in ("rps", "p50_ms", "p99_ms", "errors", "non2xx")}
                )
                print(f"    {name} {case}: {runs[name][case][-1]}", flush=True)
    return {
        name: {
            case: {
                **{k: statistics.median(r[k] for r in rs) for k in ("rps", "p50_ms", "p99_ms")},
                "non2xx": sum(r["non2xx"] for r in rs),
                "errors": sum(r["errors"] for r in rs),
                "rounds": rs,
            }
            for case, rs in cases.items()
        }
        for name, cases in runs.items()
    }


class LinesProbe(threading.Thread):
    """Asks `/v2/lines` over fresh connections, back to back, recording each latency."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.latencies: list[tuple[float, float]] = []  # (start, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=300) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                client.get("/v2/lines", headers=FRESH)
                self.latencies.append((t0, time.perf_counter() - t0))

    def between(self, start: float, end: float) -> dict[str, float]:
        """Latency summary (ms) of the requests started in [start, end)."""
        values = sorted(s * 1000 for t, s in self.latencies if start <= t < end)
        if not values:
            return {"requests": 0}
        return {
            "requests": len(values),
            "p50_ms": round(statistics.median(values), 1),
            "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1),
            "max_ms": round(values[-1], 1),
        }


def concurrent_posts(base: str, body: bytes, n: int = 2) -> list[dict[str, float]]:
    """`n` POSTs of `body` at once: each one's status and seconds."""
    results: list[dict[str, float]] = []

    def one() -> None:
        t0 = time.perf_counter()
        r = httpx.post(
            base + "/v2/pips/estimates",
            content=body,
            headers={**FRESH, "Content-Type": "application/json"},
            timeout=600,
        )
        results.append({"status": r.status_code, "seconds": round(time.perf_counter() - t0, 3)})

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def worst_request(tree: Path, log: Path, settle: float) -> dict[str, Any]:
    """The 1 MB POST and the busiest accepted one, against `/v2/lines` latency."""
    server = serve(tree, feed_env(CAIRNS, CAIRNS_NOW), log)
    try:
        stops = httpx.get(server.base + "/v2/stops", timeout=30).json()
        busiest = sorted(stops, key=lambda s: -len(s["pattern_ids"]))[:50]
        ids = [s["id"] for s in busiest]
        # 100,000 ids of real, busy stops (about 1 MB): each one used to be looked up.
        huge = json.dumps({"stops": [ids[i % len(ids)] for i in range(100_000)]}).encode()
        cap = json.dumps({"stops": ids}).encode()
        probe = LinesProbe(server.base)
        probe.start()
        out: dict[str, Any] = {"huge_body_bytes": len(huge)}
        t0 = time.perf_counter()
        time.sleep(settle)
        out["lines_alone"] = probe.between(t0, time.perf_counter())
        for name, body in (("100000_ids", huge), ("50_busiest_stops", cap)):
            t1 = time.perf_counter()
            out[name] = {"posts": concurrent_posts(server.base, body)}
            out[name]["lines_meanwhile"] = probe.between(t1, time.perf_counter())
            time.sleep(settle)
        probe.stop.set()
        probe.join(600)
        return out
    finally:
        server.terminate(60)


def measure(
    trees: dict[str, Path], feed: Path, seconds: int, rounds: int, settle: float, tmp: Path
) -> dict[str, dict[str, Any]]:
    """Everything for every tree: ingest, serving side by side, then the worst request."""
    results: dict[str, dict[str, Any]] = {}
    for name, tree in trees.items():
        print(f"{name}: ingest", flush=True)
        results[name] = {"tree": str(tree), "git": git(tree, "rev-parse", "--short", "HEAD")}
        results[name]["ingest"] = ingest(tree, feed)
        print(f"    {results[name]['ingest']}", flush=True)
    servers: dict[str, Gunicorn] = {}
    try:
        for name, tree in trees.items():
            t0 = time.perf_counter()
            servers[name] = serve(tree, feed_env(feed, SYNTH_NOW), tmp / f"{tree.name}-synth.log")
            results[name]["workers_ready_seconds"] = round(time.perf_counter() - t0, 1)
            results[name]["worker_rss_mb_loaded"] = worker_rss_mb(servers[name])
            # Which code answers: the /health keys differ between versions.
            health = httpx.get(servers[name].base + "/health", timeout=30).json()
            results[name]["health_keys"] = sorted(health)
        for name, figures in load(servers, seconds, rounds).items():
            results[name]["load"] = figures
        for name, server in servers.items():
            results[name]["worker_rss_mb_after_load"] = worker_rss_mb(server)
    finally:
        for server in servers.values():
            server.terminate(60)
    for name, tree in trees.items():
        print(f"{name}: worst request", flush=True)
        log = tmp / f"{tree.name}-cairns.log"
        results[name]["worst_request"] = worst_request(tree, log, settle)
        print(f"    {results[name]['worst_request']}", flush=True)
    return results


def git(tree: Path, *args: str) -> str:
    """One git command's output in `tree`."""
    return subprocess.run(
        ["git", "-C", str(tree), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def heading(title: str, results: dict[str, Any]) -> list[str]:
    """The first lines of a results file: its title and the command that made it."""
    return [f"# {title}", "", f"Generated {results['generated']} by `{results['command']}`.", ""]


def render(results: dict[str, Any]) -> str:
    """The Markdown results file."""
    lines = [
        *heading("Transit API: scale check and worst request (bench/transit/scale.py)", results),
        "**Measured on a shared machine** (other engineers' builds and tests ran at the same",
        "time; load average in the table below): the figures are rough. Compare before and",
        "after within this run only; wrk and the servers share the same 2 cores.",
        "",
        *describe(results["machine"]),
        "",
    ]
    trees = results["trees"]
    names = list(trees)
    lines += ["## Ingest and memory (synthetic CM-size feed)", ""]
    lines += ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    rows = [
        ("code", lambda r: f"`{r['git']}`"),
        (
            "`/health` has `sources` (marks the newer code)",
            lambda r: "sources" in r["health_keys"],
        ),
        ("ingest seconds", lambda r: r["ingest"]["seconds"]),
        ("peak RSS of the ingest (MB)", lambda r: r["ingest"]["peak_rss_mb"]),
        ("stop_times", lambda r: f"{r['ingest']['stop_times']:,}"),
        ("both workers serving after (s)", lambda r: r["workers_ready_seconds"]),
        ("RSS per worker, loaded (MB)", lambda r: r["worker_rss_mb_loaded"]),
        ("RSS per worker, after the load (MB)", lambda r: r["worker_rss_mb_after_load"]),
    ]
    for label, fn in rows:
        lines.append(f"| {label} | " + " | ".join(str(fn(trees[n])) for n in names) + " |")
    lines += ["", "## Requests under gunicorn, 2 workers (wrk -t2 -c32, medians of the rounds)", ""]
    lines += ["| endpoint | " + " | ".join(f"{n}: req/s, p50, p99 ms" for n in names) + " |"]
    lines += ["|---|" + "---|" * len(names)]
    for endpoint in trees[names[0]]["load"]:
        cells = []
        for n in names:
            r = trees[n]["load"].get(endpoint)
            bad = f" ({r['non2xx']} non-2xx)" if r and r["non2xx"] else ""
            cells.append(f"{r['rps']:,.0f}, {r['p50_ms']}, {r['p99_ms']}{bad}" if r else "-")
        lines.append(f"| {endpoint} | " + " | ".join(cells) + " |")
    lines += ["", "## Worst request (Cairns feed, 2 workers)", ""]
    lines += ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    worst = (
        ("100000_ids", "2 x POST of 100,000 ids"),
        ("50_busiest_stops", "2 x POST of the 50 busiest stops"),
    )
    for key, label in worst:
        cells = []
        for n in names:
            w = trees[n]["worst_request"][key]
            posts = ", ".join(f"{p['status']} in {p['seconds']} s" for p in w["posts"])
            cells.append(posts)
        lines.append(f"| {label}: status, latency | " + " | ".join(cells) + " |")
        cells = [_latency(trees[n]["worst_request"][key]["lines_meanwhile"]) for n in names]
        lines.append("| `/v2/lines` meanwhile | " + " | ".join(cells) + " |")
    cells = [_latency(trees[n]["worst_request"]["lines_alone"]) for n in names]
    lines.append("| `/v2/lines` alone | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The 100,000-id POST repeats the 50 busiest Cairns stops (about 1 MB); `/v2/lines` is",
        "asked back to back over fresh connections meanwhile. Raw figures, every wrk round and",
        "the machine: `transit_scale.json` next to this file.",
        "",
    ]
    return "\n".join(lines)


def _latency(summary: dict[str, float]) -> str:
    if not summary.get("requests"):
        return "no request"
    return (
        f"p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms, max {summary['max_ms']} ms "
        f"({summary['requests']} requests)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git revision to measure as 'before'")
    parser.add_argument("--feed", type=Path, help="the synthetic feed (made when absent)")
    parser.add_argument("--seconds", type=int, default=10, help="wrk seconds per endpoint")
    parser.add_argument("--rounds", type=int, default=3, help="wrk runs per endpoint and tree")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 s, this tree only")
    parser.add_argument("--out", type=Path, default=OUT, help="results path without suffix")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    args = parser.parse_args()
    if args.render:
        results = json.loads(args.out.with_suffix(".json").read_text())
        args.out.with_suffix(".md").write_text(render(results))
        return
    seconds, settle = (2, 1.0) if args.quick else (args.seconds, 3.0)
    rounds = 1 if args.quick else args.rounds
    machine = machine_info(SIDECAR_PACKAGES)
    with tempfile.TemporaryDirectory(prefix="transit-scale-") as tmp_name:
        tmp = Path(tmp_name)
        feed = args.feed or tmp / "cm_synth.zip"
        if not feed.exists():
            print("generating the synthetic feed", flush=True)
            subprocess.run(
                [sys.executable, str(REPO / "bench/transit/network/make_feed.py"), str(feed)],
                check=True,
            )
        trees: dict[str, Path] = {}
        if args.before and not args.quick:
            base = tmp / "before"
            git(REPO, "worktree", "add", "--detach", str(base), args.before)
            trees[f"before ({args.before})"] = base
        trees["after"] = REPO
        results: dict[str, Any] = {
            "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join([".venv/bin/python", "bench/transit/scale.py", *sys.argv[1:]]),
            "machine": machine,
            "trees": {},
        }
        try:
            results["trees"] = measure(trees, feed, seconds, rounds, settle, tmp)
        finally:
            if args.before and not args.quick:
                git(REPO, "worktree", "remove", "--force", str(tmp / "before"))
    machine["load average at end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render(results))
    print(f"wrote {args.out.with_suffix('.md')} and .json")


if __name__ == "__main__":
    main()
