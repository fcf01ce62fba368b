"""The `meter: true` extension: per-day usage buckets counted with the rate-limit round."""

from __future__ import annotations

from typing import Any

import pytest

from ratelimitd.backends import Op
from ratelimitd.config import ConfigError, ConfigFile, load_ruleset
from ratelimitd.config.keys import METER_TTL_SECONDS, meter_key
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor

METERED = """\
domain: api
descriptors:
  - key: account
    meter: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: tenant
    meter: true
    rate_limit: {unlimited: true}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
"""

NOW = 1_763_800_000  # 2025-11-22T08:26:40Z
DAY = NOW - NOW % 86400


def test_meter_key_format() -> None:
    assert meter_key("", "api", (("account", "acme"),), NOW) == f"meter_api_account_acme_{DAY}"
    assert meter_key("p:", "d", (("a", "1"), ("b", "")), NOW) == f"p:meter_d_a_1_b__{DAY}"


@pytest.mark.parametrize("local_cache_bytes", [0, 1 << 20])
async def test_metered_hits_land_in_day_buckets(harness: Any, local_cache_bytes: int) -> None:
    h = harness(METERED, now=NOW, local_cache_bytes=local_cache_bytes)
    for _ in range(3):
        await h.decide("api", [("account", "acme")])
    response = await h.decide("api", Descriptor((("account", "acme"),), hits_addend=5))
    assert response.overall_code == OVER_LIMIT
    bucket = f"meter_api_account_acme_{DAY}"
    # Every request that reaches the rule is metered, over the limit or not.
    assert (await h.backend.get([Op(bucket, 0, 1)])) == [8]
    assert h.backend.ttl(bucket) == METER_TTL_SECONDS
    h.clock.now = NOW + 86400
    await h.decide("api", [("account", "acme")])
    assert (await h.backend.get([Op(f"meter_api_account_acme_{DAY + 86400}", 0, 1)])) == [1]


async def test_unlimited_rules_can_meter_and_plain_rules_do_not(harness: Any) -> None:
    h = harness(METERED, now=NOW)
    response = await h.decide("api", [("tenant", "t1")], [("plain", "x")], hits_addend=3)
    assert [s.code for s in response.statuses] == [OK, OK]
    assert response.statuses[0].limit_remaining == 4294967295
    buckets = sorted(k for k in h.backend._counters if k.startswith("meter_"))
    assert buckets == [f"meter_api_tenant_t1_{DAY}"]
    assert (await h.backend.get([Op(buckets[0], 0, 1)])) == [3]


async def test_configs_without_the_extension_write_no_meter_keys(harness: Any) -> None:
    h = harness("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n")
    await h.decide("d", [("k", "v")])
    assert not any(k.startswith("meter_") for k in h.backend._counters)


async def test_metering_with_stop_increment_mode(harness: Any) -> None:
    h = harness(METERED, now=NOW, stop_increment=True)
    for _ in range(4):
        await h.decide("api", [("account", "acme")])
    assert (await h.backend.get([Op(f"meter_api_account_acme_{DAY}", 0, 1)])) == [4]


def test_meter_needs_a_rate_limit() -> None:
    with pytest.raises(ConfigError) as exc:
        load_ruleset(
            [ConfigFile("m.yaml", "domain: d\ndescriptors:\n  - key: k\n    meter: true\n")]
        )
    assert str(exc.value) == (
        "m.yaml: meter needs a rate_limit (unlimited: true to only meter) on 'd.k'"
    )
