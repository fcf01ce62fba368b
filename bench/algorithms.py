"""The extension's algorithms: CPU per decision and Redis round trips per decision.

Fixed window, sliding window, token bucket and a two-limit descriptor, measured in one run so
their ratios compare (targets: sliding and token bucket <= 1.3x the fixed window's CPU, one
Redis round trip per decision each), and the decision at 10 and 100,000 rules (the match
and key path must stay flat). Starts its own redis-server on a free port; runs on uvloop.

    .venv/bin/python bench/algorithms.py [--decisions 100000] [--repeat 5]

1. Memory: CPU (time.process_time) per ShouldRateLimit of one descriptor through the
   service (build_core, the memory backend's synchronous path), median of --repeat runs.
2. Redis: one caller deciding in a loop: client CPU per decision, and round trips per
   decision = the backend's pipelined writes / decisions (one write, one reply read each);
   then 64 concurrent callers: client CPU per decision with auto-pipelining.
3. Rules: the memory decision on a sliding-window rule among 10 and 100,000 rules.

Writes bench/results/algorithms.json (with the machine) and prints a Markdown table. The
machine may be shared: quote ratios of one run, not absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from support.machine import machine_info
from support.redis_server import RedisServers
from support.report import table

from ratelimitd.backends import MemoryBackend
from ratelimitd.backends.redis import RedisBackend
from ratelimitd.config import ConfigFile, ConfigSource, build_ruleset
from ratelimitd.config.yamlfile import DescriptorDoc, RateLimitDoc, RootDoc
from ratelimitd.core import build_core
from ratelimitd.messages import OK, Descriptor, Request
from ratelimitd.settings import RedisSettings

BIG = 1_000_000_000  # never over: every decision takes the same path
CASES = {
    "fixed": f"{{unit: second, requests_per_unit: {BIG}}}",
    "sliding": f"{{unit: second, requests_per_unit: {BIG}, algorithm: sliding_window}}",
    "token": f"{{unit: second, requests_per_unit: {BIG}, algorithm: token_bucket}}",
}
CONFIG = (
    "domain: bench\ndescriptors:\n"
    + "".join(f"  - key: {name}\n    rate_limit: {limit}\n" for name, limit in CASES.items())
    + (
        "  - key: two\n    rate_limits:\n"
        f"      - {{unit: second, requests_per_unit: {BIG}}}\n"
        f"      - {{unit: hour, requests_per_unit: {BIG}, name: hourly}}\n"
    )
)
NAMES = [*CASES, "two"]


def request(name: str, value: str = "u1") -> Request:
    return Request("bench", [Descriptor(((name, value),))])


def decision_cpu_us(service: Any, req: Request, n: int, repeat: int) -> float:
    """CPU µs per decision of `req` on the memory backend (driven without an event loop):
    the median of `repeat` runs of `n` decisions."""
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(n):
            service.decide(req)
        runs.append((time.process_time() - start) / n * 1e6)
    return round(statistics.median(runs), 3)


def memory_cpu(n: int, repeat: int) -> dict[str, float]:
    core = build_core(backend=MemoryBackend())
    core.load([ConfigFile("bench.yaml", CONFIG)])
    svc = core.service
    out = {}
    for name in NAMES:
        req = request(name)
        assert svc.decide(req).overall_code == OK
        out[name] = decision_cpu_us(svc, req, n, repeat)
    return out


def rules_cpu(n: int, repeat: int) -> dict[int, float]:
    """The sliding-window decision among 10 and 100,000 rules (built without YAML)."""
    out = {}
    for size in (10, 100_000):
        docs = [
            DescriptorDoc(
                key="user",
                value=f"u{i}",
                rate_limit=RateLimitDoc(BIG, "second", algorithm="sliding_window"),
            )
            for i in range(size)
        ]
        core = build_core(backend=MemoryBackend())
        ruleset = build_ruleset([ConfigSource("bench", RootDoc("bench", docs))], stats=core.stats)
        core.service.set_ruleset(ruleset)
        req = Request("bench", [Descriptor((("user", f"u{size // 2}"),))])
        assert core.service.decide(req).statuses[0].rule is not None
        out[size] = decision_cpu_us(core.service, req, n, repeat)
    return out


async def redis_run(address: str, n: int, repeat: int) -> dict[str, dict[str, float]]:
    backend = RedisBackend(RedisSettings(url=address, socket_type="tcp", pool_size=4))
    await backend.connect()
    core = build_core(backend=backend)
    core.load([ConfigFile("bench.yaml", CONFIG)])
    svc = core.service
    out: dict[str, dict[str, float]] = {}
    try:
        for name in NAMES:
            req = request(name)
            await svc.should_rate_limit(req)  # loads the script
            serial, trips, concurrent = [], [], []
            for _ in range(repeat):
                writes = backend.writes
                start = time.process_time()
                for _ in range(n):
                    await svc.should_rate_limit(req)
                serial.append((time.process_time() - start) / n * 1e6)
                trips.append((backend.writes - writes) / n)

                async def caller(i: int, count: int, name: str = name) -> None:
                    r = request(name, f"c{i}")
                    for _ in range(count):
                        await svc.should_rate_limit(r)

                start = time.process_time()
                await asyncio.gather(*(caller(i, n // 64) for i in range(64)))
                concurrent.append((time.process_time() - start) / (64 * (n // 64)) * 1e6)
            out[name] = {
                "serial_us": round(statistics.median(serial), 2),
                "round_trips": round(statistics.median(trips), 3),
                "concurrent_us": round(statistics.median(concurrent), 2),
            }
    finally:
        await backend.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=100_000)
    parser.add_argument("--redis-decisions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "algorithms.json"))
    parser.add_argument("--render", metavar="JSON", help="only re-render a run's JSON as Markdown")
    args = parser.parse_args()
    if args.render:
        render(json.loads(Path(args.render).read_text()), Path(args.render).with_suffix(".md"))
        return

    memory = memory_cpu(args.decisions, args.repeat)
    rules = rules_cpu(args.decisions, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisServers(Path(tmp))
        try:
            server = servers()
            redis = uvloop.run(redis_run(server.address, args.redis_decisions, args.repeat))
        finally:
            servers.stop_all()

    result = {
        "machine": machine_info(),
        "args": vars(args),
        "memory_us": memory,
        "rules_us": rules,
        "redis": redis,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    render(result, Path(args.out).with_suffix(".md"))


def render(result: dict[str, Any], dst: Path) -> None:
    """The run as a Markdown table (ratios within the run), printed and written to `dst`."""
    memory, rules = result["memory_us"], {int(k): v for k, v in result["rules_us"].items()}
    redis = result["redis"]
    base_m, base_r = memory["fixed"], redis["fixed"]
    m = result["machine"]
    lines = [
        "# Algorithms: CPU and Redis round trips per decision",
        "",
        "Command: `.venv/bin/python bench/algorithms.py` (one run; CPU = time.process_time of",
        "the deciding process; ratios are within this run). Descriptor `two`: a 1-second and",
        "a 1-hour fixed window on one descriptor.",
        "",
        f"Machine: {m.get('cpu')}, Python {m.get('python')}, {m.get('redis-server')}; "
        f"implementations {m.get('implementations')}.",
        "",
    ]
    columns = ["descriptor", "memory µs", "x fixed", "Redis µs (1 caller)", "x fixed"]
    columns += ["Redis µs (64)", "x fixed", "round trips / decision"]
    rows = []
    for name in NAMES:
        r, serial, concurrent = redis[name], base_r["serial_us"], base_r["concurrent_us"]
        rows.append(
            (
                name,
                f"{memory[name]:.2f}",
                f"{memory[name] / base_m:.2f}",
                f"{r['serial_us']:.1f}",
                f"{r['serial_us'] / serial:.2f}",
                f"{r['concurrent_us']:.1f}",
                f"{r['concurrent_us'] / concurrent:.2f}",
                f"{r['round_trips']:.2f}",
            )
        )
    lines += table(columns, rows)
    lines.append("")
    lines.append(
        f"Sliding-window decision (memory): {rules[10]:.2f} µs at 10 rules, "
        f"{rules[100_000]:.2f} µs at 100,000 rules ({rules[100_000] / rules[10]:.2f}x)."
    )
    dst.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
