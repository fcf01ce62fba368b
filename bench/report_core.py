"""Render `make bench`'s pytest-benchmark JSON as bench/RESULTS-core.md (ratios from one run)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(src: str = "bench/.results/core.json", dst: str = "bench/RESULTS-core.md") -> None:
    data = json.loads(Path(src).read_text())
    rows: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for b in data["benchmarks"]:
        group = b["name"].split("[")[0].removeprefix("test_")
        params = b["params"]
        rows[(group, params["rules"])][params["impl"]] = b["stats"]["median"] * 1e6
    m = data["machine_info"]
    lines = [
        "# Decision-core benchmarks",
        "",
        "Command: `make bench` (pytest-benchmark, CPU time per call via `time.process_time`,",
        "median of all rounds). One run; compiled and pure measured side by side.",
        "",
        f"Machine: {m.get('cpu', {}).get('brand_raw', '?')}, Python {m.get('python')}, "
        f"{m.get('redis_server', '')}. Date: {data['datetime']}.",
        "",
        "| group | rules | compiled µs | pure µs | pure / compiled |",
        "|---|---:|---:|---:|---:|",
    ]
    for (group, rules), impls in sorted(rows.items()):
        c, p = impls.get("compiled"), impls.get("pure")
        ratio = f"{p / c:.2f}" if c and p else "-"
        lines.append(f"| {group} | {rules:,} | {c:.2f} | {p:.2f} | {ratio} |")
    for group in ("match", "decision"):
        small, big = rows.get((group, 10), {}), rows.get((group, 100_000), {})
        if small.get("compiled") and big.get("compiled"):
            lines.append("")
            lines.append(
                f"{group}: compiled at 100 000 rules / at 10 rules = "
                f"{big['compiled'] / small['compiled']:.2f}"
            )
    Path(dst).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:])
