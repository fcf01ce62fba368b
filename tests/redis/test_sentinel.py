"""REDIS_TYPE=sentinel: three sentinels, a master and a replica; failovers."""

from __future__ import annotations

import asyncio
import time

from support import wait_for
from support.core import suite_config

from ratelimitd.backends.base import BackendError
from ratelimitd.messages import OK

# d: k 1000/hour fixed window, bucket 1000/minute token bucket.
CONFIG = suite_config("redis_sentinel")


async def sentinel_decider(decider, sentinels):
    urls = ",".join(s.address for s in sentinels)
    return await decider(
        {
            "REDIS_TYPE": "sentinel",
            "REDIS_URL": f"mymaster,{urls}",
            "REDIS_AUTH": "masterpw",
            "REDIS_SENTINEL_AUTH": "sentinelpw",
            "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true",
        },
        CONFIG,
    )


async def test_failover_is_followed_without_restart(servers, decider) -> None:
    master, replica, sentinels = servers.sentinels(password="masterpw")
    d = await sentinel_decider(decider, sentinels)
    assert (await d.decide("d", [("k", "a")])).overall_code == OK
    assert len(master.client().keys("d_k_a_*")) == 1

    # A manual failover while both live: the old master answers READONLY, we follow.
    sentinels[0].client().execute_command("SENTINEL", "FAILOVER", "mymaster")
    wait_for(
        lambda: replica.client().info("replication")["role"] == "master",
        what="manual failover",
    )
    # Sentinel reconfigures the old master at its next 10 s INFO round; the client follows
    # +switch-master before (next test), and READONLY in any case: do it now.
    master.client().replicaof("127.0.0.1", replica.port)
    await until_served(d, "b")
    assert len(replica.client().keys("d_k_b_*")) == 1
    # The promoted replica has the state but not the script: EVALSHA falls back to EVAL.
    r = await d.decide("d", [("bucket", "a")])
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 999)
    assert replica.client().hget("d_bucket_a_60s_token_bucket", "f") is not None

    # The new master dies: the old one is promoted again.
    replica.stop()
    errors = await until_served(d, "c")
    assert errors > 0
    assert d.health.healthy()
    assert master.client().info("replication")["role"] == "master"
    assert len(master.client().keys("d_k_c_*")) == 1


async def test_switch_master_is_followed_before_any_request_fails(servers, decider) -> None:
    # The demoted master goes on taking writes until the sentinels reconfigure it (up to
    # 10 s later): without following +switch-master those counts would land on it and be
    # lost. Here the announcement alone moves the pool to the new master.
    master, replica, sentinels = servers.sentinels(password="masterpw")
    d = await sentinel_decider(decider, sentinels)
    assert (await d.decide("d", [("k", "a")])).overall_code == OK
    await asyncio.sleep(0.2)  # the subscription is up
    sentinels[0].client().execute_command("SENTINEL", "FAILOVER", "mymaster")
    instance = d.backend.main
    started = time.monotonic()
    while instance.address != ("127.0.0.1", replica.port):
        assert time.monotonic() - started < 10, "+switch-master not followed"
        await asyncio.sleep(0.02)
    await until_served(d, "b")
    assert len(replica.client().keys("d_k_b_*")) == 1
    assert master.client().keys("d_k_b_*") == []


async def until_served(d, value: str) -> int:
    """Decide until a decision succeeds; the number of BackendErrors before it."""
    start = time.monotonic()
    errors = 0
    while True:
        try:
            r = await d.decide("d", [("k", value)])
        except BackendError:
            errors += 1
            assert time.monotonic() - start < 30, "no failover"
            await asyncio.sleep(0.05)
            continue
        assert r.overall_code == OK
        return errors
