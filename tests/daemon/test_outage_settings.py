"""BACKEND_FAILURE_POLICY, BACKEND_BREAKER_*, MAX_INFLIGHT_DECISIONS: off by
default, and refused where they would be accepted and do nothing."""

from __future__ import annotations

import pytest

from ratelimitd.backends import load_settings
from ratelimitd.settings import SettingsError


def test_defaults_are_the_reference() -> None:
    cache = load_settings({"BACKEND_TYPE": "redis"}).cache
    assert (cache.failure_policy, cache.breaker_failures, cache.max_in_flight) == ("error", 0, 0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BACKEND_FAILURE_POLICY": "retry"}, r"^BACKEND_FAILURE_POLICY: invalid value 'retry'"),
        ({"BACKEND_BREAKER_FAILURES": "-1"}, r"^BACKEND_BREAKER_FAILURES: "),
        (
            {"BACKEND_BREAKER_PROBE_INTERVAL": "1s"},
            r"^BACKEND_BREAKER_PROBE_INTERVAL: has no effect without BACKEND_BREAKER_FAILURES",
        ),
        (
            {"BACKEND_TYPE": "memory", "BACKEND_FAILURE_POLICY": "allow"},
            r"^BACKEND_FAILURE_POLICY: has no effect with BACKEND_TYPE=memory",
        ),
        (
            {"BACKEND_TYPE": "memory", "MAX_INFLIGHT_DECISIONS": "10"},
            r"^MAX_INFLIGHT_DECISIONS: has no effect with BACKEND_TYPE=memory",
        ),
        (
            {
                "BACKEND_TYPE": "memcache",
                "MEMCACHE_HOST_PORT": "h:1",
                "BACKEND_BREAKER_FAILURES": "3",
            },
            r"^BACKEND_BREAKER_FAILURES: has no effect with BACKEND_TYPE=memcache",
        ),
    ],
)
def test_refused_with_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        load_settings({"BACKEND_TYPE": "redis", **env})
    assert "\n" not in str(info.value)


def test_memcache_takes_the_in_flight_bound() -> None:
    env = {"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "h:1", "MAX_INFLIGHT_DECISIONS": "9"}
    assert load_settings(env).cache.max_in_flight == 9
