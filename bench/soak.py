"""Soak: N minutes of mixed valid, malformed and oversized traffic, hostile clients, reloads
and Redis deaths (the hardening's closing benchmark).

    .venv/bin/python bench/soak.py                 # 30 minutes
    .venv/bin/python bench/soak.py --minutes 1     # a smoke run

One `ratelimitd serve` on a redis-server of its own. Every second the driver sends, over gRPC
(the native transport, one channel) and over `/json` (keep-alive HTTP/1.1):
valid one-descriptor requests on a limited key (some over their limit), random bytes
(gRPC INTERNAL / `/json` 400) and requests over MAX_DESCRIPTORS_PER_REQUEST (RESOURCE_EXHAUSTED
/ 400). The config is rewritten every 10 s (its limit alternates, so every load is a change),
and Redis is killed (SIGKILL) and restarted on its port twice, at a third and two thirds of
the run, down for 5 s each.

With `--attackers` (the default), every 10 s one round of the hostile clients of
tests/support/attacks.py joins in, each held until the next round: a zero-window connection
with 50 answered calls, 5 connections with partial 4 MiB bodies, an HPACK bomb, 100 gRPC and
100 HTTP connections that never send anything, a /json client that pipelines 1 MiB requests
and never reads, 5 answered 1 MiB calls with a grpc-timeout of 99999999H, a 466,000-descriptor
request, a length prefix of 2^32-1 and 100 connections to the Prometheus listener that never
send anything; and, each in a thread of its own for up to a second, one connection per kind
streaming frames that do no work (empty DATA, PRIORITY, WINDOW_UPDATE, an unknown type) and
one sending HPACK bomb blocks without pause, counted by whether the daemon cut them off;
a request of 1,000 limit overrides with distinct 4,000-byte values (request-named series), 2,000
token-budget reserves with distinct transaction ids never settled, and 2 `/stats` and 2
`/metrics` pages never read.
Each is counted per minute as `attack <kind>`.

Reported per minute: answers by kind, p99 of the valid calls per transport, the daemon's RSS
and open descriptors; and the one figure that must be 0: valid answers on the limited key
that came back OK *without* a limit (a config that turned a limit off). Writes
bench/results/soak.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

import grpc  # noqa: E402
from support import attacks  # noqa: E402
from support.attacks import percentile  # noqa: E402
from support.daemon import (  # noqa: E402
    daemon_environment,
    metrics_port,
    prometheus_env,
    start_daemon,
    write_config,
)
from support.machine import describe, machine_info  # noqa: E402
from support.process import start_bound  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from ratelimitd.messages import OK  # noqa: E402
from ratelimitd.transport.grpc import METHOD_PATH  # noqa: E402
from ratelimitd.transport.protocodec import decode_response, encode_request  # noqa: E402

CONFIG = """\
domain: soak
descriptors:
  - key: user
    rate_limit: {{unit: second, requests_per_unit: {limit}}}
"""
USERS = 50  # one limited key per user; user0 is hammered past its limit
MAX_DESCRIPTORS = 1024
OVERSIZED = MAX_DESCRIPTORS + 1


class Minute:
    """What one minute of the run saw."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.grpc_ms: list[float] = []
        self.json_ms: list[float] = []
        self.unlimited = 0
        self.rss_kib = 0
        self.fds = 0


class Soak:
    def __init__(
        self,
        daemon: Any,
        redis: RedisServer,
        env: dict[str, str],
        minutes: float,
        attackers: bool = True,
    ):
        self.daemon = daemon
        self.attackers = attackers
        self.redis = redis
        self.env = env
        self.seconds = minutes * 60
        self.minutes: list[Minute] = []
        self.events: list[str] = []
        self.start = 0.0
        self.rng = random.Random(1)
        self.metrics = metrics_port(env)

    def now_minute(self) -> Minute:
        i = int((time.monotonic() - self.start) // 60)
        while len(self.minutes) <= i:
            self.minutes.append(Minute())
        return self.minutes[i]

    # -- gRPC ----------------------------------------------------------------------------

    async def grpc_call(self, channel: grpc.aio.Channel, kind: str, body: bytes) -> None:
        m = self.now_minute()
        t0 = time.perf_counter()
        try:
            raw = await channel.unary_unary(METHOD_PATH)(body, timeout=5)
        except grpc.aio.AioRpcError as err:
            m.kinds[f"grpc {kind}: {err.code().name}"] += 1
            return
        ms = (time.perf_counter() - t0) * 1000
        reply = decode_response(raw)
        m.kinds[f"grpc {kind}: OK code={reply.overall_code}"] += 1
        if kind == "valid":
            m.grpc_ms.append(ms)
            status = reply.statuses[0]
            if reply.overall_code == OK and status.rule is None:
                m.unlimited += 1

    # -- /json over one keep-alive connection -------------------------------------------------

    async def json_call(self, conn: list[Any], kind: str, body: bytes) -> None:
        m = self.now_minute()
        t0 = time.perf_counter()
        try:
            if not conn:
                conn.extend(await asyncio.open_connection("127.0.0.1", self.daemon.http_port))
            reader, writer = conn
            writer.write(
                b"POST /json HTTP/1.1\r\nHost: soak\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            payload = await reader.readexactly(length)
            status = int(head.split(b" ")[1])
            if b"connection: close" in head.lower():
                writer.close()
                conn.clear()
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            m.kinds[f"json {kind}: {type(exc).__name__}"] += 1
            conn.clear()
            return
        m.kinds[f"json {kind}: {status}"] += 1
        if kind == "valid":
            m.json_ms.append((time.perf_counter() - t0) * 1000)
            if status == 200:
                statuses = json.loads(payload).get("statuses", [{}])
                if "currentLimit" not in statuses[0]:
                    m.unlimited += 1

    # -- the run -----------------------------------------------------------------------------

    def valid(self) -> bytes:
        user = "user0" if self.rng.random() < 0.3 else f"user{self.rng.randrange(1, USERS)}"
        return encode_request("soak", [[("user", user)]])

    def valid_json(self) -> bytes:
        user = "user0" if self.rng.random() < 0.3 else f"user{self.rng.randrange(1, USERS)}"
        return json.dumps(
            {"domain": "soak", "descriptors": [{"entries": [{"key": "user", "value": user}]}]}
        ).encode()

    async def traffic(self) -> None:
        oversized = encode_request("soak", [[("user", f"u{i}")] for i in range(OVERSIZED)])
        oversized_json = json.dumps(
            {
                "domain": "soak",
                "descriptors": [
                    {"entries": [{"key": "user", "value": f"u{i}"}]} for i in range(OVERSIZED)
                ],
            }
        ).encode()
        conn: list[Any] = []
        async with grpc.aio.insecure_channel(self.daemon.grpc_target) as channel:
            while time.monotonic() - self.start < self.seconds:
                tick = time.monotonic()
                calls = [self.grpc_call(channel, "valid", self.valid()) for _ in range(80)]
                calls += [self.grpc_call(channel, "malformed", os.urandom(64)) for _ in range(5)]
                calls.append(self.grpc_call(channel, "oversized", oversized))
                await asyncio.gather(*calls)
                for _ in range(30):
                    await self.json_call(conn, "valid", self.valid_json())
                await self.json_call(conn, "malformed", b"{not json" + os.urandom(8))
                await self.json_call(conn, "oversized", oversized_json)
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

    async def reloads(self) -> None:
        limit = 20
        while time.monotonic() - self.start < self.seconds:
            await asyncio.sleep(10)
            limit = 21 if limit == 20 else 20
            write_config(self.env, "soak.yaml", CONFIG.format(limit=limit))

    async def redis_deaths(self) -> None:
        for at in (self.seconds / 3, 2 * self.seconds / 3):
            await asyncio.sleep(max(0.0, self.start + at - time.monotonic()))
            self.events.append(f"{time.monotonic() - self.start:.0f} s: Redis killed")
            self.redis.kill()
            await asyncio.sleep(5)
            await asyncio.to_thread(self.redis.start)
            self.events.append(f"{time.monotonic() - self.start:.0f} s: Redis back")

    async def attack_rounds(self) -> None:
        """One round of every hostile client each 10 s, held until the next round."""
        held: list[attacks.Held] = []
        d = self.daemon
        huge = attacks.many_descriptors("soak", 466_000)
        while time.monotonic() - self.start < self.seconds - 10:
            tick = time.monotonic()
            for h in held:
                h.close()
            held = []
            rounds: list[tuple[str, Any]] = [
                ("zero window", attacks.zero_window(d.grpc_port, 50, 64 * 1024, "soak")),
                ("partial bodies", attacks.partial_bodies(d.grpc_port, 5, 4 << 20, 3 << 20)),
                ("hpack bomb", self._bomb()),
                ("silent grpc", asyncio.to_thread(attacks.silent_sockets, d.grpc_port, 100)),
                ("silent http", asyncio.to_thread(attacks.silent_sockets, d.http_port, 100)),
                (
                    "slow reader",
                    asyncio.to_thread(attacks.slow_json_reader, d.http_port, 64, 1 << 20, 1.0),
                ),
                ("deadlines", attacks.answered_deadline_calls(d.grpc_port, 5, 1 << 20, "soak")),
                ("huge request", self._huge(huge)),
                ("negative prefix", attacks.negative_prefix(d.grpc_port)),
                ("silent metrics", asyncio.to_thread(attacks.silent_sockets, self.metrics, 100)),
                (
                    "long series",
                    attacks.long_series(d.grpc_target, 1, domain="soak", tag=f"{tick:.0f}-"),
                ),
                (
                    "budget transactions",
                    attacks.budget_transactions(d.grpc_target, 2, tag=f"{tick:.0f}-"),
                ),
                (
                    "unread stats",
                    asyncio.to_thread(attacks.unread_pages, d.debug_port, "/stats", 2),
                ),
                (
                    "unread metrics",
                    asyncio.to_thread(attacks.unread_pages, self.metrics, "/metrics", 2),
                ),
            ]
            # Connections that only cost loop time, each in a thread of its own for up to a
            # second: counted by whether the daemon cut them off.
            floods = {
                f"{kind} flood": attacks.in_thread(
                    lambda kind=kind: attacks.frame_flood(d.grpc_port, kind, 1)
                )
                for kind in attacks.IDLE_FRAME_KINDS
            }
            floods["hpack bomb flood"] = attacks.in_thread(
                lambda: attacks.hpack_bomb_flood(d.grpc_port, 1)
            )
            for kind, coro in rounds:
                try:
                    result = await coro
                except (OSError, AssertionError, asyncio.IncompleteReadError) as exc:
                    self.now_minute().kinds[f"attack {kind}: {type(exc).__name__}"] += 1
                    continue
                if isinstance(result, attacks.Held):
                    held.append(result)
                self.now_minute().kinds[f"attack {kind}"] += 1
            for kind, flood in floods.items():
                try:
                    cut = await flood
                except (OSError, AssertionError) as exc:
                    self.now_minute().kinds[f"attack {kind}: {type(exc).__name__}"] += 1
                    continue
                self.now_minute().kinds[
                    f"attack {kind}: {'cut off' if cut else 'NOT cut off'}"
                ] += 1
            await asyncio.sleep(max(0.0, 10.0 - (time.monotonic() - tick)))
        for h in held:
            h.close()

    async def _bomb(self) -> attacks.Held:
        raw = await attacks.hpack_bomb(self.daemon.grpc_port, 2)
        return attacks.Held(clients=[raw])

    async def _huge(self, body: bytes) -> None:
        async with grpc.aio.insecure_channel(self.daemon.grpc_target) as channel:
            with contextlib.suppress(grpc.aio.AioRpcError):  # RESOURCE_EXHAUSTED
                await channel.unary_unary(METHOD_PATH)(body, timeout=10)

    async def probe(self) -> None:
        pid = self.daemon.pid
        while time.monotonic() - self.start < self.seconds:
            m = self.now_minute()
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        m.rss_kib = int(line.split()[1])
            m.fds = len(os.listdir(f"/proc/{pid}/fd"))
            await asyncio.sleep(5)

    async def run(self) -> None:
        self.start = time.monotonic()
        tasks = [self.traffic(), self.reloads(), self.redis_deaths(), self.probe()]
        if self.attackers:
            tasks.append(self.attack_rounds())
        await asyncio.gather(*tasks)


def report(soak: Soak, machine: dict[str, object], command: str) -> tuple[str, dict[str, Any]]:
    kinds: Counter[str] = Counter()
    for m in soak.minutes:
        kinds.update(m.kinds)
    unlimited = sum(m.unlimited for m in soak.minutes)
    rows = [
        "| minute | answers | gRPC valid p99 ms | /json valid p99 ms | RSS KiB | open fds |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i, m in enumerate(soak.minutes):
        rows.append(
            f"| {i + 1} | {sum(m.kinds.values()):,} | {percentile(m.grpc_ms, 0.99):.1f} | "
            f"{percentile(m.json_ms, 0.99):.1f} | {m.rss_kib:,} | {m.fds} |"
        )
    lines = [
        "# Soak",
        "",
        f"Command: `{command}`. {soak.seconds / 60:g} minutes; a config reload every 10 s;",
        "Redis killed (SIGKILL) and restarted twice, down 5 s each"
        + (
            "; every 10 s a round of every hostile client (`attack ...` below), held until "
            "the next."
            if soak.attackers
            else "."
        ),
        "The load generator, the daemon and Redis share the machine's 2 cores.",
        "",
        f"**Valid answers on the limited key that came back OK without a limit: {unlimited}.**",
        "",
        "Events: " + "; ".join(soak.events) + ".",
        "",
        "## Answers by kind (whole run)",
        "",
        "| kind | count |",
        "|---|---:|",
        *[f"| {k} | {v:,} |" for k, v in sorted(kinds.items())],
        "",
        "## Per minute",
        "",
        *rows,
        "",
        "## Machine",
        "",
        *describe(machine),
    ]
    data = {
        "command": command,
        "minutes": soak.seconds / 60,
        "unlimited_answers": unlimited,
        "events": soak.events,
        "kinds": dict(kinds),
        "per_minute": [
            {
                "kinds": dict(m.kinds),
                "grpc_p99_ms": percentile(m.grpc_ms, 0.99),
                "json_p99_ms": percentile(m.json_ms, 0.99),
                "rss_kib": m.rss_kib,
                "fds": m.fds,
            }
            for m in soak.minutes
        ],
        "machine": machine,
    }
    return "\n".join(lines) + "\n", data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--no-attackers", dest="attackers", action="store_false", help="valid traffic only"
    )
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "soak.md")
    args = parser.parse_args()
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="ratelimitd-soak-") as tmp:
        work = Path(tmp)
        redis = start_bound(lambda: RedisServer(work / "redis"))
        env = daemon_environment(
            work / "runtime",
            BACKEND_TYPE="redis",
            REDIS_SOCKET_TYPE="tcp",
            REDIS_URL=redis.address,
            RUNTIME_WATCH_ROOT="false",
            LOG_LEVEL="warn",
            **prometheus_env(),
        )
        write_config(env, "soak.yaml", CONFIG.format(limit=20))
        write_config(env, "llm.yaml", attacks.BUDGET_CONFIG)
        daemon = start_daemon(env, work)
        try:
            soak = Soak(daemon, redis, env, args.minutes, args.attackers)
            asyncio.run(soak.run())
        finally:
            daemon.close()
            redis.close()
    command = ".venv/bin/python bench/soak.py" + (
        f" --minutes {args.minutes:g}" if args.minutes != 30 else ""
    )
    text, data = report(soak, machine, command)
    args.output.write_text(text)
    args.output.with_suffix(".json").write_text(json.dumps(data, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
