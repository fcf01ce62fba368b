"""Envoy 1.40 (HTTP ratelimit filter) in front of a ratelimitd subprocess, end to end."""

from __future__ import annotations

import http.client
import re
import threading

import pytest
from support import wait_for
from support.envoy_server import Response

from .conftest import DOMAIN, Stack

CONFIG = f"""
domain: {DOMAIN}
descriptors:
  - key: generic_key
    value: edge
    descriptors:
      - key: user
        rate_limit: {{unit: hour, requests_per_unit: 3}}
  - key: remote_address
    rate_limit: {{unit: hour, requests_per_unit: 1000}}
"""
COST_RULE = """\
  - key: generic_key
    value: cost
    rate_limit: {unit: hour, requests_per_unit: 10}
"""
RULE = f"ratelimit.service.rate_limit.{DOMAIN}"


def first_and_over_limit(s: Stack, user: str) -> tuple[Response, Response]:
    """`user`'s first request through Envoy and, after two more, the fourth: over CONFIG's
    3 per hour, a 429."""
    first = s.envoy.request("/", {"x-user-id": user})
    for _ in range(2):
        s.envoy.request("/", {"x-user-id": user})
    over = s.envoy.request("/", {"x-user-id": user})
    assert over.status == 429
    return first, over


def test_descriptors_from_headers_and_generic_keys_reach_the_daemon(stack) -> None:
    s = stack(CONFIG)
    assert s.envoy.request("/", {"x-user-id": "alice"}).status == 200
    assert s.envoy.request("/").status == 200  # no x-user-id: that descriptor is skipped

    stats = s.daemon.stats()
    assert stats[f"{RULE}.generic_key_edge.user.total_hits"] == 1
    assert stats[f"{RULE}.remote_address.total_hits"] == 2
    assert stats["ratelimit_server.ShouldRateLimit.total_requests"] == 2
    envoy = s.envoy.stats()
    assert envoy["cluster.backend.ratelimit.ok"] == 2
    assert envoy["cluster.ratelimit.upstream_rq_200"] == 2


def test_allows_up_to_the_limit_then_429_with_x_envoy_ratelimited(stack) -> None:
    s = stack(CONFIG)
    allowed = [s.envoy.request("/", {"x-user-id": "bob"}) for _ in range(3)]
    assert [r.status for r in allowed] == [200, 200, 200]
    assert all("x-envoy-ratelimited" not in r.headers for r in allowed)
    assert allowed[0].body == b"ok\n"

    denied = s.envoy.request("/", {"x-user-id": "bob"})
    assert denied.status == 429
    assert denied.headers["x-envoy-ratelimited"] == "true"
    # Another user is counted separately.
    assert s.envoy.request("/", {"x-user-id": "carol"}).status == 200

    stats = s.daemon.stats()
    assert stats[f"{RULE}.generic_key_edge.user.total_hits"] == 5
    assert stats[f"{RULE}.generic_key_edge.user.over_limit"] == 1
    assert s.envoy.stats()["cluster.backend.ratelimit.over_limit"] == 1


def test_envoy_x_ratelimit_headers_come_from_our_statuses(stack) -> None:
    first, over = first_and_over_limit(stack(CONFIG), "dave")
    # DRAFT_VERSION_03: the tightest limit, then every limit with its window in seconds.
    assert first.headers["x-ratelimit-limit"] == "3, 3;w=3600, 1000;w=3600"
    assert first.headers["x-ratelimit-remaining"] == "2"
    assert 0 < int(first.headers["x-ratelimit-reset"]) <= 3600

    assert over.headers["x-ratelimit-remaining"] == "0"
    assert over.headers["x-ratelimit-limit"].startswith("3, ")


def test_ratelimit_response_headers_are_forwarded_by_envoy(stack) -> None:
    ok, over = first_and_over_limit(stack(CONFIG, LIMIT_RESPONSE_HEADERS_ENABLED="true"), "erin")
    assert ok.status == 200
    assert ok.headers["ratelimit-limit"] == "3"
    assert ok.headers["ratelimit-remaining"] == "2"
    assert 0 < int(ok.headers["ratelimit-reset"]) <= 3600

    assert over.headers["ratelimit-limit"] == "3"
    assert over.headers["ratelimit-remaining"] == "0"


def test_ietf_headers_for_every_descriptor_reach_the_client(stack) -> None:
    # LIMIT_RESPONSE_HEADERS_FORMAT=ietf (extension): both descriptors Envoy sends, then
    # Retry-After with the 429.
    s = stack(CONFIG, LIMIT_RESPONSE_HEADERS_ENABLED="true", LIMIT_RESPONSE_HEADERS_FORMAT="ietf")
    user, address = f'"{DOMAIN}.generic_key_edge.user"', f'"{DOMAIN}.remote_address"'
    ok, over = first_and_over_limit(s, "hana")
    assert ok.status == 200
    assert ok.headers["ratelimit-policy"] == f"{user};q=3;w=3600, {address};q=1000;w=3600"
    current = re.fullmatch(rf"{user};r=2;t=(\d+), {address};r=999;t=(\d+)", ok.headers["ratelimit"])
    assert current is not None and 0 < int(current[1]) <= 3600
    assert "ratelimit-limit" not in ok.headers and "retry-after" not in ok.headers
    assert over.headers["ratelimit"].startswith(f"{user};r=0;t=")
    assert 0 < int(over.headers["retry-after"]) <= 3600


def test_all_descriptors_headers_reach_the_client(stack) -> None:
    per_minute = CONFIG.replace(
        "unit: hour, requests_per_unit: 3", "unit: minute, requests_per_unit: 3"
    )
    s = stack(per_minute, LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED="true")
    ok = s.envoy.request("/", {"x-user-id": "ines"})
    assert ok.status == 200
    assert ok.headers["ratelimit-limit-minutes"] == "3"
    assert ok.headers["ratelimit-remaining-minutes"] == "2"
    assert ok.headers["ratelimit-limit-hours"] == "1000"
    assert ok.headers["ratelimit-remaining-hours"] == "999"


def test_request_headers_reach_the_upstream_through_envoy(stack) -> None:
    # LIMIT_REQUEST_HEADERS_ENABLED (upstream #1168): request_headers_to_add, which Envoy adds
    # to the request it forwards; the backend echoes what it received.
    s = stack(
        CONFIG,
        LIMIT_REQUEST_HEADERS_ENABLED="true",
        LIMIT_REQUEST_LIMIT_HEADER="x-rl-limit",
        LIMIT_REQUEST_REMAINING_HEADER="x-rl-remaining",
        LIMIT_REQUEST_RESET_HEADER="x-rl-reset",
    )
    ok = s.envoy.request("/", {"x-user-id": "gina"})
    assert ok.status == 200
    assert ok.headers["echo-x-rl-limit"] == "3"
    assert ok.headers["echo-x-rl-remaining"] == "2"
    assert 0 < int(ok.headers["echo-x-rl-reset"]) <= 3600
    assert not any(h.startswith("ratelimit-") for h in ok.headers)  # response headers off


def test_no_ratelimit_response_headers_by_default(stack) -> None:
    s = stack(CONFIG)
    ok = s.envoy.request("/", {"x-user-id": "frank"})
    assert ok.status == 200
    assert not any(h.startswith("ratelimit-") for h in ok.headers)
    assert not any(h.startswith("echo-") for h in ok.headers)  # nor request headers


def test_failure_mode_allow_passes_traffic_with_the_daemon_stopped(stack) -> None:
    s = stack(CONFIG, failure_mode_deny=False)
    assert s.envoy.request("/", {"x-user-id": "gina"}).status == 200
    s.daemon.terminate()
    for _ in range(3):
        assert s.envoy.request("/", {"x-user-id": "gina"}).status == 200
    stats = s.envoy.stats()
    assert stats["cluster.backend.ratelimit.error"] == 3
    assert stats["cluster.backend.ratelimit.failure_mode_allowed"] == 3


def test_failure_mode_deny_rejects_traffic_with_the_daemon_stopped(stack) -> None:
    s = stack(CONFIG, failure_mode_deny=True)
    assert s.envoy.request("/", {"x-user-id": "hank"}).status == 200
    s.daemon.terminate()
    denied = [s.envoy.request("/", {"x-user-id": "hank"}) for _ in range(3)]
    # Envoy answers a failed rate-limit call with 500 (status_on_error's default), and marks
    # it as a rate-limit service error rather than an over-limit decision.
    assert [r.status for r in denied] == [500, 500, 500]
    assert all("x-envoy-ratelimited" not in r.headers for r in denied)
    stats = s.envoy.stats()
    assert stats["cluster.backend.ratelimit.error"] == 3
    assert stats.get("cluster.backend.ratelimit.failure_mode_allowed", 0) == 0


def test_config_reload_under_traffic_changes_the_limit_without_a_failed_request(stack) -> None:
    # The remote_address rule is lifted out of reach so only the user rule ever limits, and
    # daily windows keep a window boundary from resetting the count mid-test.
    base = CONFIG.replace("requests_per_unit: 1000}", "requests_per_unit: 1000000000}")
    base = base.replace("unit: hour", "unit: day")

    def with_limit(n: int) -> str:
        return base.replace("requests_per_unit: 3}", f"requests_per_unit: {n}}}")

    # Each config in turn, and what its requests get: the middle limit is below what the
    # user has already spent, the last one far above it.
    phases = [(1000000, 200), (7, 429), (2000000, 200)]
    s = stack(with_limit(phases[0][0]))
    seen: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def traffic() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", s.envoy.port, timeout=10)
        try:
            while not stop.is_set():
                r = s.envoy.request("/", {"x-user-id": "ivan"}, conn=conn)
                seen.append((r.status, r.headers.get("x-ratelimit-limit", "")))
        except BaseException as exc:  # a connection error is exactly what must not happen
            errors.append(exc)
        finally:
            conn.close()

    def more_traffic() -> None:
        n = len(seen)
        wait_for(lambda: len(seen) >= n + 20 or bool(errors), what="more traffic")

    def answered_by(limit: int) -> bool:
        return bool(errors) or any(f" {limit};w=86400" in h for _, h in seen[-3:])

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        for limit, _ in phases:
            if limit != phases[0][0]:
                s.write_config(with_limit(limit))
            wait_for(lambda limit=limit: answered_by(limit), what=f"limit {limit} to apply")
            more_traffic()
    finally:
        stop.set()
        worker.join(30)

    assert not errors, errors
    # Every response came from one of the configs, in order, with that config's status.
    order = []
    for status, header in seen:
        phase = next(i for i, (n, _) in enumerate(phases) if f" {n};w=86400" in header)
        assert status == phases[phase][1], (status, header)
        order.append(phase)
    assert order == sorted(order)
    assert set(order) == {0, 1, 2}
    stats = s.daemon.stats()
    assert stats["ratelimit.service.config_load_success"] >= 3
    assert stats.get("ratelimit.service.config_load_error", 0) == 0
    assert s.envoy.stats().get("cluster.backend.ratelimit.error", 0) == 0


def redis_env(redis_server) -> dict[str, str]:
    return {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redis_server.address}


def test_redis_backend_behind_envoy(stack, redis_server) -> None:
    s = stack(CONFIG, LIMIT_RESPONSE_HEADERS_ENABLED="true", **redis_env(redis_server))
    responses = [s.envoy.request("/", {"x-user-id": "judy"}) for _ in range(4)]
    assert [r.status for r in responses] == [200, 200, 200, 429]
    assert [r.headers["ratelimit-remaining"] for r in responses] == ["2", "1", "0", "0"]
    assert responses[3].headers["x-envoy-ratelimited"] == "true"
    assert s.daemon.stats()[f"{RULE}.generic_key_edge.user.over_limit"] == 1
    # The counters live in Redis: the user's key and the remote address's key.
    assert redis_server.command("DBSIZE") == b":2\r\n"


@pytest.mark.parametrize(("failure_mode_deny", "status"), [(False, 200), (True, 500)])
def test_redis_down_behind_envoy(stack, redis_server, failure_mode_deny, status) -> None:
    s = stack(CONFIG, failure_mode_deny=failure_mode_deny, **redis_env(redis_server))
    assert s.envoy.request("/", {"x-user-id": "kate"}).status == 200
    redis_server.stop()
    assert [s.envoy.request("/", {"x-user-id": "kate"}).status for _ in range(3)] == [status] * 3
    assert s.envoy.stats()["cluster.backend.ratelimit.error"] == 3


@pytest.mark.parametrize(("policy", "status"), [("allow", 200), ("deny", 429)])
def test_failure_policy_behind_envoy_with_a_stalled_redis(stack, redis_server, policy, status):
    # BACKEND_FAILURE_POLICY: the daemon answers OK / OVER_LIMIT itself while Redis
    # hangs, so Envoy sees no error (even with failure_mode_deny) and, once the breaker is
    # open, no timeout either.
    s = stack(
        CONFIG,
        failure_mode_deny=True,
        BACKEND_FAILURE_POLICY=policy,
        BACKEND_BREAKER_FAILURES="1",
        REDIS_REQUEST_TIMEOUT="10ms",
        **redis_env(redis_server),
    )
    assert s.envoy.request("/", {"x-user-id": "liz"}).status == 200
    redis_server.pause()
    try:
        got = [s.envoy.request("/", {"x-user-id": "liz"}).status for _ in range(3)]
    finally:
        redis_server.resume()
    assert got == [status] * 3
    assert s.envoy.stats().get("cluster.backend.ratelimit.error", 0) == 0
    assert s.daemon.stats()["ratelimit.redis_pool.breaker_opened"] == 1


def test_hits_addend_set_by_envoy_is_honoured(stack) -> None:
    s = stack(CONFIG + COST_RULE)
    responses = [s.envoy.request("/cost", {"x-cost": "4"}) for _ in range(3)]
    assert [r.status for r in responses] == [200, 200, 429]
    assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["6", "2", "0"]
    assert s.envoy.request("/cost").status == 429  # no x-cost: one hit, still over
    assert s.daemon.stats()[f"{RULE}.generic_key_cost.total_hits"] == 13


def test_shadow_mode_lets_envoy_pass_what_would_be_limited(stack) -> None:
    s = stack(CONFIG, SHADOW_MODE="true")
    responses = [s.envoy.request("/", {"x-user-id": "lena"}) for _ in range(5)]
    assert [r.status for r in responses] == [200] * 5
    assert all("x-envoy-ratelimited" not in r.headers for r in responses)
    stats = s.daemon.stats()
    assert stats[f"{RULE}.generic_key_edge.user.over_limit"] == 2
    # Global shadow mode counts globally; a rule's shadow_mode stat is for `shadow_mode: true`.
    assert stats["ratelimit.service.global_shadow_mode"] == 2
    assert stats[f"{RULE}.generic_key_edge.user.shadow_mode"] == 0
    assert s.envoy.stats().get("cluster.backend.ratelimit.over_limit", 0) == 0
