"""RLQS end to end: stock Envoy 1.40 processes (the rate_limit_quota filter) reporting to
ratelimitd, which divides one limit among them (support.envoy_rlqs has the filter config).

Traffic is counted by the wall-clock minute it was answered in, the daemon's windows: every
minute the run touches must admit at most the limit (plus the per-Envoy first-assignment
gap, none with a DENY_ALL no_assignment_behavior).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for
from support.daemon import DaemonProcess, daemon_environment, start_daemon, write_config
from support.envoy_rlqs import rules, start_envoy_rlqs
from support.envoy_server import Envoy
from support.process import Proc, start_bound
from support.redis_server import RedisServer

LIMIT = 20  # per minute
CONFIG = rules(LIMIT, "minute")
# The first-assignment gap each Envoy may add: a subscription's first requests pass
# before its first assignment arrives, so two Envoys admit at most L + 2 per window.
GAP = 2
# Seconds of traffic: three report periods and more, so shares follow the reports.
TRAFFIC_SECONDS = 18.0
REQUESTS_PER_SECOND = 8


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.close()


def daemon(root: Path, procs: list[Proc], transport: str = "native", **env: str) -> DaemonProcess:
    runtime = root / f"runtime-{len(procs)}"
    settings = {"BACKEND_TYPE": "memory", "LOG_LEVEL": "warning", "GRPC_TRANSPORT": transport}
    environ = daemon_environment(runtime, **(settings | {"RLQS_BUCKET_KEYS": "name,user"} | env))
    write_config(environ, "rlqs.yaml", CONFIG)
    d = start_daemon(environ, root)
    procs.append(d)
    return d


def envoy(root: Path, procs: list[Proc], rlqs_port: int, **config: str) -> Envoy:
    e = start_envoy_rlqs(root, rlqs_port, **config)
    procs.append(e)
    return e


def skewed_traffic(heavy: Envoy, light: Envoy, user: str) -> dict[int, Counter[str]]:
    """Paced requests of one user, nine through `heavy` for one through `light`, for
    TRAFFIC_SECONDS: per wall-clock minute, the 200s and 429s of each Envoy."""
    windows: dict[int, Counter[str]] = {}
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < TRAFFIC_SECONDS:
        which, proxy = ("light", light) if i % 10 == 9 else ("heavy", heavy)
        status = proxy.request("/", {"x-user": user}).status
        assert status in (200, 429), status
        count = windows.setdefault(int(time.time() // 60), Counter())
        count[f"{which} {status}"] += 1
        i += 1
        # Paced, not timed: the next request waits for its slot, whatever the load.
        pause = start + i / REQUESTS_PER_SECOND - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    return windows


def admitted(count: Counter[str]) -> int:
    return count["heavy 200"] + count["light 200"]


def check_bound(windows: dict[int, Counter[str]]) -> None:
    for minute, count in windows.items():
        assert admitted(count) <= LIMIT + GAP, (minute, count)
    # The quota is used, not withheld: the busiest window admitted a good part of it.
    assert max(admitted(c) for c in windows.values()) >= LIMIT // 2, windows


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_two_envoys_with_skewed_traffic_admit_at_most_the_limit(
    tmp_path: Path, procs: list[Proc], transport: str
) -> None:
    d = daemon(tmp_path, procs, transport)
    heavy = envoy(tmp_path, procs, d.grpc_port)
    light = envoy(tmp_path, procs, d.grpc_port)
    windows = skewed_traffic(heavy, light, f"skew-{transport}")
    check_bound(windows)
    # One stream per Envoy process, both holding the bucket.
    stats = d.stats()
    assert stats["ratelimit.rlqs.bucket.rlqs.name_api.user_skew-" + transport + ".streams"] == 2


def test_two_replicas_on_one_redis_share_the_limit(tmp_path: Path, procs: list[Proc]) -> None:
    redis = start_bound(lambda: RedisServer(tmp_path / "redis"))
    procs.append(redis)
    on_redis = {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redis.address}
    # One replica per transport: the counters, not the process, are shared.
    first = daemon(tmp_path, procs, "native", **on_redis)
    second = daemon(tmp_path, procs, "grpcio", **on_redis)
    heavy = envoy(tmp_path, procs, first.grpc_port)
    light = envoy(tmp_path, procs, second.grpc_port)
    check_bound(skewed_traffic(heavy, light, "replicas"))


def exhaust(e: Envoy, user: str) -> None:
    """Requests until the bucket's assignment denies (its tokens spent)."""
    seen: list[int] = []

    def denied() -> bool:
        seen.append(e.request("/", {"x-user": user}).status)
        # A 429 after a 200: the assignment came, and its tokens are spent.
        return 200 in seen and seen[-1] == 429

    wait_for(denied, 30, "the assignment's tokens spent")


def spent_assignment(
    tmp_path: Path, procs: list[Proc], ttl: str, user: str
) -> tuple[DaemonProcess, Envoy]:
    """A daemon granting assignments for `ttl`, and an Envoy whose assignment for `user` is
    spent."""
    d = daemon(tmp_path, procs, RLQS_ASSIGNMENT_TTL=ttl)
    e = envoy(tmp_path, procs, d.grpc_port)
    exhaust(e, user)
    return d, e


def test_sigkill_assignments_hold_until_their_ttl_then_the_fallback(
    tmp_path: Path, procs: list[Proc]
) -> None:
    d, e = spent_assignment(tmp_path, procs, "8s", "killed")
    d.kill()
    killed = time.monotonic()
    # The server is gone; the active assignment is still enforced...
    assert e.request("/", {"x-user": "killed"}).status == 429
    # ...until its TTL ends: then the expired-assignment fallback (ALLOW_ALL) admits.
    wait_for(lambda: e.request("/", {"x-user": "killed"}).status == 200, 60, "the fallback")
    assert time.monotonic() - killed > 1.0


def test_sigterm_sends_ttl_zero_so_envoy_falls_back_at_once(
    tmp_path: Path, procs: list[Proc]
) -> None:
    # A TTL far longer than the wait below: only the TTL 0 can end the assignment in time.
    d, e = spent_assignment(tmp_path, procs, "600s", "drained")
    assert d.terminate() == 0
    wait_for(lambda: e.request("/", {"x-user": "drained"}).status == 200, 60, "the fallback")
