"""The daemon with BACKEND_TYPE=memcache, as a subprocess against a real memcached."""

from __future__ import annotations

import time

from support import wait_for
from support.daemon import write_config

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


def test_daemon_decides_over_json_and_is_healthy(memcached, daemon_env, start_daemon) -> None:
    mc = memcached()
    write_config(daemon_env, "config.yaml", CONFIG)
    daemon = start_daemon(
        dict(
            daemon_env,
            BACKEND_TYPE="memcache",
            MEMCACHE_HOST_PORT=mc.address,
            CACHE_KEY_PREFIX="p:",
        )
    )
    # The reference's HEAD never turns health OK with memcache; this daemon does.
    assert daemon.http("/healthcheck") == (200, b"OK")
    status, body = daemon.decide_json("d", {"k": "v"})
    assert status == 200
    assert body["overallCode"] == "OK"
    assert body["statuses"][0].get("limitRemaining", 0) == 0  # protojson omits zeros
    # The increment lands after the response: wait for it, then the limit holds.
    key = f"p:d_k_v_{int(time.time()) // 3600 * 3600}"  # the reference's cache key
    wait_for(lambda: mc.value(key) is not None, timeout=5, what="the increment")
    assert mc.value(key) == 1
    assert 3500 <= mc.ttl(key) <= 3600 + 300  # unit + EXPIRATION_JITTER_MAX_SECONDS
    status, body = daemon.decide_json("d", {"k": "v"})
    assert (status, body["overallCode"]) == (429, "OVER_LIMIT")
    _, stats = daemon.http("/stats", port=daemon.debug_port)
    assert b"ratelimit.memcache.multiget.__code=success: 2" in stats
    assert daemon.terminate() == 0
