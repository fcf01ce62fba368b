"""Instructions per gRPC call of each pinned-core server, counted by callgrind: the figure
to optimise with on a busy machine, where CPU time per call moves with the neighbours.

Each server runs under `valgrind --tool=callgrind` with instrumentation off while it starts;
it is switched on (`callgrind_control -i on`) for exactly `--requests` calls sent by h2load
(4 connections x 32 streams, as the load benchmark), then dumped. Scenarios: (e) the empty
native server (fixed reply), (b) ratelimitd on the memory backend, (c) on Redis (the
redis-server itself is not counted). Trickled ones, as Envoy sends a moderate rate: one
connection, one stream, paced (`--rps`) so that the server goes back to epoll_wait between
two calls and each call has its loop iterations to itself: (t) the empty native server,
(m) memory, (r) Redis. Prints instructions per call, the ratio to (e), the interpreter's
share of each call (instructions in libpython: the eval loop and the object machinery,
against the compiled modules and the rest), and the functions that cost the most per call
(own instructions), with `--top N`.

    .venv/bin/python bench/load/instructions.py                    # 20,000 calls each
    .venv/bin/python bench/load/instructions.py --only b --top 40  # where (b) spends them
    .venv/bin/python bench/load/instructions.py --only crt --requests 2000  # the Redis call

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
from collections.abc import Callable
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
    "t": "(t) empty native server, trickled",
    "m": "(m) memory, trickled",
    "r": "(r) Redis, trickled",
}
# One call in flight (one connection, one stream), paced: each call has the event loop to
# itself and the loop sleeps in epoll_wait before the next, as a trickle of requests through
# Envoy has; the other scenarios keep 128 in flight.
ALONE = "tmr"
# Calls per second of the trickled scenarios: under callgrind a Redis-backed call takes a few
# milliseconds, so at this rate the server is idle between two calls.
TRICKLE_RPS = 100
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
        ["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", str(dump)],
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


def _dump(server: Any, workdir: Path, nth: int) -> tuple[int, list[tuple[int, str]]]:
    """Instrumentation off, then the server's `nth` dump (each dump zeroes the counters)."""
    _control(server, workdir, "-i", "off")
    _control(server, workdir, "-d")
    # The dump is callgrind.<pid>.out.<nth> (the base file is written at exit).
    dump = workdir / f"callgrind.{server.pid}.out.{nth}"
    for _ in range(100):
        if dump.exists() and dump.stat().st_size:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    return _functions(dump)


def count(
    server: Any, payload: bytes, requests: int, workdir: Path, nth: int = 1, alone: bool = False
) -> tuple[int, list[tuple[int, str]], int]:
    """Instrumentation on for `requests` calls of `server` (under callgrind): (instructions,
    [(own instructions, function)], dumps taken, from the `nth`).

    `alone`: one call in flight, paced; then the same wall time again with no calls, and
    that idle count subtracted: what the process does by the clock (the config watcher,
    timers) would otherwise be charged to the few calls a second callgrind can pace, far
    more per call than at the rates it stands for."""
    width: dict[str, Any] = {"clients": 1, "streams": 1, "rate": TRICKLE_RPS} if alone else {}
    _control(server, workdir, "-i", "on")
    started = time.monotonic()
    run_h2load(
        server.grpc_port, payload, seconds=0, warmup=0, requests=requests, load_cpu=1, **width
    )
    elapsed = time.monotonic() - started
    total, rows = _dump(server, workdir, nth)
    if not alone:
        return total, rows, 1
    _control(server, workdir, "-i", "on")
    time.sleep(elapsed)
    idle, idle_rows = _dump(server, workdir, nth + 1)
    own: dict[str, int] = {}
    for ir, where in rows:
        own[where] = own.get(where, 0) + ir
    for ir, where in idle_rows:
        own[where] = own.get(where, 0) - ir
    rows = sorted(((ir, where) for where, ir in own.items()), reverse=True)
    return total - idle, rows, 2


def run(
    only: str,
    requests: int,
    log: Callable[[str], None],
    keep: Path | None = None,
    trickled: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Per scenario of `only`: {"per_call": instructions per call, "functions": [(own
    instructions per call, function)] most first, "calls": calls counted}; `trickled` calls
    (default `requests`) for the paced scenarios, which take 2 / TRICKLE_RPS s per call."""
    for tool in ("valgrind", "callgrind_control", "h2load"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} is not installed")
    payload = request_bytes(DOMAIN, DESCRIPTOR)
    procs: list[Proc] = []
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        workdir = Path(tmp)
        wrap = _callgrind(workdir)
        try:
            native: Any = None
            memory: Any = None
            on_redis: Any = None
            dumps: dict[int, int] = {}
            for key in only:
                sent = {"u": UNKNOWN, "n": UNMATCHED}.get(key, payload)
                if key in "et":
                    if native is None:
                        native = start_bound(lambda: EmptyNativeServer(workdir, wrap=wrap))
                        procs.append(native)
                    server = native
                elif key in "bunm":
                    if memory is None:
                        memory = start_bench_daemon("memory", workdir, wrap=wrap)
                        procs.append(memory)
                    server = memory
                else:
                    if on_redis is None:
                        redis = start_redis(workdir)
                        procs.append(redis)
                        env = {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp"}
                        on_redis = start_bench_daemon(
                            "redis", workdir, wrap=wrap, REDIS_URL=redis.address, **env
                        )
                        procs.append(on_redis)
                    server = on_redis
                log(f"callgrind: counting {NAMES[key]}")
                nth = dumps.get(server.pid, 0) + 1
                alone = key in ALONE
                calls = (trickled or requests) if alone else requests
                total, rows, taken = count(server, sent, calls, workdir, nth, alone)
                dumps[server.pid] = nth + taken - 1
                results[key] = {
                    "per_call": total / calls,
                    "functions": [(ir / calls, where) for ir, where in rows],
                    "calls": calls,
                }
        finally:
            for p in reversed(procs):
                p.terminate(30)
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for dump in workdir.glob("callgrind.*.out*"):
                    shutil.copy(dump, keep / dump.name)
    return results


def by_function(result: dict[str, Any]) -> dict[str, float]:
    """Own instructions per call by function name (a name callgrind lists twice, summed)."""
    out: dict[str, float] = {}
    for ir, where in result["functions"]:
        out[where] = out.get(where, 0.0) + ir
    return out


def difference(
    a: dict[str, Any], b: dict[str, Any], top: int | None = None
) -> list[tuple[float, str]]:
    """The (`top`) functions that cost `a` the most instructions per call more than `b`."""
    fa, fb = by_function(a), by_function(b)
    rows = [(fa.get(f, 0.0) - fb.get(f, 0.0), f) for f in fa.keys() | fb.keys()]
    rows.sort(reverse=True)
    return rows if top is None else rows[:top]


def by_library(rows: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """`difference` rows summed by the shared object they run in (nghttp2, the interpreter,
    msgspec's `_core`, one compiled ratelimitd module ...), most first."""
    out: dict[str, float] = {}
    for ir, where in rows:
        # callgrind names no object for a few inlined fragments of the compiled modules
        lib = where.rpartition("[")[2].rstrip("]").split(".", 1)[0] or "(unnamed object)"
        out[lib] = out.get(lib, 0.0) + ir
    return sorted(((ir, lib) for lib, ir in out.items()), reverse=True)


# The compiled modules of ratelimitd, by the name `by_library` gives their shared objects.
COMPILED = frozenset(
    so.name.split(".", 1)[0]
    for so in (Path(__file__).resolve().parents[2] / "ratelimitd").rglob("*.so")
)
SPLIT = ("interpreter", "ratelimitd compiled", "event loop", "other")


def runner(where: str) -> str:
    """Which part of `SPLIT` runs one `functions` row."""
    name, _, lib = where.rpartition(" [")
    lib = lib.rstrip("]").split(".", 1)[0]
    if not lib:
        # callgrind names no object for some inlined fragments: Cython's by their module
        # in the mangled name, the rest are the interpreter's (libc's come named).
        if not name.startswith(("__pyx", "__Pyx")):
            return "interpreter"
        return "event loop" if "uvloop" in name else "ratelimitd compiled"
    if lib.startswith("libpython"):
        return "interpreter"
    if lib in COMPILED:
        return "ratelimitd compiled"
    return "event loop" if lib == "loop" else "other"


def split(result: dict[str, Any]) -> dict[str, float]:
    """Instructions per call of one scenario by who runs them: the interpreter (libpython:
    the eval loop, the object machinery, its allocator), ratelimitd's compiled modules,
    the event loop (uvloop with its libuv) and the rest (libc, nghttp2, msgspec, hiredis)."""
    out = dict.fromkeys(SPLIT, 0.0)
    for ir, where in result["functions"]:
        out[runner(where)] += ir
    return out


def render_split(results: dict[str, dict[str, Any]]) -> list[str]:
    """`split` of every scenario (markdown rows)."""
    lines = [
        "Who runs each call's instructions (per call): the interpreter is libpython (the",
        "eval loop and the object machinery); the compiled modules are ratelimitd's own.",
        "",
        "| scenario | total | " + " | ".join(SPLIT) + " | interpreter share |",
        "|---|---:|" + "---:|" * len(SPLIT) + "---:|",
    ]
    for key, r in results.items():
        parts = split(r)
        cells = " | ".join(f"{parts[k]:,.0f}" for k in SPLIT)
        share = parts["interpreter"] / r["per_call"]
        lines.append(f"| {NAMES[key]} | {r['per_call']:,.0f} | {cells} | {share:.1%} |")
    return lines


def render(results: dict[str, dict[str, Any]], requests: int, top: int) -> str:
    """Instructions per call of each scenario, and where the decided, unknown-domain and
    Redis calls spend theirs above the floor (markdown)."""
    lines = [
        "## Instructions per call (callgrind, bench/load/instructions.py)",
        "",
        f"Each server under `valgrind --tool=callgrind`, counted for exactly {requests:,} "
        "calls from h2load (4 connections x 32 streams, one repeated request); instruction "
        "counts do not move with the machine's load (cache misses are not in them). "
        "Trickled: one connection, one stream, paced at "
        f"{TRICKLE_RPS} calls/s so that the server sleeps in epoll_wait between two calls "
        "(as behind Envoy at a moderate rate), "
        + ", ".join(sorted({f"{r['calls']:,}" for k, r in results.items() if k in ALONE}))
        + " calls; the same wall time idle is counted after them and subtracted (what the "
        "process does by the clock, not per call).",
        "",
        "| scenario | instructions / call | ÷ (e) | above (e) | ÷ (b) above (e) |",
        "|---|---:|---:|---:|---:|",
    ]
    floor = results["e"]["per_call"] if "e" in results else None
    decided = results["b"]["per_call"] if "b" in results else None
    for key, r in results.items():
        per = r["per_call"]
        ratio = above = share = ""
        if floor:
            ratio, above = f"{per / floor:.2f}×", f"{per - floor:,.0f}"
            if decided and decided > floor:
                share = f"{(per - floor) / (decided - floor):.2f}×"
        lines.append(f"| {NAMES[key]} | {per:,.0f} | {ratio} | {above} | {share} |")
    lines += ["", *render_split(results)]
    pairs = [
        ("b", "e", "a decided call on memory costs above the empty server"),
        ("u", "e", "an unknown domain's call still costs above the empty server"),
        ("n", "e", "a call no rule matches still costs above the empty server"),
        ("c", "b", "a Redis-backed call costs above the same call on memory"),
        ("r", "m", "a Redis-backed call costs above the same call on memory, trickled"),
        ("r", "c", "a Redis-backed call costs trickled above 128 in flight"),
        ("m", "b", "a call on memory costs trickled above 128 in flight"),
    ]
    for a, b, what in pairs:
        if a not in results or b not in results:
            continue
        lines += [
            "",
            f"What {what} ({NAMES[a]} − {NAMES[b]}, own instructions per call), by shared",
            f"object, then the top {top} functions:",
            "",
            "| shared object | instructions / call |",
            "|---|---:|",
        ]
        for ir, lib in by_library(difference(results[a], results[b])):
            if abs(ir) >= 50:
                lines.append(f"| {lib} | {ir:,.0f} |")
        lines += ["", "| function | instructions / call |", "|---|---:|"]
        for ir, where in difference(results[a], results[b], top):
            lines.append(f"| `{where}` | {ir:,.0f} |")
    lines.append("")
    return "\n".join(lines)


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main() -> int:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="calls counted per server")
    parser.add_argument(
        "--trickled", type=int, default=1_000, help="calls counted per trickled scenario"
    )
    parser.add_argument("--only", default="ebcun", help="scenarios to run, e.g. 'eb'")
    parser.add_argument("--top", type=int, default=15, help="functions listed per scenario")
    parser.add_argument(
        "--keep", type=Path, help="copy the callgrind dumps here (for callgrind_annotate)"
    )
    args = parser.parse_args()
    try:
        results = run(args.only, args.requests, log, args.keep, args.trickled)
    except FileNotFoundError as exc:
        sys.exit(str(exc))
    print(render(results, args.requests, args.top))
    for key, r in results.items():
        print(f"\n{NAMES[key]}: top functions, own instructions per call")
        for ir, where in r["functions"][: args.top]:
            print(f"  {ir:8,.0f}  {ir / r['per_call']:6.1%}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
