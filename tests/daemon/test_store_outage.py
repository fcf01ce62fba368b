"""A stalled Redis seen by a client of the daemon: the breaker in
`/healthcheck?detail` and the stats, the failure policy's answers on gRPC and `/json`, and
MAX_INFLIGHT_DECISIONS refusing with RESOURCE_EXHAUSTED / 503 instead of queueing."""

from __future__ import annotations

import hashlib
import json
import threading

import grpc
import pytest
from support import free_port, wait_for
from support.daemon import DaemonProcess, write_config

from ratelimitd.backends.redis import budget, scripts
from ratelimitd.transport.client import RateLimitError

CONFIG = """\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 100}
"""


def redis_env(daemon_env, redis_server, **extra: str) -> dict[str, str]:
    env = dict(
        daemon_env,
        BACKEND_TYPE="redis",
        REDIS_SOCKET_TYPE="tcp",
        REDIS_URL=redis_server.address,
        REDIS_REQUEST_TIMEOUT="50ms",
        **extra,
    )
    write_config(env, "d.yaml", CONFIG)
    return env


def detail(d) -> dict:
    status, body = d.http("/healthcheck?detail")
    return {"status": status, **json.loads(body)}


def test_breaker_and_allow_policy_through_the_daemon(daemon_env, redis_server, start_daemon):
    env = redis_env(
        daemon_env,
        redis_server,
        BACKEND_FAILURE_POLICY="allow",
        BACKEND_BREAKER_FAILURES="2",
        BACKEND_BREAKER_PROBE_INTERVAL="300ms",
    )
    d = start_daemon(env)
    assert detail(d) == {
        "status": 200,
        "healthy": True,
        "components": {"backend": True, "sigterm": True},
        "breakers": {"redis": "closed"},
    }
    assert d.http("/healthcheck") == (200, b"OK")  # the reference's body, unchanged
    redis_server.pause()
    try:
        for _ in range(5):
            assert d.decide("d", [("k", "a")]).overall_code == 1  # allowed
            assert d.decide_json("d", {"k": "a"})[0] == 200
        assert detail(d)["breakers"] == {"redis": "open"}
        stats = d.stats()
        assert stats["ratelimit.redis_pool.breaker_state"] == 2
        assert stats["ratelimit.service.call.should_rate_limit.failure_policy"] == 10
    finally:
        redis_server.resume()
    wait_for(lambda: d.decide("d", [("k", "b")]) and detail(d)["breakers"]["redis"] == "closed")
    assert d.decide("d", [("k", "b")]).statuses[0].limit_remaining < 100


def test_in_flight_bound_answers_resource_exhausted_and_503(
    daemon_env, redis_server, start_daemon
) -> None:
    env = redis_env(daemon_env, redis_server, MAX_INFLIGHT_DECISIONS="3")
    env["REDIS_REQUEST_TIMEOUT"] = "3s"
    d = start_daemon(env)
    assert d.decide("d", [("k", "a")]).overall_code == 1
    redis_server.pause()
    waiting = []
    try:
        for i in range(3):
            t = threading.Thread(target=d.http, args=("/json", _body(f"w{i}")), daemon=True)
            t.start()
            waiting.append(t)
        wait_for(lambda: _stat(d, "overloaded") == 0 and _waiting(d) >= 3)
        with pytest.raises(RateLimitError) as info:
            d.decide("d", [("k", "more")])
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "MAX_INFLIGHT_DECISIONS=3" in info.value.details
        assert d.http("/json", _body("more2")) == (503, b"Service Unavailable\n")
        assert _stat(d, "overloaded") == 2
    finally:
        redis_server.resume()
    for t in waiting:
        t.join(10)


def _body(value: str) -> bytes:
    return json.dumps(
        {"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": value}]}]}
    ).encode()


def _stat(d, name: str) -> float:
    return d.stats().get("ratelimit.service.call.should_rate_limit." + name, 0)


def _waiting(d) -> float:
    # The three /json requests are inside the daemon (they counted total_hits) and wait.
    return d.stats().get("ratelimit.service.rate_limit.d.k.total_hits", 0) - 1


def test_scripts_are_loaded_before_the_daemon_is_ready(
    daemon_env, redis_server, start_daemon
) -> None:
    """Every script (the algorithms', the refund's, the token budget's) is in the server's
    cache once /healthcheck answers, before any request: the first budget call after a
    start once paid NOSCRIPT and a compiling EVAL and failed `redis request timed out`."""
    start_daemon(redis_env(daemon_env, redis_server))
    sources = (
        scripts.SLIDING_WINDOW_LUA,
        scripts.TOKEN_BUCKET_LUA,
        scripts.REFUND_LUA,
        budget.BUDGET_LUA,
    )
    shas = [hashlib.sha1(source.encode()).hexdigest() for source in sources]
    reply = redis_server.command("SCRIPT", "EXISTS", *shas)
    assert reply == b"*%d\r\n" % len(shas) + b":1\r\n" * len(shas)


def test_a_redis_stall_is_logged_once_per_burst(daemon_env, redis_server, start_daemon) -> None:
    """Decisions past REDIS_REQUEST_TIMEOUT while Redis hangs: each fails (UNKNOWN, the
    default BACKEND_FAILURE_POLICY), and the burst is logged once at warning (before:
    nothing at all)."""
    d = start_daemon(redis_env(daemon_env, redis_server))
    assert d.decide("d", [("k", "a")]).overall_code == 1
    redis_server.pause()
    try:
        for i in range(5):
            with pytest.raises(RateLimitError) as info:
                d.decide("d", [("k", f"stall{i}")])
            assert info.value.code == grpc.StatusCode.UNKNOWN
            assert "redis request timed out" in info.value.details
    finally:
        redis_server.resume()
    lines = [line for line in d.log().splitlines() if "after REDIS_REQUEST_TIMEOUT" in line]
    assert len(lines) == 1, lines
    assert "WARN" in lines[0].upper()


def test_sigterm_stops_a_daemon_waiting_for_redis(daemon_env, tmp_path) -> None:
    """REDIS_URL nobody answers: the start-up retries go on (REDIS_STARTUP_*), and SIGTERM
    ends them and the process, exit 0 (before: still retrying 33 s later)."""
    env = dict(daemon_env, BACKEND_TYPE="redis", REDIS_SOCKET_TYPE="tcp")
    env["REDIS_URL"] = f"127.0.0.1:{free_port()}"
    write_config(env, "d.yaml", CONFIG)
    d = DaemonProcess(env, tmp_path / "waiting.log")
    try:
        wait_for(lambda: d.alive() and "not ready" in d.log(), 20, "a start-up retry")
        assert d.terminate(timeout=10) == 0
        assert "stopped before the backend was reached" in d.log()
    finally:
        d.close()
