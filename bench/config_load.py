"""How large a config ratelimitd loads, how long it takes, and what serving feels meanwhile.

    .venv/bin/python bench/config_load.py                       # 1k, 10k, 50k rules
    .venv/bin/python bench/config_load.py --rules 1000 100000

For each size: a daemon (memory backend) serving a one-rule config gets a config of that
many rules written into its directory; the time until it is in force (the
`config_load_success` counter moves), the daemon's RSS after, and, while it loads, `/json`
decisions sent one after another on a keep-alive connection: their count, p99 and worst
latency (how long the event loop was held). Writes bench/results/config_load.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from support.core import single_rule
from support.daemon import daemon_environment, start_daemon, write_config
from support.machine import describe, machine_info

REPO = Path(__file__).resolve().parents[1]


SMALL = single_rule("probe", "hour", 1_000_000_000)
BODY = b'{"domain":"probe","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}'
STAT = "ratelimit.service.config_load_success"


def big_config(rules: int) -> str:
    lines = ["domain: big", "descriptors:"]
    for i in range(rules):
        limit = f"{{unit: minute, requests_per_unit: {i % 1000 + 1}}}"
        lines.append(f"  - key: user\n    value: u{i}\n    rate_limit: {limit}")
    return "\n".join(lines) + "\n"


def loads(daemon: Any) -> int:
    for line in daemon.debug("/stats")[1].decode().splitlines():
        if line.startswith(STAT + ":"):
            return int(line.split(":")[1])
    return 0


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def probe(port: int, done: asyncio.Event) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"POST /json HTTP/1.1\r\nHost: p\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    out = []
    while not done.is_set():
        t0 = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        out.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.005)
    writer.close()
    return out


async def measure(rules: int, work: Path) -> dict[str, Any]:
    env = daemon_environment(work / f"runtime-{rules}", BACKEND_TYPE="memory", USE_STATSD="false")
    write_config(env, "probe.yaml", SMALL)
    daemon = start_daemon(env, work)
    try:
        text = big_config(rules)
        before = loads(daemon)
        done = asyncio.Event()
        task = asyncio.ensure_future(probe(daemon.http_port, done))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        write_config(env, "big.yaml", text)
        while await asyncio.to_thread(loads, daemon) == before:
            await asyncio.sleep(0.05)
        seconds = time.monotonic() - t0
        await asyncio.sleep(0.5)
        done.set()
        latencies = sorted(await task)
        return {
            "rules": rules,
            "bytes": len(text.encode()),
            "load_seconds": round(seconds, 2),
            "rss_kib_after": rss_kib(daemon.pid),
            "probes": len(latencies),
            "probe_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
            "probe_max_ms": round(latencies[-1], 2),
        }
    finally:
        daemon.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, nargs="*", default=[1_000, 10_000, 50_000])
    parser.add_argument(
        "--output", type=Path, default=REPO / "bench" / "results" / "config_load.md"
    )
    args = parser.parse_args()
    machine = machine_info()
    results = []
    with tempfile.TemporaryDirectory(prefix="ratelimitd-config-load-") as tmp:
        for rules in args.rules:
            results.append(asyncio.run(measure(rules, Path(tmp))))
            print(results[-1], flush=True)
    lines = [
        "# Config load sizes",
        "",
        "Command: `.venv/bin/python bench/config_load.py"
        + (f" --rules {' '.join(map(str, args.rules))}`" if args.rules else "`")
        + ". One run on the shared 2-core VM; `/json` probes one after another, 5 ms apart,"
        " while the config loads.",
        "",
        "| rules | file size | load (s) | RSS after (MiB) | probes | probe p99 ms | probe max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['rules']:,} | {r['bytes'] / 1e6:.1f} MB | {r['load_seconds']} | "
            f"{r['rss_kib_after'] / 1024:.0f} | {r['probes']} | {r['probe_p99_ms']} | "
            f"{r['probe_max_ms']} |"
            for r in results
        ],
        "",
        "## Machine",
        "",
        *describe(machine),
    ]
    args.output.write_text("\n".join(lines) + "\n")
    args.output.with_suffix(".json").write_text(
        json.dumps({"results": results, "machine": machine}, indent=2)
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
