"""Instructions and last-level cache misses per decision on the memory store with K live
counters, counted by callgrind's cache simulation: what makes a decision dearer as the key
space grows, measured where CPU time is too noisy to tell (a shared machine).

For each K the store is filled with K counters (one `decide` per value, uncounted), then
instrumentation is switched on for `--calls` decisions of values drawn at random from the
K (each request made just before its decision: its making is counted too, the same at
every K), and the dump read: instructions (Ir), first-level data misses (D1mr + D1mw) and
last-level misses (DLmr + DLmw) per decision.

The simulated last level is 32 MB (`--ll-mb`), not the host's: this VM reports a 480 MB L3
(the whole host's, shared with its other tenants), which would hold a million counters and
hide what a decision pays on a real socket. The simulation starts cold when the calls do, and
the draws are random over K: at K = 1M nearly every draw is a key not touched before, so the
last-level misses per call are the lines a decision must fetch for its key.

    .venv/bin/python bench/load/keyspace_misses.py                     # K = 1, 1k, 100k, 1M
    .venv/bin/python bench/load/keyspace_misses.py --keyspaces 1 1000000 --calls 20000

Needs valgrind (callgrind_control).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EVENTS = ("Ir", "D1mr", "D1mw", "DLmr", "DLmw")


def child(k: int, calls: int) -> None:
    """Under callgrind: fill K counters, say so, wait, decide `calls` times, say so, wait."""
    import random

    from harness import DOMAIN, RULES
    from keyspace import value
    from support.core import memory_decider

    from ratelimitd.messages import Descriptor, Request

    h = memory_decider(RULES, now=time.time())
    decide = h.service.decide
    for n in range(k):
        decide(Request(DOMAIN, [Descriptor((("user", value(n)),))]))
    rng = random.Random(k)
    for _ in range(1000):  # the code paths warm, as in a running daemon
        decide(Request(DOMAIN, [Descriptor((("user", value(rng.randrange(k))),))]))
    print("filled", flush=True)
    sys.stdin.readline()
    # Each request is made just before its decision, as a decoded one is: built beforehand,
    # the requests themselves would be cold lines at every K.
    for _ in range(calls):
        decide(Request(DOMAIN, [Descriptor((("user", value(rng.randrange(k))),))]))
    print("done", flush=True)
    sys.stdin.readline()


def measure(k: int, calls: int, workdir: Path, ll_mb: int) -> dict[str, float]:
    """Events per decision at K counters."""
    out = workdir / f"callgrind.{k}.%p.out"
    prefix = f"--vgdb-prefix={workdir / 'vgdb'}"
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--cache-sim=yes",
        f"--LL={ll_mb << 20},16,64",
        f"--callgrind-out-file={out}",
        prefix,
        sys.executable,
        __file__,
        "--child",
        str(k),
        "--calls",
        str(calls),
    ]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "filled":
            raise RuntimeError(f"K={k}: the child did not fill its store")
        control = ["callgrind_control", prefix]
        subprocess.run([*control, "-i", "on", str(proc.pid)], check=True, capture_output=True)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"K={k}: the child did not finish")
        subprocess.run([*control, "-i", "off", str(proc.pid)], check=True, capture_output=True)
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    dump = workdir / f"callgrind.{k}.{proc.pid}.out"
    totals = _totals(dump)
    return {event: totals[event] / calls for event in EVENTS}


def _totals(dump: Path) -> dict[str, int]:
    text = dump.read_text()
    events = re.search(r"^events: (.*)$", text, re.M)
    # `totals`: the summary line of a run instrumented only part of the time reads 0.
    summary = re.search(r"^totals: (.*)$", text, re.M)
    if events is None or summary is None:
        raise RuntimeError(f"{dump}: no totals")
    return dict(zip(events.group(1).split(), map(int, summary.group(1).split()), strict=False))


def main() -> int:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keyspaces", type=int, nargs="+", default=[1, 1000, 100_000, 1_000_000])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--keep", type=Path, help="keep the callgrind dumps in this folder")
    parser.add_argument("--ll-mb", type=int, default=32, help="simulated last level, MB")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.calls)
        return 0
    if shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="keyspace-misses-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for k in args.keyspaces:
            results[str(k)] = measure(k, args.calls, workdir, args.ll_mb)
            print(
                f"K={k:>9,}: " + ", ".join(f"{e} {v:,.1f}" for e, v in results[str(k)].items()),
                file=sys.stderr,
                flush=True,
            )
    base = results[str(args.keyspaces[0])]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.calls:,} decisions each,"
        f" last level {args.ll_mb} MB"
    )
    print("| K | Ir / decision | D1 misses | LL misses | Ir vs first |")
    print("|---|---:|---:|---:|---:|")
    for k, r in results.items():
        print(
            f"| {int(k):,} | {r['Ir']:,.0f} | {r['D1mr'] + r['D1mw']:.1f} | "
            f"{r['DLmr'] + r['DLmw']:.2f} | {r['Ir'] / base['Ir']:.2f}× |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
