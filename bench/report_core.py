"""Render `make bench`'s pytest-benchmark JSON as bench/results/core.md (ratios from one run)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(src: str = "bench/.results/core.json", dst: str = "bench/results/core.md") -> None:
    data = json.loads(Path(src).read_text())
    rows: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    codec: dict[str, dict[str, float]] = defaultdict(dict)
    for b in data["benchmarks"]:
        group = b["name"].split("[")[0].removeprefix("test_")
        params = b["params"]
        median = b["stats"]["median"] * 1e6
        if group == "codec":
            codec[params["op"]][params["impl"]] = median
        else:
            rows[(group, params["rules"])][params["impl"]] = median
    m = data["machine_info"]
    run = m.get("ratelimitd", {})
    lines = [
        "# Decision-core benchmarks",
        "",
        "Command: `make bench` (pytest-benchmark, CPU time per call via `time.process_time`,",
        "median of all rounds). One run; compiled and pure measured side by side.",
        "",
        f"Machine: {run.get('cpu', '?')}, Python {run.get('python')}, "
        f"{run.get('redis-server', '')}, load average at start {run.get('load average at start')}. "
        f"Date: {data['datetime']}. Tree: {run.get('git')}.",
        "",
        "Implementations live in this process (the `pure` rows run the twins by argument): "
        + ", ".join(f"`{k}` {v}" for k, v in run.get("implementations", {}).items())
        + ".",
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
    if codec:
        lines += [
            "",
            "RLS codec, one-descriptor request / one-status OK response (µs per call):",
            "",
            "| op | compiled `_wire` µs | upb µs | upb / compiled |",
            "|---|---:|---:|---:|",
        ]
        for op, impls in sorted(codec.items()):
            c, u = impls.get("compiled"), impls.get("upb")
            ratio = f"{u / c:.2f}" if c and u else "-"
            lines.append(f"| {op} | {c or 0:.2f} | {u or 0:.2f} | {ratio} |")
    Path(dst).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:])
