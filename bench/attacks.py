"""The attack run: each hostile client of tests/support/attacks.py against a fresh daemon, with
the figure that showed the defect (RSS, descriptors, daemon CPU, what a well-behaved client
got), so that one script measures the code before and after the hardening.

    .venv/bin/python bench/attacks.py --label after                 # this tree
    .venv/bin/python bench/attacks.py --label before --code /tmp/old # another tree's
                                                                    # ratelimitd/ (built)

Each label's figures go to bench/results/attacks-<label>.json; bench/results/attacks.md is
rewritten with every label found, side by side. RSS and descriptors are read from /proc
(the daemon's own process), CPU as the daemon's user+system seconds: no wall-clock speed
is compared. The driver shares the machine's 2 cores with the daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from support import attacks, free_port, http_get, wait_for
from support.daemon import (
    DaemonProcess,
    LowNofileDaemon,
    daemon_environment,
    metrics_port,
    prometheus_env,
    start_daemon,
    write_config,
)
from support.h2raw import CONFIG as GRPC_CONFIG
from support.machine import describe, machine_info
from support.memcached import Memcached
from support.pki import Pki
from support.process import start_bound
from support.redis_server import RedisServer
from support.sidecar import usage_sidecar

from ratelimitd.messages import Descriptor
from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.protocodec import decode_response, encode_request
from sidecars.usage.plans import load_plans
from sidecars.usage.settings import Settings as UsageSettings
from sidecars.usage.store import UsageStore

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


@dataclass
class Run:
    """One daemon of a scenario and the context to drive it."""

    daemon: DaemonProcess
    env: dict[str, str]
    work: Path

    def mib(self) -> float:
        return round(self.daemon.rss_kib() / 1024, 1)


Scenario = Callable[[Run], Awaitable[dict[str, Any]]]
SCENARIOS: dict[str, tuple[str, dict[str, str], Scenario]] = {}


def scenario(name: str, title: str, **env: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = (title, env, fn)
        return fn

    return register


async def grpc_served(target: str, creds: Any = None) -> str:
    """What a well-behaved client gets for one decision: OK, or the status code name."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channel = (
        grpc.aio.secure_channel(target, creds, options=options)
        if creds is not None
        else grpc.aio.insecure_channel(target, options=options)
    )
    async with channel:
        try:
            raw = await channel.unary_unary(METHOD_PATH)(
                encode_request("test", [[("k", "v")]]), timeout=5
            )
        except grpc.aio.AioRpcError as err:
            return err.code().name
    return "OK" if decode_response(raw).overall_code == 1 else "not OK"


@scenario("deadlines", "1. answered calls with grpc-timeout 99999999H (3 x 100 x 1 MiB)")
async def deadlines(run: Run) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_mib_start": run.mib()}
    for round_ in (1, 2, 3):
        await attacks.answered_deadline_calls(run.daemon.grpc_port, 100, MIB)
        await asyncio.sleep(1)
        out[f"rss_mib_after_round_{round_}"] = run.mib()
    return out


@scenario("zero_window", "2. INITIAL_WINDOW_SIZE=0, 256 x 4 MiB calls on one connection")
async def zero_window(run: Run) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_mib_start": run.mib()}
    held = await attacks.zero_window(run.daemon.grpc_port, 256, 4 * MIB)
    out["rss_mib_held"] = run.mib()
    await asyncio.sleep(15)  # past GRPC_WRITE_TIMEOUT (10 s)
    out["rss_mib_15s_later"] = run.mib()
    raw = held.clients[0]
    with contextlib.suppress(AssertionError):
        await raw.read_until(lambda f: False, timeout=0.5)
    out["calls_reset"] = sum(1 for f in raw.frames if f.type == 0x3)
    held.close()
    return out


@scenario("hpack_bomb", "3. HPACK bomb: 20 blocks of 147 KB (one 4,000-byte header x 143,000)")
async def hpack_bomb(run: Run) -> dict[str, Any]:
    cpu = run.daemon.cpu()
    raw = await attacks.hpack_bomb(run.daemon.grpc_port, 20)
    with contextlib.suppress(AssertionError):  # every block answered (or the connection gone)
        await raw.read_until(lambda f: f.type == 0x3 and f.stream == 39, timeout=30)
    spent = run.daemon.cpu() - cpu
    raw.writer.close()
    return {
        "daemon_cpu_ms_per_block": round(spent * 1000 / 20, 1),
        "served_after": await grpc_served(run.daemon.grpc_target),
    }


@scenario(
    "tls_handshakes",
    "4/14. 3,000 TLS connections that never finish the handshake (GRPC_MAX_CONNECTIONS=1000)",
    GRPC_MAX_CONNECTIONS="1000",
)
async def tls_handshakes(run: Run) -> dict[str, Any]:
    fds, rss = run.daemon.open_fds(), run.mib()
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"  # the start of a ClientHello
    held = await asyncio.to_thread(attacks.silent_sockets, run.daemon.grpc_port, 3000, hello)
    await asyncio.sleep(2)
    pki: Pki = run.env["_pki"]  # type: ignore[assignment]
    out = {
        "daemon_fds_before": fds,
        "daemon_fds_during": run.daemon.open_fds(),
        "rss_mib_before": rss,
        "rss_mib_during": run.mib(),
        "tls_client_during": await grpc_served(run.daemon.grpc_target, pki.creds(pki.ca)),
        "flood_connections_open": held.open_sockets(),
    }
    held.close()
    await asyncio.sleep(10)
    out["rss_mib_10s_after"] = run.mib()
    out["daemon_fds_10s_after"] = run.daemon.open_fds()
    return out


@scenario(
    "silent_grpc",
    "5. 1,100 connections that never send the HTTP/2 preface (GRPC_MAX_CONNECTIONS=1000)",
    GRPC_MAX_CONNECTIONS="1000",
)
async def silent_grpc(run: Run) -> dict[str, Any]:
    held = await asyncio.to_thread(attacks.silent_sockets, run.daemon.grpc_port, 1100)
    await asyncio.sleep(1)
    out = {"new_client_during": await grpc_served(run.daemon.grpc_target)}
    await asyncio.sleep(25)  # past GRPC_CONNECTION_TIMEOUT (20 s)
    out["silent_connections_open_after_26s"] = held.open_sockets()
    held.close()
    return out


@scenario("idle_http", "6. 3,000 idle HTTP connections under ulimit -n 2048", _NOFILE="2048")
async def idle_http(run: Run) -> dict[str, Any]:
    held = await asyncio.to_thread(attacks.silent_sockets, run.daemon.http_port, 3000)
    await asyncio.sleep(1)
    try:
        status = run.daemon.http("/healthcheck", timeout=3)[0]
    except OSError as exc:
        status = type(exc).__name__  # type: ignore[assignment]
    try:
        debug = run.daemon.debug("/rlconfig", timeout=3)[0]
    except OSError as exc:
        debug = type(exc).__name__  # type: ignore[assignment]
    held.close()
    return {"healthcheck_during": status, "debug_during": debug}


@scenario("slow_reader", "7. /json: 64 pipelined 1 MiB requests, answers never read")
async def slow_reader(run: Run) -> dict[str, Any]:
    rss = run.mib()
    held = await asyncio.to_thread(attacks.slow_json_reader, run.daemon.http_port, 64, MIB, 5.0)
    out = {"rss_mib_before": rss, "rss_mib_held": run.mib()}
    await asyncio.sleep(15)  # past HTTP_WRITE_TIMEOUT and HTTP_READ_TIMEOUT (10 s)
    out["connection_open_after_15s"] = held.open_sockets()
    out["rss_mib_15s_later"] = run.mib()
    held.close()
    return out


@scenario("memory_values", "8. memory backend: 300 unique 1 MB descriptor values (/json)")
async def memory_values(run: Run) -> dict[str, Any]:
    rss = run.mib()
    statuses: dict[int, int] = {}
    for i in range(300):
        value = f"{i:04d}" + "x" * (1_000_000 - 4)
        entries = [{"key": "k", "value": value}]
        body = json.dumps({"domain": "d", "descriptors": [{"entries": entries}]}).encode()
        status = (await asyncio.to_thread(run.daemon.http, "/json", body))[0]
        statuses[status] = statuses.get(status, 0) + 1
    return {"rss_mib_before": rss, "rss_mib_after": run.mib(), "statuses": statuses}


@scenario(
    "memory_keys",
    "8. memory backend: 200,000 new keys (MEMORY_MAX_KEYS=100000)",
    MEMORY_MAX_KEYS="100000",
)
async def memory_keys(run: Run) -> dict[str, Any]:
    rss = run.mib()
    async with grpc.aio.insecure_channel(run.daemon.grpc_target) as channel:
        call = channel.unary_unary(METHOD_PATH)
        for batch in range(200):
            request = encode_request("test", [[("k", f"{batch}-{i}")] for i in range(1000)])
            await call(request, timeout=30)
    return {"rss_mib_before": rss, "rss_mib_after": run.mib()}


@scenario("partial_bodies", "9. 100 connections, each all but 1 KiB of a 4 MiB message")
async def partial_bodies(run: Run) -> dict[str, Any]:
    rss = run.mib()
    held = await attacks.partial_bodies(run.daemon.grpc_port, 100, 4 * MIB - 16, 4 * MIB - 1024)
    await asyncio.sleep(1)
    out = {"rss_mib_before": rss, "rss_mib_held": run.mib()}
    refused = 0
    for raw in held.clients:
        with contextlib.suppress(AssertionError):  # read what has arrived
            await raw.read_until(lambda f: False, timeout=0.1)
        refused += any(f.type == 0x1 and f.stream == 1 for f in raw.frames)
    out["calls_answered_before_complete"] = refused
    held.close()
    await asyncio.sleep(3)
    out["rss_mib_3s_after"] = run.mib()
    return out


@scenario("huge_request", "10. one 4 MiB request of 466,000 descriptors, 10 times")
async def huge_request(run: Run) -> dict[str, Any]:
    body = attacks.many_descriptors("test", 466_000)
    cpu = run.daemon.cpu()
    async with grpc.aio.insecure_channel(run.daemon.grpc_target) as channel:
        for _ in range(10):
            try:
                await channel.unary_unary(METHOD_PATH)(body, timeout=30)
                answer = "OK"
            except grpc.aio.AioRpcError as err:
                answer = f"{err.code().name}: {err.details()}"
    return {"daemon_cpu_ms_per_request": round((run.daemon.cpu() - cpu) * 100, 1), "answer": answer}


@scenario("negative_prefix", "11. gRPC length prefix 0xFFFFFFFF")
async def negative_prefix(run: Run) -> dict[str, Any]:
    start = time.monotonic()
    try:
        end = await attacks.negative_prefix(run.daemon.grpc_port)
    except AssertionError:
        end = {"grpc-status": "none within 5 s"}
    return {
        "answer": f"{end.get('grpc-status')} {end.get('grpc-message', '')}".strip(),
        "seconds_to_answer": round(time.monotonic() - start, 1),
    }


@scenario("memcache_refund", "12. memcached: 10 hits, refund 3, read the counter", _MEMCACHE="1")
async def memcache_refund(run: Run) -> dict[str, Any]:
    key_request = encode_request("test", [[("k", "refund")]], hits_addend=10)
    refund = encode_request("test", [Descriptor((("k", "refund"),), None, 3, True)])
    check = encode_request("test", [Descriptor((("k", "refund"),), None, 0)])
    async with grpc.aio.insecure_channel(run.daemon.grpc_target) as channel:
        call = channel.unary_unary(METHOD_PATH)
        await call(key_request, timeout=5)
        await asyncio.sleep(0.5)  # memcache increments are written after the answer
        await call(refund, timeout=5)
        await asyncio.sleep(0.5)
        reply = decode_response(await call(check, timeout=5))
    memcached: Memcached = run.env["_memcached"]  # type: ignore[assignment]
    stored = memcached.command(b"get " + _memcache_key().encode())
    return {
        "stored": stored.split(b"\r\n")[1].decode() if b"VALUE" in stored else "absent",
        "remaining_after_refund": reply.statuses[0].limit_remaining,
        "limit": 1_000_000,
    }


def latencies(took: list[float]) -> dict[str, float]:
    """p50 and p99 of a probe's decisions, ms."""
    return {
        "probe_p50_ms": round(attacks.percentile(took, 0.5) * 1000, 1),
        "probe_p99_ms": round(attacks.percentile(took, 0.99) * 1000, 1),
    }


async def quiet(run: Run) -> dict[str, Any]:
    """The load average, and the probe's latencies over 5 s with no attack."""
    out: dict[str, Any] = {"load_average": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    probe = latencies(await attacks.probe(run.daemon.grpc_target, 5))
    return out | {f"quiet_{k}": v for k, v in probe.items()}


async def flooded(
    run: Run, attack: Callable[[], Awaitable[attacks.Held]], seconds: float
) -> dict[str, Any]:
    """`attack` run for `seconds` in a thread of its own while a probe decides: the probe's
    latencies, the daemon's CPU, whether the daemon closed the attacking connection."""
    cpu = run.daemon.cpu()
    flood = attacks.in_thread(attack)
    probe = latencies(await attacks.probe(run.daemon.grpc_target, seconds))
    closed = await flood
    return {
        **probe,
        "daemon_cpu_s": round(run.daemon.cpu() - cpu, 1),
        "attacker_closed_by_server": closed,
    }


@scenario(
    "idle_frames",
    "13. one connection streaming frames that do no work, 10 s per kind (empty DATA on an "
    "open stream, PRIORITY, WINDOW_UPDATE, an unknown type), a probe deciding meanwhile",
)
async def idle_frames(run: Run) -> dict[str, Any]:
    out = await quiet(run)
    port = run.daemon.grpc_port
    for kind in sorted(attacks.IDLE_FRAME_KINDS):
        figures = await flooded(run, lambda kind=kind: attacks.frame_flood(port, kind, 10), 10)
        out.update({f"{kind}_{k}": v for k, v in figures.items()})
    return out


@scenario(
    "hpack_bomb_flood",
    "14. HPACK bomb blocks (147 KB) on one connection without pause for 10 s, a probe deciding",
)
async def hpack_bomb_flood(run: Run) -> dict[str, Any]:
    out = await quiet(run)
    port = run.daemon.grpc_port
    out.update(await flooded(run, lambda: attacks.hpack_bomb_flood(port, 10), 10))
    return out


scenario(
    "idle_frames_grpcio",
    "13g. as 13, GRPC_TRANSPORT=grpcio (grpc core's HTTP/2, which this round left as it was)",
    GRPC_TRANSPORT="grpcio",
)(idle_frames)
scenario(
    "hpack_bomb_flood_grpcio",
    "14g. as 14, GRPC_TRANSPORT=grpcio",
    GRPC_TRANSPORT="grpcio",
)(hpack_bomb_flood)


def _memcache_key() -> str:
    now = int(time.time())
    return f"test_k_refund_{now - now % 60}"


@scenario(
    "long_series",
    "15. 11 requests of 1,000 overrides with distinct 4,000-byte values, then 4 /stats never read",
)
async def long_series(run: Run) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_mib_start": run.mib()}
    answers = await attacks.long_series(run.daemon.grpc_target, 11)
    out["answers"] = {a: answers.count(a) for a in set(answers)}
    out["rss_mib_after_requests"] = run.mib()
    _, page = await asyncio.to_thread(run.daemon.debug, "/stats", 120)
    out["stats_page_mib"] = round(len(page) / MIB, 1)
    del page
    held = await asyncio.to_thread(attacks.unread_pages, run.daemon.debug_port, "/stats", 4)
    await asyncio.sleep(5)
    out["rss_mib_4_unread_stats"] = run.mib()
    await asyncio.sleep(15)  # past HTTP_WRITE_TIMEOUT (10 s)
    out["unread_open_after_20s"] = held.open_sockets()
    held.close()
    out["rss_mib_after"] = run.mib()
    return out


@scenario(
    "budget_transactions",
    "16. memory backend: 300 requests of 1,000 token-budget reserves with distinct 64-byte "
    "transaction ids, never settled",
)
async def budget_transactions(run: Run) -> dict[str, Any]:
    rss = run.mib()
    counts = await attacks.budget_transactions(run.daemon.grpc_target, 300)
    stats = await asyncio.to_thread(run.daemon.stats)
    full = stats.get("ratelimit.service.rate_limit.llm.user.budget_full", 0)
    return {
        "rss_mib_before": rss,
        "rss_mib_after": run.mib(),
        "reserves": counts,
        "budget_full": int(full),
    }


@scenario(
    "idempotency_replays",
    "17. usage API, its endpoint metered, a plan of 30: the quota used up, then 20 replays "
    "of the first request's Idempotency-Key",
)
async def idempotency_replays(run: Run) -> dict[str, Any]:
    code = Path(run.env["PYTHONPATH"])
    redis = start_bound(lambda: RedisServer(run.work / "redis"))
    plans = run.work / "plans.yaml"
    plans.write_text("plans:\n  free: {limit: 30, window: rolling_30_days}\n")
    env = {
        "USAGE_REDIS_URL": redis.url,
        "USAGE_SQLITE_PATH": str(run.work / "usage.sqlite3"),
        "USAGE_PLANS_FILE": str(plans),
        "USAGE_RATELIMIT_ADDRESS": "",
        "USAGE_QUOTA_EXEMPT_PATHS": "",
    }
    store = UsageStore(UsageSettings.from_env(env), load_plans(str(plans)))
    try:
        await store.create_account("attacker", "free")
        token, _ = await store.issue_token("attacker")
    finally:
        await store.close()
    sidecar = usage_sidecar(env, run.work / "usage.log", workers=1, code=code)
    try:
        sidecar.wait_ready(60)
        sidecar.wait_steady(lambda: sidecar.get("/health").status_code == 200, "usage API", 1)
        return await asyncio.to_thread(attacks.idempotency_replays, sidecar.base, token)
    finally:
        sidecar.terminate()
        redis.close()


@scenario(
    "idle_metrics",
    "18. USE_PROMETHEUS: 3,000 idle connections to PROMETHEUS_ADDR under ulimit -n 2048",
    _NOFILE="2048",
    _METRICS="1",
)
async def idle_metrics(run: Run) -> dict[str, Any]:
    port = metrics_port(run.env)
    held = await asyncio.to_thread(attacks.silent_sockets, port, 3000)
    await asyncio.sleep(1)
    out: dict[str, Any] = {"daemon_fds_during": run.daemon.open_fds()}
    for name, probe in (
        ("healthcheck_during", lambda: run.daemon.http("/healthcheck", timeout=3)[0]),
        ("debug_during", lambda: run.daemon.debug("/rlconfig", timeout=3)[0]),
        ("scrape_during", lambda: http_get(f"http://127.0.0.1:{port}/metrics", 3)[0]),
    ):
        try:
            out[name] = await asyncio.to_thread(probe)
        except OSError as exc:
            out[name] = type(exc).__name__
    out["new_grpc_client_during"] = await grpc_served(run.daemon.grpc_target)
    out["flood_connections_open"] = held.open_sockets()
    held.close()
    return out


@scenario("second_instance", "19. a second daemon started on the same ports")
async def second_instance(run: Run) -> dict[str, Any]:
    second = DaemonProcess(run.daemon.env, run.work / "second.log")
    try:
        await asyncio.to_thread(second.proc.wait, 15)
        outcome = f"exited {second.proc.returncode}"
        if "address already in use" in second.log():
            outcome += ": address already in use"
    except subprocess.TimeoutExpired:
        outcome = "still running 15 s later (bound the ports too)"
    finally:
        second.close()
    return {"second_instance": outcome}


@scenario("unreachable_redis", "20. REDIS_URL nobody answers, then SIGTERM", _NO_DAEMON="1")
async def unreachable_redis(run: Run) -> dict[str, Any]:
    env = dict(run.env, BACKEND_TYPE="redis", REDIS_SOCKET_TYPE="tcp", LOG_LEVEL="warning")
    env["REDIS_URL"] = f"127.0.0.1:{free_port()}"
    waiting = DaemonProcess(env, run.work / "waiting.log")
    try:
        await asyncio.to_thread(wait_for, lambda: "not ready" in waiting.log(), 20)
        start = time.monotonic()
        waiting.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(waiting.proc.wait, 15)
            outcome = f"exited {waiting.proc.returncode} after {time.monotonic() - start:.1f} s"
        except subprocess.TimeoutExpired:
            outcome = "still running 15 s after SIGTERM"
    finally:
        waiting.close()
    return {"after_sigterm": outcome}


async def decision_ms(target: str, seconds: float) -> dict[str, float]:
    """One well-behaved client's decisions, one after another for `seconds`: p50 and p99 (ms,
    as the client sees them)."""
    took = await attacks.probe(target, seconds)
    return {
        "p50": round(attacks.percentile(took, 0.5) * 1000, 1),
        "p99": round(attacks.percentile(took, 0.99) * 1000, 1),
        "calls": len(took),
    }


@scenario(
    "scrapers",
    "21. 10,000 request-named series (200-byte values), 4 scrapers of /metrics at once: a "
    "valid client's decisions",
    _METRICS="1",
)
async def scrapers(run: Run) -> dict[str, Any]:
    await attacks.long_series(run.daemon.grpc_target, 10, value_bytes=200)
    port = metrics_port(run.env)
    out: dict[str, Any] = {"alone": await decision_ms(run.daemon.grpc_target, 10)}
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        loops = [pool.submit(attacks.scrape_loop, port, "/metrics", stop) for _ in range(4)]
        await asyncio.sleep(2)  # the scrapers under way
        out["with_4_scrapers"] = await decision_ms(run.daemon.grpc_target, 20)
        stop.set()
        out["scrapes_answered"] = sum(loop.result() for loop in loops)
    return out


async def measure(name: str, code: Path, work: Path) -> dict[str, Any]:
    title, extra, fn = SCENARIOS[name]
    extra = dict(extra)
    env = daemon_environment(work / "runtime", LOG_LEVEL="error", PYTHONPATH=str(code))
    env.update(BACKEND_TYPE="memory", PYTHONDONTWRITEBYTECODE="1")
    write_config(env, "test.yaml", GRPC_CONFIG)
    write_config(env, "d.yaml", attacks.JSON_CONFIG)
    write_config(env, "llm.yaml", attacks.BUDGET_CONFIG)
    context: dict[str, Any] = {}
    if name == "tls_handshakes":
        (work / "pki").mkdir()
        pki = Pki(work / "pki")
        env.update(pki.server_env())
        context["_pki"] = pki
    memcached = None
    if extra.pop("_MEMCACHE", None):
        memcached = start_bound(lambda: Memcached(work / "memcached"))
        env.update(BACKEND_TYPE="memcache", MEMCACHE_HOST_PORT=memcached.address)
        context["_memcached"] = memcached
    if extra.pop("_METRICS", None):
        env.update(prometheus_env())
    nofile = extra.pop("_NOFILE", None)
    no_daemon = extra.pop("_NO_DAEMON", None)
    env.update(extra)
    if no_daemon:
        return {"title": title, **await fn(Run(None, env, work))}  # type: ignore[arg-type]
    if nofile:
        low = lambda: LowNofileDaemon(env, work / "daemon-low.log", int(nofile))  # noqa: E731
        daemon: DaemonProcess = start_bound(low)
    else:
        daemon = start_daemon(env, work)
    try:
        figures = await fn(Run(daemon, env | context, work))
    finally:
        daemon.close()
        if memcached is not None:
            memcached.close()
    return {"title": title, **figures}


def report(results: dict[str, dict[str, Any]]) -> str:
    labels = sorted(results, key=lambda label: (label != "before", label))
    names = [n for n in SCENARIOS if any(n in results[label] for label in labels)]
    lines = [
        "# Attack run",
        "",
        "Command: `.venv/bin/python bench/attacks.py --label L [--code DIR]`; each scenario",
        "on a fresh daemon (memory backend unless said), figures from /proc of the daemon.",
        "`before`: the tree the hardening started from, built (`--code`); `after`: this one.",
        "Scenarios 1-12 are the round that fixed them (its `before` is the tree it started",
        "from); 13-21 this round's, whose `before` is d421260 (13g and 14g: the grpcio",
        "transport, measured after only). Scenarios 13, 14 and 21 give wall-clock latencies",
        "of a probe client on a shared 2-core machine: 13 and 14 state the load average.",
        "",
    ]
    for name in names:
        title = next(results[label][name]["title"] for label in labels if name in results[label])
        lines += [f"## {title}", "", "| figure | " + " | ".join(labels) + " |"]
        lines.append("|---|" + "---:|" * len(labels))
        keys: list[str] = []
        for label in labels:
            for key in results[label].get(name, {}):
                if key != "title" and key not in keys:
                    keys.append(key)
        for key in keys:
            cells = [str(results[label].get(name, {}).get(key, "")) for label in labels]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Machine", "", *describe(machine_info())]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--code", type=Path, default=REPO, help="the tree whose ratelimitd runs")
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS))
    args = parser.parse_args()
    # `python -m ratelimitd` imports from its working directory first: the daemons run the
    # tree under test from there.
    os.chdir(args.code.resolve())
    results_dir = REPO / "bench" / "results"
    path = results_dir / f"attacks-{args.label}.json"
    done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for name in args.only or list(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix="ratelimitd-attack-") as tmp:
            print(f"== {name}", flush=True)
            done[name] = asyncio.run(measure(name, args.code.resolve(), Path(tmp)))
            print(json.dumps(done[name]), flush=True)
        path.write_text(json.dumps(done, indent=2))
    results = {
        p.stem.removeprefix("attacks-"): json.loads(p.read_text())
        for p in results_dir.glob("attacks-*.json")
    }
    (results_dir / "attacks.md").write_text(report(results))
    return 0


if __name__ == "__main__":
    ssl.create_default_context()  # fail early if the ssl module is unusable
    sys.exit(main())
