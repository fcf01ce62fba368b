"""ShouldRateLimit semantics on the memory backend, pinned to envoyproxy/ratelimit.

Cases follow `test/service/ratelimit_test.go` (TestService, TestEmptyDomain,
TestEmptyDescriptors, TestCacheError, TestInitialLoadError, TestMetadataReturnedFor*,
TestOverlappingMetadata*, TestUnlimited*) and `src/service/ratelimit.go`: the basic answers,
request errors, unknown domains, unlimited and replaced limits, and dynamic metadata. Shadow
mode, quota mode, limit overrides and the rate limit headers are in test_service_limits.py.
Instead of mocking the cache, statuses are produced by presetting counters in the memory
backend (support.core.exhaust).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from support.core import CONFIGS, MINUTE, SECOND, StoreDouble, brief, exhaust, suite_config
from support.core import SERVICE_CONFIG as CONFIG
from support.core import SERVICE_METADATA as METADATA
from support.core import SERVICE_NOW as NOW

from ratelimitd.backends import BackendError, Op
from ratelimitd.config import ConfigFile
from ratelimitd.core import Core, build_core
from ratelimitd.messages import MAX_UINT32, OK, OVER_LIMIT, Descriptor, Request
from ratelimitd.service import ServiceError
from ratelimitd.settings import ReloadOptions

# CONFIG (d) and METADATA (m) are described in support.core.
# r: a 1/min (A); b 2/min (B) replaces A; c 3/min (C) and dd 4/min (D) replace each other;
# u unlimited (U) replaces A; plain 5/min.
REPLACES = suite_config("core_service_replaces")

BASIC = CONFIGS / "basic_config.yaml"


# --- TestService: basic answers -------------------------------------------------------


async def test_no_limit_is_ok(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    r = await h.decide("d", [("hello", "world")])
    assert r.overall_code == OK
    assert [brief(s) for s in r.statuses] == [(OK, None, 0)]
    assert r.statuses[0].duration_until_reset == 0
    assert r.headers == [] and r.dynamic_metadata is None
    assert h.backend._counters == {}


async def test_over_limit_and_no_limit_in_any_order(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    exhaust(h, "d", "foo", "bar", 60, 10)
    r = await h.decide("d", [("foo", "bar")], [("hello", "world")])
    assert r.overall_code == OVER_LIMIT
    assert [brief(s) for s in r.statuses] == [(OVER_LIMIT, 10, 0), (OK, None, 0)]
    assert r.statuses[0].rule.name == "foo_limit"
    assert r.statuses[0].rule.unit == MINUTE
    r = await h.decide("d", [("hello", "world")], [("foo", "bar")])
    assert r.overall_code == OVER_LIMIT
    assert [brief(s) for s in r.statuses] == [(OK, None, 0), (OVER_LIMIT, 10, 0)]
    assert h.stat("ratelimit.service.global_shadow_mode") == 0


async def test_current_limit_name_is_empty_when_unnamed(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    r = await h.decide("d", [("bar", "x")])
    assert r.statuses[0].rule.name == ""


# --- request errors ---------------------------------------------------------------------


SERVICE_ERROR = "ratelimit.service.call.should_rate_limit.service_error"


async def test_empty_domain_is_a_service_error(harness: Any) -> None:
    h = harness(CONFIG)
    with pytest.raises(ServiceError) as exc:
        await h.decide("", [("hello", "world")])
    assert str(exc.value) == "rate limit domain must not be empty"
    assert h.stat(SERVICE_ERROR) == 1


async def test_empty_descriptors_is_a_service_error(harness: Any) -> None:
    h = harness(CONFIG)
    with pytest.raises(ServiceError) as exc:
        await h.decide("d")
    assert str(exc.value) == "rate limit descriptor list must not be empty"
    assert h.stat(SERVICE_ERROR) == 1


async def test_no_config_loaded_is_a_service_error() -> None:
    core = build_core()
    service, stats = core.service, core.stats
    with pytest.raises(ServiceError) as exc:
        await service.should_rate_limit(Request("d", [Descriptor((("hello", "world"),))]))
    assert str(exc.value) == "no rate limit configuration loaded"
    assert stats.snapshot()[SERVICE_ERROR] == 1


async def test_empty_domain_is_checked_before_the_config(harness: Any) -> None:
    service = build_core().service
    with pytest.raises(ServiceError, match="domain must not be empty"):
        await service.should_rate_limit(Request("", []))


class FailingBackend(StoreDouble):
    name = "failing"

    async def increment(self, ops: Sequence[Op]) -> list[int]:
        raise BackendError("cache error")

    get = increment

    async def delete(self, keys: Sequence[str]) -> int:
        raise BackendError("cache error")


def failing_core() -> Core:
    core = build_core(backend=FailingBackend())
    core.load([ConfigFile("config.yaml", CONFIG)])
    return core


async def test_backend_error_fails_the_request() -> None:
    core = failing_core()
    with pytest.raises(BackendError) as exc:
        await core.service.should_rate_limit(Request("d", [Descriptor((("foo", "bar"),))]))
    assert str(exc.value) == "cache error"
    assert core.stats.snapshot()[SERVICE_ERROR] == 0


async def test_backend_error_counts_redis_error() -> None:
    core = failing_core()
    with pytest.raises(BackendError):
        await core.service.should_rate_limit(Request("d", [Descriptor((("foo", "bar"),))]))
    assert core.stats.snapshot()["ratelimit.service.call.should_rate_limit.redis_error"] == 1


# --- unknown domain ---------------------------------------------------------------------


async def test_unknown_domain_is_ok_and_counts_domain_not_found_per_descriptor(
    harness: Any,
) -> None:
    h = harness(CONFIG)
    r = await h.decide(
        "nope",
        [("foo", "bar")],
        [("hello", "world")],
        Descriptor((("foo", "x"),), limit=(1, SECOND)),
    )
    assert r.overall_code == OK
    assert [brief(s) for s in r.statuses] == [(OK, None, 0)] * 3
    assert h.stat("ratelimit.service.rate_limit.nope.domain_not_found") == 3
    assert h.backend._counters == {}
    await h.decide("nope", [("a", "b")])
    assert h.stat("ratelimit.service.rate_limit.nope.domain_not_found") == 4


async def test_unknown_domain_name_is_sanitized_in_the_stat(harness: Any) -> None:
    h = harness(CONFIG)
    await h.decide("10.0.0.1:8080", [("a", "b")])
    assert h.stat("ratelimit.service.rate_limit.10_0_0_1_8080.domain_not_found") == 1


# --- unlimited and replaces ------------------------------------------------------------------


async def test_unlimited(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    r = await h.decide("d", [("unl", "x")], [("foo", "x")])
    assert r.overall_code == OK
    assert [brief(s) for s in r.statuses] == [(OK, None, MAX_UINT32), (OK, 10, 9)]
    assert r.statuses[0].duration_until_reset == 0
    assert list(h.backend._counters) == ["d_foo_x_2220"]
    assert all(v == 0 for v in h.rule_stats("d.unl").values())


async def test_replaces_drops_the_named_limit(harness: Any) -> None:
    h = harness(REPLACES, now=NOW)
    for order in ([("a", "1")], [("b", "1")]), ([("b", "1")], [("a", "1")]):
        r = await h.decide("r", *order)
        statuses = {s.rule.name if s.rule else None: brief(s) for s in r.statuses}
        assert statuses == {None: (OK, None, 0), "B": statuses["B"]}
    assert not any(k.startswith("r_a_") for k in h.backend._counters)
    assert h.rule_stats("r.a")["total_hits"] == 0
    assert h.rule_stats("r.b")["total_hits"] == 2


async def test_replaced_limit_is_not_enforced(harness: Any) -> None:
    h = harness(REPLACES, now=NOW)
    exhaust(h, "r", "a", "1", 60, 1)
    r = await h.decide("r", [("a", "1")], [("b", "1")])
    assert r.overall_code == OK
    assert [brief(s) for s in r.statuses] == [(OK, None, 0), (OK, 2, 1)]


async def test_mutual_replaces_drops_both(harness: Any) -> None:
    h = harness(REPLACES, now=NOW)
    r = await h.decide("r", [("c", "1")], [("dd", "1")], [("plain", "1")])
    assert [brief(s) for s in r.statuses] == [(OK, None, 0), (OK, None, 0), (OK, 5, 4)]
    assert list(h.backend._counters) == ["r_plain_1_2220"]


async def test_replaced_by_an_unlimited_rule(harness: Any) -> None:
    h = harness(REPLACES, now=NOW)
    r = await h.decide("r", [("a", "1")], [("u", "1")])
    assert [brief(s) for s in r.statuses] == [(OK, None, 0), (OK, None, MAX_UINT32)]
    assert h.backend._counters == {}


async def test_replaces_only_acts_on_limits_in_the_same_request(harness: Any) -> None:
    h = harness(REPLACES, now=NOW)
    r = await h.decide("r", [("a", "1")])
    assert [brief(s) for s in r.statuses] == [(OK, 1, 0)]


# --- dynamic metadata ------------------------------------------------------------

META = ReloadOptions(response_dynamic_metadata=True)


async def test_dynamic_metadata_shape(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    r = await h.decide(
        "m",
        Descriptor((("one", "x"), ("sub", "y"))),
        Descriptor((("two", "x"),), hits_addend=0),
        Descriptor((("zz", ""),), limit=(7, SECOND), hits_addend=3),
        hits_addend=2,
    )
    md = r.dynamic_metadata
    assert md["domain"] == "m"
    assert md["hitsAddend"] == 2
    assert md["descriptors"][0] == {"entries": ["one=x", "sub=y"]}
    assert md["descriptors"][1] == {"entries": ["two=x"], "hitsAddend": 0}
    third = md["descriptors"][2]
    assert third["entries"] == ["zz="] and third["hitsAddend"] == 3
    assert " ".join(third["limit"].split()) == "requests_per_unit:7 unit:SECOND"
    assert set(md) == {"domain", "descriptors", "hitsAddend", "metadata"}


async def test_dynamic_metadata_disabled_by_default(harness: Any) -> None:
    h = harness(METADATA, now=NOW)
    r = await h.decide("m", [("one", "x")])
    assert r.dynamic_metadata is None


async def test_dynamic_metadata_without_request_hits_or_rule_metadata(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    r = await h.decide("m", [("nothing", "x")])
    assert r.dynamic_metadata == {"domain": "m", "descriptors": [{"entries": ["nothing=x"]}]}


async def test_dynamic_metadata_for_an_unknown_domain(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    r = await h.decide("nope", [("one", "x")])
    assert r.dynamic_metadata == {"domain": "nope", "descriptors": [{"entries": ["one=x"]}]}


async def test_metadata_first_value_wins_and_structs_merge(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    r = await h.decide("m", [("one", "x")], [("two", "x")], [("three", "x")])
    assert r.dynamic_metadata["metadata"] == {
        "name": "service_1",
        "nested": {"x": 1, "inner": {"p": 1, "q": 2}, "y": 2},
        "list": [1, 2],  # lists are not merged
        "other": "o",
        "three": 3,
    }


async def test_metadata_merge_does_not_leak_into_later_requests(harness: Any) -> None:
    # A deliberate difference: the reference's mergeMetadata merges nested structs into the
    # first rule's own Struct (it stores that pointer in the result), so the merged fields
    # stick to the config until the next reload. We keep the config immutable.
    h = harness(METADATA, now=NOW, options=META)
    await h.decide("m", [("one", "x")], [("two", "x")])
    r = await h.decide("m", [("one", "y")])
    assert r.dynamic_metadata["metadata"] == {
        "name": "service_1",
        "nested": {"x": 1, "inner": {"p": 1}},
        "list": [1, 2],
    }


async def test_metadata_only_from_passed_descriptors(harness: Any) -> None:
    options = ReloadOptions(response_dynamic_metadata=True, quota_mode=True)
    h = harness(METADATA, now=NOW, options=options)
    exhaust(h, "m", "two", "x", 60, 1)
    r = await h.decide("m", [("one", "x")], [("two", "x")])
    assert r.overall_code == OK
    assert r.dynamic_metadata["metadata"]["name"] == "service_1"
    assert "other" not in r.dynamic_metadata["metadata"]


async def test_metadata_of_the_second_when_the_first_is_over(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    exhaust(h, "m", "one", "x", 60, 1)
    r = await h.decide("m", [("one", "x")], [("two", "x")])
    assert r.overall_code == OVER_LIMIT
    assert r.dynamic_metadata["metadata"]["name"] == "service_2"


async def test_metadata_shadowed_descriptors_count_as_passed(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    exhaust(h, "m", "sh", "x", 60, 1)
    r = await h.decide("m", [("sh", "x")])
    assert r.dynamic_metadata["metadata"] == {"shadowed": "y"}


async def test_metadata_not_from_unlimited_descriptors(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    r = await h.decide("m", [("unl", "x")])
    assert "metadata" not in r.dynamic_metadata


async def test_metadata_lost_when_a_detailed_leaf_is_recreated(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    r = await h.decide("m", [("det", "x")])
    assert r.statuses[0].code == OK
    assert "metadata" not in r.dynamic_metadata
    assert h.rule_stats("m.det_x")["total_hits"] == 1


async def test_metadata_not_from_replaced_limits(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=META)
    r = await h.decide("m", [("named", "x")], [("replacer", "x")])
    assert [brief(s) for s in r.statuses] == [(OK, None, 0), (OK, 1, 0)]
    assert "metadata" not in r.dynamic_metadata


async def test_global_quota_mode_without_any_limit_is_ok(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=ReloadOptions(quota_mode=True))
    r = await h.decide("nope", [("foo", "x")])
    assert r.overall_code == OK
    r = await h.decide("d", [("hello", "world")], [("unl", "x")])
    assert r.overall_code == OK


async def test_detailed_metric_stats_key_end_to_end(harness: Any) -> None:
    h = harness(BASIC, now=NOW)
    await h.decide("test-domain", [("key7", "unspecified_value")])
    assert h.stat("ratelimit.service.rate_limit.test-domain.key7_unspecified_value.total_hits") == 1
    assert h.stat("ratelimit.service.rate_limit.test-domain.key7.total_hits") == 0


async def test_whitelisted_value_and_depth_rule_end_to_end(harness: Any) -> None:
    h = harness(BASIC, now=NOW)
    r = await h.decide(
        "test-domain",
        [("key2", "value3")],  # whitelisted: no limit although key2 has a default
        [("key2", "value2"), ("subkey", "x")],  # no fallback to key2_value2 at depth 2
        [("key2", "other")],  # key-only default
        [("key5", "value5")],  # an intermediate node's own limit
    )
    assert [brief(s) for s in r.statuses] == [
        (OK, None, 0),
        (OK, None, 0),
        (OK, 20, 19),
        (OK, 15, 14),
    ]


async def test_override_with_an_unknown_unit_is_refused(harness: Any) -> None:
    # The reference panics in UnitToDivider (not a serviceError, so the process crashes);
    # we refuse the request as a service error instead.
    h = harness(CONFIG, now=NOW)
    with pytest.raises(ServiceError):
        await h.decide("d", Descriptor((("foo", "x"),), limit=(1, 0)))
    assert h.stat(SERVICE_ERROR) == 1
    assert h.backend._counters == {}
