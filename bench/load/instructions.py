"""Instructions per gRPC call of each pinned-core server, counted by callgrind: the figure
to optimise with on a busy machine, where CPU time per call moves with the neighbours.

Each server runs under `valgrind --tool=callgrind` with instrumentation off while it starts;
it is switched on (`callgrind_control -i on`) for exactly `--requests` calls sent by h2load
(4 connections x 32 streams, as the load benchmark), then dumped. Scenarios: (e) the empty
native server (fixed reply), (b) ratelimitd on the memory backend, (c) on Redis (the
redis-server itself is not counted). Prints instructions per call, the ratio to (e), and the
functions that cost the most per call (own instructions), with `--top N`.

    .venv/bin/python bench/load/instructions.py                    # 20,000 calls each
    .venv/bin/python bench/load/instructions.py --only b --top 40  # where (b) spends them

Needs valgrind (apt-get install valgrind) and h2load (nghttp2-client).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpc_load import request_bytes
from h2load_load import run_h2load
from harness import DESCRIPTOR, DOMAIN, EmptyNativeServer, start_bench_daemon, start_redis
from support.process import Proc, start_bound

NAMES = {
    "e": "(e) empty native server",
    "b": "(b) ratelimitd, memory",
    "c": "(c) ratelimitd, Redis",
    "u": "(u) memory, unknown domain",
    "n": "(n) memory, no rule matches",
}
# The request of each scenario: the decided one, or one with nothing to count (a domain the
# config does not know, a value no rule has); (u) and (n) are sent to (b)'s server.
UNKNOWN = request_bytes("not-" + DOMAIN, DESCRIPTOR)
UNMATCHED = request_bytes(DOMAIN, (("no_rule", "x"),))


def _callgrind(workdir: Path) -> list[str]:
    out = workdir / "callgrind.%p.out"
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        f"--vgdb-prefix={workdir / 'vgdb'}",
    ]


def _control(server: Any, workdir: Path, *args: str) -> None:
    # vgdb finds the server's valgrind by a name made of $USER and $HOST: the server's own
    # (the daemon's environment sets HOST, its listen address).
    env = dict(os.environ)
    if server.env and "HOST" in server.env:
        env["HOST"] = server.env["HOST"]
    prefix = f"--vgdb-prefix={workdir / 'vgdb'}"
    argv = ["callgrind_control", prefix, *args, str(server.pid)]
    subprocess.run(argv, check=True, capture_output=True, env=env)


def _functions(dump: Path) -> tuple[int, list[tuple[int, str]]]:
    """(total instructions, [(own instructions, function)] most first) of one dump."""
    run = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(dump)],
        capture_output=True,
        text=True,
    )
    if run.returncode:
        raise RuntimeError(f"callgrind_annotate {dump}: {run.stderr or run.stdout}")
    out = run.stdout
    total = int(re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S+?)(?: \[(\S+)\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            where = m.group(2).rsplit(":", 1)[-1]
            lib = Path(m.group(3) or "").name
            rows.append((int(m.group(1).replace(",", "")), f"{where} [{lib}]"))
    return total, rows


def count(
    server: Any, payload: bytes, requests: int, workdir: Path, nth: int = 1
) -> tuple[int, list]:
    """Instrumentation on for `requests` calls of `server` (under callgrind), then its
    `nth` dump (each dump zeroes the counters)."""
    pid = server.pid
    _control(server, workdir, "-i", "on")
    run_h2load(server.grpc_port, payload, seconds=0, warmup=0, requests=requests, load_cpu=1)
    _control(server, workdir, "-i", "off")
    _control(server, workdir, "-d")
    # The dump is callgrind.<pid>.out.<nth> (the base file is written at exit).
    dump = workdir / f"callgrind.{pid}.out.{nth}"
    for _ in range(100):
        if dump.exists() and dump.stat().st_size:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    return _functions(dump)


def main() -> int:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="calls counted per server")
    parser.add_argument("--only", default="ebcun", help="scenarios to run, e.g. 'eb'")
    parser.add_argument("--top", type=int, default=15, help="functions listed per scenario")
    parser.add_argument(
        "--keep", type=Path, help="copy the callgrind dumps here (for callgrind_annotate)"
    )
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "h2load"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed")
    payload = request_bytes(DOMAIN, DESCRIPTOR)
    procs: list[Proc] = []
    results: dict[str, tuple[int, list]] = {}
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        workdir = Path(tmp)
        wrap = _callgrind(workdir)
        try:
            memory: Any = None
            dumps: dict[int, int] = {}
            for key in args.only:
                sent = {"u": UNKNOWN, "n": UNMATCHED}.get(key, payload)
                if key == "e":
                    server = start_bound(lambda: EmptyNativeServer(workdir, wrap=wrap))
                elif key in "bun":
                    if memory is None:
                        memory = start_bench_daemon("memory", workdir, wrap=wrap)
                        procs.append(memory)
                    server = memory
                else:
                    redis = start_redis(workdir)
                    procs.append(redis)
                    env = {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp"}
                    server = start_bench_daemon(
                        "redis", workdir, wrap=wrap, REDIS_URL=redis.address, **env
                    )
                if server is not memory:
                    procs.append(server)
                print(f"counting {NAMES[key]} ...", file=sys.stderr, flush=True)
                dumps[server.pid] = nth = dumps.get(server.pid, 0) + 1
                results[key] = count(server, sent, args.requests, workdir, nth)
        finally:
            for p in reversed(procs):
                p.terminate(30)
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for dump in workdir.glob("callgrind.*.out*"):
                    shutil.copy(dump, args.keep / dump.name)
    base = results["e"][0] / args.requests if "e" in results else None
    print(f"instructions per call, {args.requests:,} calls each (h2load 4 x 32):")
    for key, (total, _) in results.items():
        per = total / args.requests
        ratio = f"  {per / base:.2f}x (e)" if base else ""
        print(f"  {NAMES[key]:28} {per:10,.0f}{ratio}")
    for key, (total, rows) in results.items():
        print(f"\n{NAMES[key]}: top functions, own instructions per call")
        for ir, where in rows[: args.top]:
            print(f"  {ir / args.requests:8,.0f}  {ir / total:6.1%}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
