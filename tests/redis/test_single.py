"""The Redis backend against one real redis-server: key format, TTLs, auth, routing, races."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
import uvloop
from support.core import CONFIGS, suite_config

from ratelimitd.backends import load_settings
from ratelimitd.backends.base import BackendError, Op
from ratelimitd.backends.redis import create_redis_backend, go_duration, key_slot
from ratelimitd.health import Health
from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.stats import StatsStore

NOW = 1_000_000  # SECOND window 1000000, MINUTE 999960, HOUR 997200, DAY 950400

# domain: key_value 5/s, key2_value2.subkey2_subvalue2 10/min, key3 10/h, key4 10/day,
# files_files/* 10/min (share_threshold), k 10/min.
CONFIG = suite_config("redis_single")


def clock() -> float:
    return float(NOW)


def tcp(server: Any, **env: str) -> dict[str, str]:
    return {"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": server.address, **env}


async def decide_once(d: Any, server: Any) -> bytes:
    """Decide (key, value) once through `d`: the counter it left on `server`."""
    await d.decide("domain", [("key", "value")])
    return server.client().get("domain_key_value_1000000")  # type: ignore[no-any-return]


async def test_keys_and_ttls_are_the_reference_format(redis_server, decider) -> None:
    d = await decider(tcp(redis_server), CONFIG, clock=clock)
    r = await d.decide(
        "domain",
        [("key", "value")],
        [("key2", "value2"), ("subkey2", "subvalue2")],
        [("key3", "value3")],
        [("key4", "x")],
        [("files", "files/a.txt")],
        [("files", "files/b.txt")],
        [("k", "")],
    )
    assert r.overall_code == OK
    client = redis_server.client()
    keys = {k.decode(): int(client.get(k)) for k in client.keys("*")}
    assert keys == {
        "domain_key_value_1000000": 1,
        "domain_key2_value2_subkey2_subvalue2_999960": 1,
        "domain_key3_value3_997200": 1,
        "domain_key4_x_950400": 1,
        "domain_files_files/*_999960": 2,
        "domain_k__999960": 1,
    }
    units = {
        "domain_key_value_1000000": 1,
        "domain_key2_value2_subkey2_subvalue2_999960": 60,
        "domain_key3_value3_997200": 3600,
        "domain_key4_x_950400": 86400,
        "domain_files_files/*_999960": 60,
        "domain_k__999960": 60,
    }
    for key, unit in units.items():
        ttl = client.pttl(key)
        assert (unit - 1) * 1000 < ttl <= unit * 1000, (key, ttl)


async def test_prefix_and_expiry_jitter(redis_server, decider) -> None:
    d = await decider(
        tcp(redis_server, CACHE_KEY_PREFIX="prefix:", EXPIRATION_JITTER_MAX_SECONDS="300"),
        CONFIG,
        clock=clock,
    )
    for i in range(40):
        await d.decide("domain", [("key3", f"v{i}")])
    client = redis_server.client()
    ttls = [client.ttl(f"prefix:domain_key3_v{i}_997200") for i in range(40)]
    assert all(3600 - 1 <= t < 3600 + 300 for t in ttls), ttls
    assert len(set(ttls)) > 5  # jitter drawn per key
    assert client.dbsize() == 40


async def test_counts_statuses_and_over_limit(redis_server, decider) -> None:
    d = await decider(tcp(redis_server), CONFIG, clock=clock)
    codes = [(await d.decide("domain", [("key", "value")])).overall_code for _ in range(7)]
    assert codes == [OK] * 5 + [OVER_LIMIT] * 2
    r = await d.decide("domain", [("key2", "value2"), ("subkey2", "subvalue2")], hits_addend=4)
    assert r.statuses[0].limit_remaining == 6
    assert d.stat("ratelimit.service.rate_limit.domain.key_value.over_limit") == 2
    assert redis_server.client().get("domain_key_value_1000000") == b"7"


async def test_unix_socket(servers, decider, tmp_path) -> None:
    path = str(tmp_path / "redis.sock")
    server = servers("--unixsocket", path, "--unixsocketperm", "700")
    server.unixsocket = path
    d = await decider({"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": path}, CONFIG, clock=clock)
    assert await decide_once(d, server) == b"1"
    # unix:// URLs work whatever REDIS_SOCKET_TYPE says.
    d2 = await decider({"REDIS_URL": f"unix://{path}"}, CONFIG, clock=clock)
    assert await decide_once(d2, server) == b"2"


async def test_auth_password(servers, decider) -> None:
    server = servers(password="s3cret")
    d = await decider(tcp(server, REDIS_AUTH="s3cret"), CONFIG, clock=clock)
    assert await decide_once(d, server) == b"1"
    # Credentials in a redis:// URL are used when REDIS_AUTH is empty.
    d2 = await decider({"REDIS_URL": f"redis://:s3cret@{server.address}"}, CONFIG, clock=clock)
    assert await decide_once(d2, server) == b"2"


async def test_auth_acl_user(servers, decider) -> None:
    acl = ["rl", "on", ">userpw", "~domain_*", "+incrby", "+expire", "+get", "+ping", "+auth"]
    server = servers("--user", *acl, password="admin")
    d = await decider(tcp(server, REDIS_AUTH="rl:userpw"), CONFIG, clock=clock)
    assert await decide_once(d, server) == b"1"


async def test_wrong_password_fails_startup_with_masked_url(servers, decider) -> None:
    server = servers(password="right")
    env = {
        "REDIS_URL": f"redis://user:wrongpw@{server.address}",
        "REDIS_STARTUP_MAX_ELAPSED_TIME": "300ms",
    }
    with pytest.raises(BackendError) as info:
        await decider(env, CONFIG)
    message = str(info.value)
    assert message.startswith(
        f"timed out waiting for Redis connection to redis://*****@{server.address} after 300ms: "
    )
    assert "wrongpw" not in message


async def test_startup_waits_for_redis(servers, decider, unused_port) -> None:
    port = unused_port
    pending = asyncio.ensure_future(decider({"REDIS_URL": f"127.0.0.1:{port}"}, CONFIG))
    await asyncio.sleep(0)  # let the first connection attempt fail
    assert not pending.done()
    server = await asyncio.to_thread(servers, port=port)
    d = await pending
    await d.decide("domain", [("key", "value")])
    assert server.client().dbsize() == 1


async def test_per_second_instance_gets_only_second_keys(servers, decider) -> None:
    main = servers()
    per_second = servers()
    d = await decider(
        tcp(
            main,
            REDIS_PERSECOND="true",
            REDIS_PERSECOND_SOCKET_TYPE="tcp",
            REDIS_PERSECOND_URL=per_second.address,
        ),
        CONFIG,
        clock=clock,
    )
    r = await d.decide(
        "domain",
        [("key3", "a")],
        [("key", "value")],
        [("key2", "value2"), ("subkey2", "subvalue2")],
    )
    assert [s.limit_remaining for s in r.statuses] == [9, 4, 9]
    assert sorted(main.client().keys()) == [
        b"domain_key2_value2_subkey2_subvalue2_999960",
        b"domain_key3_a_997200",
    ]
    assert per_second.client().keys() == [b"domain_key_value_1000000"]
    snap = d.stats.snapshot()
    assert snap["ratelimit.redis_pool.cx_active"] == 2
    assert snap["ratelimit.redis_per_second_pool.cx_active"] == 10
    assert snap["ratelimit.redis_per_second_pool.cx_total"] == 10
    assert snap["ratelimit.redis_pool.cx_local_close"] == 0


async def test_concurrent_requests_never_admit_more_than_the_limit(redis_server, decider) -> None:
    d = await decider(tcp(redis_server, REDIS_POOL_SIZE="4"), CONFIG)
    results = await asyncio.gather(*(d.decide("domain", [("k", "race")]) for _ in range(200)))
    admitted = sum(r.overall_code == OK for r in results)
    assert admitted == 10
    remaining = sorted(r.statuses[0].limit_remaining for r in results if r.overall_code == OK)
    assert remaining == list(range(10))
    # 200 requests in one loop iteration: a handful of writes, not 200.
    assert d.backend.writes <= 8


async def test_stop_increment_when_over_limit(redis_server, decider) -> None:
    config = """
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 3}
"""
    d = await decider(
        tcp(redis_server, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT="true"), config, clock=clock
    )
    client = redis_server.client()
    for _ in range(3):
        assert (await d.decide("d", [("a", "x")], [("b", "y")])).overall_code == OK
    r = await d.decide("d", [("a", "x")], [("b", "y")])
    assert r.overall_code == OVER_LIMIT
    # b would exceed: only b is incremented; a keeps 3 (INCRBY 0 refreshes its TTL).
    assert client.get("d_a_x_999960") == b"3"
    assert client.get("d_b_y_999960") == b"4"
    assert client.ttl("d_a_x_999960") > 0
    assert r.statuses[0].code == OK and r.statuses[0].limit_remaining == 7


async def test_backend_error_counts_redis_error(redis_server, decider) -> None:
    d = await decider(tcp(redis_server), CONFIG, clock=clock)
    redis_server.client().set("domain_key_value_1000000", "not a number")
    with pytest.raises(BackendError, match="not an integer"):
        await d.decide("domain", [("key", "value")])
    assert d.stat("ratelimit.service.call.should_rate_limit.redis_error") == 1
    # The connection stays usable after an error reply.
    assert (await d.decide("domain", [("key3", "z")])).overall_code == OK


async def test_pipeline_window_and_limit(redis_server, decider) -> None:
    d = await decider(
        tcp(
            redis_server,
            REDIS_PIPELINE_WINDOW="2ms",
            REDIS_PIPELINE_LIMIT="20",
            REDIS_POOL_SIZE="1",
        ),
        CONFIG,
    )
    results = await asyncio.gather(*(d.decide("domain", [("k", f"w{i}")]) for i in range(50)))
    assert all(r.overall_code == OK for r in results)
    # 50 requests x 2 commands, at most 20 commands per write: 5 writes.
    assert d.backend.writes == 5


async def test_health_follows_connect(redis_server) -> None:
    settings = load_settings(
        {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redis_server.address}
    )
    health = Health()
    backend = create_redis_backend(settings, health, StatsStore())
    assert health.components() == {"backend": False}
    await backend.connect()
    assert health.components() == {"backend": True}
    await backend.close()
    with pytest.raises(BackendError):
        await backend.increment([Op("k", 1, 60)])


def test_key_slot_matches_redis(redis_server) -> None:
    client = redis_server.client()
    # CLUSTER KEYSLOT needs cluster mode; the reference values of the Redis spec instead.
    assert key_slot(b"123456789") == 0x31C3 % 16384
    assert key_slot(b"{user1000}.following") == key_slot(b"user1000")
    assert key_slot(b"foo{}{bar}") == key_slot(b"foo{}{bar}")  # empty tag: whole key
    assert key_slot(b"foo{{bar}}zap") == key_slot(b"{bar")
    assert client.ping()


def test_go_duration() -> None:
    assert [go_duration(x) for x in (0, 0.3, 5, 90, 7200.5)] == [
        "0s",
        "300ms",
        "5s",
        "1m30s",
        "2h0m0.5s",
    ]


async def test_cancelled_request_does_not_cancel_its_flush(redis_server, decider) -> None:
    d = await decider(tcp(redis_server, REDIS_POOL_SIZE="1"), CONFIG)
    backend = d.backend
    tasks = [asyncio.ensure_future(backend.increment([Op("c", 1, 60)])) for _ in range(5)]
    await asyncio.sleep(0)  # all five submitted to one flush, not yet written
    tasks[0].cancel()
    assert sorted(r[0] for r in await asyncio.gather(*tasks[1:])) == [2, 3, 4, 5]
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    # The cancelled request's commands were written with the flush.
    assert redis_server.client().get("c") == b"5"


async def test_passwords_never_logged(servers, decider, caplog) -> None:
    server = servers(password="topsecret")
    caplog.set_level(logging.DEBUG, logger="ratelimitd")
    d = await decider({"REDIS_URL": f"redis://:topsecret@{server.address}"}, CONFIG)
    await d.decide("domain", [("key", "value")])
    server.stop()
    deadline = time.monotonic() + 10
    while d.stat("ratelimit.redis_pool.cx_active"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    with pytest.raises(BackendError) as info:
        await d.decide("domain", [("key", "value")])
    await asyncio.sleep(0.1)  # let the reconnect loop log its attempts
    assert f"redis://*****@{server.address}" in caplog.text
    assert "no connection left" in caplog.text
    assert "topsecret" not in caplog.text
    assert "topsecret" not in str(info.value)
    assert "topsecret" not in repr(d.backend.main.s)


async def test_share_threshold_patterns_of_the_reference_config(redis_server, decider) -> None:
    config = (CONFIGS / "share_threshold.yaml").read_text()
    d = await decider(tcp(redis_server), config, clock=clock)
    r = await d.decide(
        "test-domain",
        [("files", "files/a.txt")],
        [("files", "files/b.txt")],
        [("nested", "parent"), ("files", "nested/c")],
        [("files", "top/x"), ("files", "nested/y")],
        [("user", "user/1"), ("resource", "res/2"), ("action", "read")],
    )
    assert [s.limit_remaining for s in r.statuses] == [99, 98, 199, 299, 149]
    client = redis_server.client()
    assert {k.decode(): int(client.get(k)) for k in client.keys("*")} == {
        "test-domain_files_files/*_999960": 2,
        "test-domain_nested_parent_files_nested/*_999960": 1,
        "test-domain_files_top/*_files_nested/*_999960": 1,
        "test-domain_user_user/*_resource_res/*_action_read_999960": 1,
    }


async def test_runs_on_uvloop() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


async def test_registry_builds_the_redis_backend(redis_server) -> None:
    from ratelimitd.backends import create_backend, load_settings
    from ratelimitd.backends.redis import RedisBackend

    settings = load_settings(
        {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redis_server.address}
    )
    backend = create_backend(settings, Health(), StatsStore())
    assert isinstance(backend, RedisBackend)
    await backend.connect()
    try:
        assert await backend.increment([Op("reg", 2, 60)]) == [2]
        assert await backend.get([Op("reg", 0, 60), Op("absent", 0, 60)]) == [2, 0]
    finally:
        await backend.close()


async def test_nothing_to_count_sends_nothing_to_the_store(redis_server, decider) -> None:
    """An unknown domain and a descriptor no rule matches are answered OK without a round
    (the reference sends them to no cache either); the unknown domain is counted."""
    d = await decider(tcp(redis_server), CONFIG, clock=clock)

    def commands() -> dict[str, int]:  # INFO is how they are read
        return {k: n for k, n in redis_server.commandstats().items() if k != "info"}

    before = commands()
    for _ in range(3):
        r = await d.decide("nope", [("key", "value")], [("a", "b")])
        assert r.overall_code == OK and [s.rule for s in r.statuses] == [None, None]
        r = await d.decide("domain", [("nothing", "here")])
        assert r.overall_code == OK and r.statuses[0].rule is None
    assert commands() == before
    assert d.stat("ratelimit.service.rate_limit.nope.domain_not_found") == 6
    assert d.backend.writes == 0
