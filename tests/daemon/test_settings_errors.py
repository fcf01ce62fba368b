"""Settings from the environment that are refused: one line naming the variable, the value and
what is accepted; structural checks only for the selected backend.
"""

from __future__ import annotations

import pytest
from support.settings_env import error, load

# --- invalid values: one line naming the variable, the value and what is accepted -----------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PORT": "abc"}, "PORT: invalid value 'abc' (expected an integer 0-65535)"),
        ({"GRPC_PORT": "70000"}, "GRPC_PORT: invalid value '70000' (expected an integer 0-65535)"),
        ({"DEBUG_PORT": "-1"}, "DEBUG_PORT: invalid value '-1' (expected an integer 0-65535)"),
        ({"STATSD_PORT": "x"}, "STATSD_PORT: invalid value 'x' (expected an integer 0-65535)"),
        (
            {"LOG_LEVEL": "loud"},
            "LOG_LEVEL: invalid value 'loud' "
            "(accepted: trace, debug, info, warn, warning, error, fatal, panic)",
        ),
        (
            {"REDIS_TYPE": "x"},
            "REDIS_TYPE: invalid value 'x' (accepted: single, sentinel, cluster)",
        ),
        (
            {"REDIS_PERSECOND_TYPE": "replica"},
            "REDIS_PERSECOND_TYPE: invalid value 'replica' (accepted: single, sentinel, cluster)",
        ),
        (
            {"BACKEND_TYPE": "dynamo"},
            "BACKEND_TYPE: invalid value 'dynamo' (accepted: redis, memcache, memory)",
        ),
        (
            {"CONFIG_TYPE": "file"},
            "CONFIG_TYPE: invalid value 'file' (accepted: FILE, GRPC_XDS_SOTW)",
        ),
        (
            {"NEAR_LIMIT_RATIO": "high"},
            "NEAR_LIMIT_RATIO: invalid value 'high' (expected a number)",
        ),
        ({"NEAR_LIMIT_RATIO": "nan"}, "NEAR_LIMIT_RATIO: invalid value 'nan' (expected a number)"),
        (
            {"TRACING_SAMPLING_RATE": "1.5"},
            "TRACING_SAMPLING_RATE: invalid value '1.5' (expected a number between 0 and 1)",
        ),
        (
            {"TRACING_SAMPLING_RATE": "-0.1"},
            "TRACING_SAMPLING_RATE: invalid value '-0.1' (expected a number between 0 and 1)",
        ),
        (
            {"TRACING_EXPORTER_PROTOCOL": "udp"},
            "TRACING_EXPORTER_PROTOCOL: invalid value 'udp' (accepted: http, grpc)",
        ),
        (
            {"REDIS_SOCKET_TYPE": "udp"},
            "REDIS_SOCKET_TYPE: invalid value 'udp' (accepted: tcp, unix)",
        ),
        (
            {"REDIS_PERSECOND_SOCKET_TYPE": "pipe"},
            "REDIS_PERSECOND_SOCKET_TYPE: invalid value 'pipe' (accepted: tcp, unix)",
        ),
        (
            {"GRPC_MAX_CONNECTION_AGE": "10"},
            "GRPC_MAX_CONNECTION_AGE: invalid value '10' "
            "(expected a Go duration >= 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"REDIS_TIMEOUT": "-1s"},
            "REDIS_TIMEOUT: invalid value '-1s' "
            "(expected a Go duration >= 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"STATS_FLUSH_INTERVAL": "0"},
            "STATS_FLUSH_INTERVAL: invalid value '0' "
            "(expected a Go duration > 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"REDIS_CLUSTER_PIPELINE_PARALLELISM": "-1"},
            "REDIS_CLUSTER_PIPELINE_PARALLELISM: invalid value '-1' (expected an integer >= 0)",
        ),
        (
            {"REDIS_POOL_SIZE": "0"},
            "REDIS_POOL_SIZE: invalid value '0' (expected an integer >= 1)",
        ),
        (
            {"RATELIMITD_WORKERS": "0"},
            "RATELIMITD_WORKERS: invalid value '0' (expected an integer >= 1)",
        ),
        (
            {"EXPIRATION_JITTER_MAX_SECONDS": "1e3"},
            "EXPIRATION_JITTER_MAX_SECONDS: invalid value '1e3' (expected an integer >= 0)",
        ),
        (
            {"EXTRA_TAGS": "a:1,b"},
            "EXTRA_TAGS: invalid value 'a:1,b' (expected k1:v1,k2:v2)",
        ),
        (
            {"REDIS_URL": "mymaster", "REDIS_TYPE": "sentinel"},
            "REDIS_URL: invalid value 'mymaster' "
            "(a sentinel URL is 'master,host:port[,host:port...]')",
        ),
        (
            {
                "REDIS_PERSECOND": "true",
                "REDIS_PERSECOND_TYPE": "SENTINEL",
                "REDIS_PERSECOND_URL": "m",
            },
            "REDIS_PERSECOND_URL: invalid value 'm' "
            "(a sentinel URL is 'master,host:port[,host:port...]')",
        ),
        (
            {"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "a:1", "MEMCACHE_SRV": "_m._tcp.x"},
            "MEMCACHE_HOST_PORT, MEMCACHE_SRV: invalid combination "
            "'MEMCACHE_HOST_PORT=a:1, MEMCACHE_SRV=_m._tcp.x' "
            "(accepted: only one of MEMCACHE_HOST_PORT, MEMCACHE_SRV)",
        ),
        (
            {"BACKEND_TYPE": "memcache", "MEMCACHE_SRV": "memcached.local"},
            "MEMCACHE_SRV: invalid value 'memcached.local' (expected _service._proto.name)",
        ),
    ],
)
def test_invalid_values_give_one_clear_line(env: dict[str, str], message: str) -> None:
    assert error(**env) == message


def test_error_is_a_value_error_and_escapes_newlines() -> None:
    with pytest.raises(ValueError, match=r"^PORT: invalid value '80\\n80'"):
        load(PORT="80\n80")


def test_sentinel_url_in_error_is_masked() -> None:
    message = error(REDIS_TYPE="sentinel", REDIS_URL="redis://user:secret@m")
    assert "secret" not in message
    assert "'redis://*****@m'" in message


def test_structural_checks_only_for_the_selected_backend() -> None:
    # As the reference: those checks happen when that backend's client is built.
    s = load(REDIS_TYPE="sentinel", REDIS_URL="m", BACKEND_TYPE="memcache", MEMCACHE_SRV="_a._b.c")
    assert s.cache.backend == "memcache"
    assert load(MEMCACHE_HOST_PORT="a:1", MEMCACHE_SRV="x").cache.backend == "redis"
    # Sentinel with a master and one sentinel is fine; per-second is checked only when on.
    assert load(REDIS_TYPE="sentinel", REDIS_URL="m,h:26379").redis.type == "sentinel"
    assert load(REDIS_PERSECOND_TYPE="sentinel", REDIS_PERSECOND_URL="m").redis_persecond is None
