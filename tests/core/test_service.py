"""ShouldRateLimit semantics on the memory backend, pinned to envoyproxy/ratelimit.

Cases follow `test/service/ratelimit_test.go` (TestService, TestEmptyDomain,
TestEmptyDescriptors, TestCacheError, TestInitialLoadError, TestServiceGlobalShadowMode,
TestRuleShadowMode, TestMixedRuleShadowMode, TestServiceWithCustomRatelimitHeaders,
TestServiceWithDefaultRatelimitHeaders, TestServiceGlobalQuotaMode,
TestServicePerDescriptorQuotaMode, TestServiceMixedPerDescriptorModes*,
TestServiceQuotaModeOnly*, TestMetadataReturnedFor*, TestOverlappingMetadata*,
TestUnlimited*) and reference sections 6 and 13. Instead of mocking the cache,
statuses are produced by presetting counters in the memory backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from support.core import CONFIGS, suite_config

from ratelimitd.backends import BackendError, Op
from ratelimitd.config import ConfigFile
from ratelimitd.core import Core, build_core
from ratelimitd.messages import MAX_UINT32, OK, OVER_LIMIT, Descriptor, Request
from ratelimitd.service import ServiceError
from ratelimitd.settings import ReloadOptions
from ratelimitd.transport.protocodec import decode_response, encode_response

SECOND, MINUTE, HOUR, DAY = 1, 2, 3, 4

# d: foo 10/min (named foo_limit), bar 5/min, second 10/s, hour 3/h, shadow 1/min in shadow
# mode, quota and quota2 1/min in quota mode, unl unlimited, free without a limit.
CONFIG = suite_config("core_service")
# r: a 1/min (A); b 2/min (B) replaces A; c 3/min (C) and dd 4/min (D) replace each other;
# u unlimited (U) replaces A; plain 5/min.
REPLACES = suite_config("core_service_replaces")
# m: all 1/min with metadata: one and two (nested maps and lists that overlap), three, sh in
# shadow mode, unl unlimited, det detailed_metric, named (N) replaced by replacer.
METADATA = suite_config("core_service_metadata")

BASIC = CONFIGS / "basic_config.yaml"
NOW = 2222  # the reference service tests' clock: MINUTE reset header = 58


def exhaust(h: Any, domain: str, key: str, value: str, seconds: int, count: int) -> None:
    """Preset a counter so the next hit on (key, value) sees `count` + hits."""
    window = int(h.clock.now) // seconds * seconds
    h.backend._counters[f"{domain}_{key}_{value}_{window}"] = [count, int(h.clock.now) + seconds]


def brief(st: Any) -> tuple:
    return (st.code, st.rule.requests_per_unit if st.rule is not None else None, st.limit_remaining)


def codes(r: Any) -> list[int]:
    return [s.code for s in r.statuses]


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


class FailingBackend:
    name = "failing"

    async def connect(self) -> None:
        return None

    async def increment(self, ops: Sequence[Op]) -> list[int]:
        raise BackendError("cache error")

    async def get(self, ops: Sequence[Op]) -> list[int]:
        raise BackendError("cache error")

    async def delete(self, keys: Sequence[str]) -> int:
        raise BackendError("cache error")

    async def close(self) -> None:
        return None


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


# --- shadow mode --------------------------------------------------------------------------


async def test_rule_shadow_mode_turns_over_limit_into_ok(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, local_cache_bytes=1 << 20)
    exhaust(h, "d", "shadow", "x", 60, 1)
    r = await h.decide("d", [("shadow", "x")], [("hello", "world")])
    assert r.overall_code == OK
    assert [brief(s) for s in r.statuses] == [(OK, 1, 0), (OK, None, 0)]
    assert h.rule_stats("d.shadow") == dict(
        total_hits=1,
        over_limit=1,
        near_limit=0,
        within_limit=0,
        over_limit_with_local_cache=0,
        shadow_mode=1,
    )
    assert len(h.local_cache) == 1  # still cached
    assert h.stat("ratelimit.service.global_shadow_mode") == 0


async def test_mixed_rule_shadow_mode(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    exhaust(h, "d", "shadow", "x", 60, 1)
    exhaust(h, "d", "foo", "x", 60, 10)
    r = await h.decide("d", [("shadow", "x")], [("foo", "x")])
    assert r.overall_code == OVER_LIMIT
    assert codes(r) == [OK, OVER_LIMIT]
    assert h.stat("ratelimit.service.global_shadow_mode") == 0


async def test_global_shadow_mode(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=ReloadOptions(shadow_mode=True))
    exhaust(h, "d", "foo", "bar", 60, 10)
    r = await h.decide("d", [("foo", "bar")], [("hello", "world")])
    assert r.overall_code == OK
    assert [brief(s) for s in r.statuses] == [(OVER_LIMIT, 10, 0), (OK, None, 0)]
    assert h.stat("ratelimit.service.global_shadow_mode") == 1
    assert h.rule_stats("d.foo")["over_limit"] == 1
    # Not counted when nothing was over.
    await h.decide("d", [("bar", "x")])
    assert h.stat("ratelimit.service.global_shadow_mode") == 1


async def test_global_shadow_mode_with_quota_all_over(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=ReloadOptions(shadow_mode=True))
    exhaust(h, "d", "quota", "x", 60, 1)
    r = await h.decide("d", [("quota", "x")])
    assert r.overall_code == OK
    assert codes(r) == [OVER_LIMIT]
    assert h.stat("ratelimit.service.global_shadow_mode") == 1


async def test_options_swap_with_the_config(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    exhaust(h, "d", "foo", "bar", 60, 10)
    assert (await h.decide("d", [("foo", "bar")])).overall_code == OVER_LIMIT
    h.service.set_ruleset(h.ruleset, ReloadOptions(shadow_mode=True))
    assert (await h.decide("d", [("foo", "bar")])).overall_code == OK
    h.service.set_ruleset(h.ruleset)  # keeps the options in force
    assert (await h.decide("d", [("foo", "bar")])).overall_code == OK


# --- quota mode ---------------------------------------------------------------------------


LIMITS = {"foo": 10, "bar": 5, "quota": 1, "quota2": 1}  # of CONFIG, per minute


# Quota mode, of a rule (quota_mode: true) or global (ReloadOptions(quota_mode=True)): which
# over-limit descriptors make the answer OVER_LIMIT. `exhausted` rules are at their limit
# before the request; every descriptor is (key, "x").
@pytest.mark.parametrize(
    ("exhausted", "requested", "global_quota", "overall", "statuses"),
    [
        pytest.param(
            ["quota"],
            ["quota", "quota2"],
            False,
            OK,
            [(OVER_LIMIT, 1, 0), (OK, 1, 0)],
            id="rule_quota_some_over_is_ok",
        ),
        pytest.param(
            ["quota", "quota2"],
            ["quota", "quota2"],
            False,
            OVER_LIMIT,
            [(OVER_LIMIT, 1, 0), (OVER_LIMIT, 1, 0)],
            id="rule_quota_all_over_is_over_limit",
        ),
        pytest.param(
            ["bar"],
            ["bar", "quota"],
            False,
            OVER_LIMIT,
            [(OVER_LIMIT, 5, 0), (OK, 1, 0)],
            id="regular_over_with_quota_ok_is_over_limit",
        ),
        pytest.param(
            ["quota"],
            ["bar", "quota"],
            False,
            OVER_LIMIT,
            [(OK, 5, 4), (OVER_LIMIT, 1, 0)],
            id="regular_ok_with_the_only_quota_over_is_over_limit",
        ),
        pytest.param(
            [],
            ["bar", "quota"],
            False,
            OK,
            [(OK, 5, 4), (OK, 1, 0)],
            id="regular_ok_and_quota_ok_is_ok",
        ),
        pytest.param(
            ["foo", "bar"],
            ["foo", "bar"],
            True,
            OVER_LIMIT,
            [(OVER_LIMIT, 10, 0), (OVER_LIMIT, 5, 0)],
            id="global_quota_mode_all_over",
        ),
        pytest.param(
            ["foo"],
            ["foo", "bar"],
            True,
            OK,
            [(OVER_LIMIT, 10, 0), (OK, 5, 4)],
            id="global_quota_mode_some_over",
        ),
        pytest.param(
            ["foo"],
            ["foo", "hello"],
            True,
            OK,
            [(OVER_LIMIT, 10, 0), (OK, None, 0)],
            id="global_quota_mode_descriptor_without_limit_passes",
        ),
        pytest.param(
            ["quota"],
            ["quota", "unl"],
            False,
            OVER_LIMIT,
            [(OVER_LIMIT, 1, 0), (OK, None, MAX_UINT32)],
            id="quota_mode_ignores_unlimited_descriptors",
        ),
    ],
)
async def test_quota_mode(
    harness: Any,
    exhausted: list[str],
    requested: list[str],
    global_quota: bool,
    overall: int,
    statuses: list[tuple],
) -> None:
    h = harness(CONFIG, now=NOW, options=ReloadOptions(quota_mode=global_quota))
    for key in exhausted:
        exhaust(h, "d", key, "x", 60, LIMITS[key])
    r = await h.decide("d", *[[(key, "x")] for key in requested])
    assert r.overall_code == overall
    assert [brief(s) for s in r.statuses] == statuses


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


# --- limit override ----------------------------------------------------------------------------


async def test_limit_override(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    r = await h.decide("d", Descriptor((("foo", "bar"), ("k", "")), limit=(3, HOUR)))
    st = r.statuses[0]
    assert (st.code, st.rule.requests_per_unit, st.rule.unit, st.limit_remaining) == (
        OK,
        3,
        HOUR,
        2,
    )
    assert st.rule.name == "" and not st.rule.shadow_mode and not st.rule.quota_mode
    assert st.duration_until_reset == 3600 - NOW % 3600
    # The cache key follows the request entries; the stats key is domain.k_v[.k].
    assert list(h.backend._counters) == ["d_foo_bar_k__0"]
    assert h.rule_stats("d.foo_bar.k")["total_hits"] == 1
    assert h.rule_stats("d.foo")["total_hits"] == 0


async def test_limit_override_applies_to_descriptors_without_a_rule(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    for _ in range(2):
        r = await h.decide("d", Descriptor((("hello", "world"),), limit=(1, MINUTE)))
    assert r.overall_code == OVER_LIMIT
    assert h.rule_stats("d.hello_world") == dict(
        total_hits=2,
        over_limit=1,
        near_limit=1,
        within_limit=1,
        over_limit_with_local_cache=0,
        shadow_mode=0,
    )  # near threshold floor(1 * 0.8) = 0: the first hit is near


async def test_limit_override_beats_unlimited_and_shadow(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    r = await h.decide(
        "d",
        Descriptor((("unl", "x"),), limit=(1, MINUTE)),
        Descriptor((("shadow", "x"),), limit=(0, MINUTE)),
    )
    assert [brief(s) for s in r.statuses] == [(OK, 1, 0), (OVER_LIMIT, 0, 0)]
    assert r.overall_code == OVER_LIMIT


async def test_limit_override_has_no_metadata(harness: Any) -> None:
    h = harness(METADATA, now=NOW, options=ReloadOptions(response_dynamic_metadata=True))
    r = await h.decide("m", Descriptor((("one", "x"),), limit=(5, MINUTE)))
    assert "metadata" not in r.dynamic_metadata
    assert r.dynamic_metadata["descriptors"][0]["entries"] == ["one=x"]
    assert (
        " ".join(r.dynamic_metadata["descriptors"][0]["limit"].split())
        == "requests_per_unit:5 unit:MINUTE"
    )


# --- response headers ------------------------------------------------------------

HEADERS = ReloadOptions(response_headers=True)


async def test_headers_over_limit_default_names(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    exhaust(h, "d", "foo", "bar", 60, 10)
    r = await h.decide("d", [("foo", "bar")], [("hello", "world")])
    assert r.headers == [
        ("RateLimit-Limit", "10"),
        ("RateLimit-Remaining", "0"),
        ("RateLimit-Reset", "58"),
    ]


async def test_headers_custom_names(harness: Any) -> None:
    opts = ReloadOptions(
        response_headers=True,
        limit_header="A-Ratelimit-Limit",
        remaining_header="A-Ratelimit-Remaining",
        reset_header="A-Ratelimit-Reset",
    )
    h = harness(CONFIG, now=NOW, options=opts)
    exhaust(h, "d", "foo", "bar", 60, 10)
    r = await h.decide("d", [("foo", "bar")], [("hello", "world")])
    assert r.headers == [
        ("A-Ratelimit-Limit", "10"),
        ("A-Ratelimit-Remaining", "0"),
        ("A-Ratelimit-Reset", "58"),
    ]


async def test_request_headers_for_the_upstream(harness: Any) -> None:
    """LIMIT_REQUEST_HEADERS_ENABLED (upstream #1168): the same pick, in request_headers_to_add
    under their own names, independent of the response headers."""
    opts = ReloadOptions(
        request_headers=True,
        request_limit_header="X-Limit",
        request_remaining_header="X-Remaining",
        request_reset_header="X-Reset",
    )
    h = harness(CONFIG, now=NOW, options=opts)
    exhaust(h, "d", "foo", "bar", 60, 10)
    r = await h.decide("d", [("foo", "bar")], [("hello", "world")])
    assert r.request_headers == [("X-Limit", "10"), ("X-Remaining", "0"), ("X-Reset", "58")]
    assert r.headers == []
    both = harness(
        CONFIG, now=NOW, options=ReloadOptions(response_headers=True, request_headers=True)
    )
    r = await both.decide("d", [("foo", "bar")])
    assert (
        r.headers
        == r.request_headers
        == [
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "9"),
            ("RateLimit-Reset", "58"),
        ]
    )
    assert decode_response(encode_response(r)).request_headers == r.request_headers


async def test_ietf_headers_list_every_descriptor_with_a_limit(harness: Any) -> None:
    """LIMIT_RESPONSE_HEADERS_FORMAT=ietf (extension): draft-ietf-httpapi-ratelimit-headers-11,
    a policy per descriptor with a limit, named after the rule or its stats key."""
    opts = ReloadOptions(response_headers=True, headers_format="ietf")
    h = harness(CONFIG, now=NOW, options=opts)
    r = await h.decide("d", [("foo", "x")], [("unl", "x")], [("hour", "x")], [("free", "x")])
    assert r.overall_code == OK
    reset_hour = 3600 - NOW % 3600
    assert r.headers == [
        ("RateLimit-Policy", '"foo_limit";q=10;w=60, "d.hour";q=3;w=3600'),
        ("RateLimit", f'"foo_limit";r=9;t=58, "d.hour";r=2;t={reset_hour}'),
    ]
    exhaust(h, "d", "hour", "y", 3600, 3)
    r = await h.decide("d", [("foo", "y")], [("hour", "y")])
    assert r.overall_code == OVER_LIMIT
    assert r.headers[1] == ("RateLimit", f'"foo_limit";r=9;t=58, "d.hour";r=0;t={reset_hour}')
    assert r.headers[2] == ("Retry-After", str(reset_hour))  # when the over limit resets
    # Nothing with a limit: no header at all.
    assert (await h.decide("d", [("unl", "x")], [("free", "x")])).headers == []


def test_ietf_policy_names_are_structured_field_strings() -> None:
    from ratelimitd.service import _sf_string

    assert _sf_string('a"b\\c') == '"a\\"b\\\\c"'
    assert _sf_string("é\n") == '"__"'


async def test_all_descriptors_headers(harness: Any) -> None:
    """LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED (the reference's open PR #1190): a limit and a
    remaining header per descriptor with a limit, named after its unit."""
    opts = ReloadOptions(all_descriptors_headers=True)
    h = harness(CONFIG, now=NOW, options=opts)
    r = await h.decide("d", [("second", "x")], [("unl", "x")], [("bar", "x")], [("hour", "x")])
    assert r.headers == [
        ("ratelimit-limit-seconds", "10"),
        ("ratelimit-remaining-seconds", "9"),
        ("ratelimit-limit-minutes", "5"),
        ("ratelimit-remaining-minutes", "4"),
        ("ratelimit-limit-hours", "3"),
        ("ratelimit-remaining-hours", "2"),
    ]
    # With the reference's triple too: the triple first.
    both = harness(
        CONFIG, now=NOW, options=ReloadOptions(response_headers=True, all_descriptors_headers=True)
    )
    r = await both.decide("d", [("bar", "x")])
    assert r.headers == [
        ("RateLimit-Limit", "5"),
        ("RateLimit-Remaining", "4"),
        ("RateLimit-Reset", "58"),
        ("ratelimit-limit-minutes", "5"),
        ("ratelimit-remaining-minutes", "4"),
    ]


async def test_headers_disabled_by_default(harness: Any) -> None:
    h = harness(CONFIG, now=NOW)
    exhaust(h, "d", "foo", "bar", 60, 10)
    r = await h.decide("d", [("foo", "bar")])
    assert r.headers == []


async def test_headers_pick_the_least_remaining(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    exhaust(h, "d", "hour", "x", 3600, 1)  # remaining 1 after this hit
    r = await h.decide("d", [("foo", "x")], [("hour", "x")], [("bar", "x")])
    assert [s.limit_remaining for s in r.statuses] == [9, 1, 4]
    assert r.headers == [
        ("RateLimit-Limit", "3"),
        ("RateLimit-Remaining", "1"),
        ("RateLimit-Reset", str(3600 - NOW % 3600)),
    ]


async def test_headers_ties_keep_the_first(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    exhaust(h, "d", "bar", "x", 60, 4)  # 5/minute: remaining 0, still OK
    exhaust(h, "d", "hour", "x", 3600, 2)  # 3/hour: remaining 0, still OK
    r = await h.decide("d", [("bar", "x")], [("hour", "x")])
    assert codes(r) == [OK, OK]
    assert r.headers[0] == ("RateLimit-Limit", "5")


async def test_headers_last_over_limit_overrides_the_minimum(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    exhaust(h, "d", "foo", "x", 60, 10)  # over, 10/minute
    exhaust(h, "d", "hour", "x", 3600, 3)  # over, 3/hour
    r = await h.decide("d", [("foo", "x")], [("hour", "x")], [("bar", "x")])
    assert codes(r) == [OVER_LIMIT, OVER_LIMIT, OK]
    assert r.headers == [
        ("RateLimit-Limit", "3"),
        ("RateLimit-Remaining", "0"),
        ("RateLimit-Reset", str(3600 - NOW % 3600)),
    ]


async def test_headers_over_limit_beats_an_earlier_zero_remaining(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    exhaust(h, "d", "bar", "x", 60, 4)  # OK, remaining 0 (first minimum)
    exhaust(h, "d", "hour", "x", 3600, 3)  # over
    r = await h.decide("d", [("bar", "x")], [("hour", "x")])
    assert r.headers[0] == ("RateLimit-Limit", "3")


async def test_headers_quota_over_limit_does_not_override(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    exhaust(h, "d", "bar", "x", 60, 3)  # remaining 1
    exhaust(h, "d", "quota", "x", 60, 5)  # quota over with remaining 0: still the minimum
    r = await h.decide("d", [("bar", "x")], [("quota", "x")], [("foo", "x")])
    assert r.headers[0] == ("RateLimit-Limit", "1")
    exhaust(h, "d", "quota", "x", 60, 5)
    exhaust(h, "d", "bar", "x", 60, 5)
    r = await h.decide("d", [("quota", "x")], [("bar", "x")])
    assert codes(r) == [OVER_LIMIT, OVER_LIMIT]
    assert r.headers[0] == ("RateLimit-Limit", "5")  # the regular one


async def test_headers_added_when_ok(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    r = await h.decide("d", [("second", "x")])
    assert r.overall_code == OK
    assert r.headers == [
        ("RateLimit-Limit", "10"),
        ("RateLimit-Remaining", "9"),
        ("RateLimit-Reset", "1"),
    ]


async def test_headers_not_added_without_limits(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    r = await h.decide("d", [("hello", "world")], [("unl", "x")], [("free", "x")])
    assert r.headers == []
    r = await h.decide("unknown-domain", [("foo", "x")])
    assert r.headers == []


async def test_headers_shadow_rule_reports_zero_remaining(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=HEADERS)
    exhaust(h, "d", "shadow", "x", 60, 1)
    r = await h.decide("d", [("foo", "x")], [("shadow", "x")])
    assert r.headers == [
        ("RateLimit-Limit", "1"),
        ("RateLimit-Remaining", "0"),
        ("RateLimit-Reset", "58"),
    ]


async def test_headers_with_global_shadow_mode(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, options=ReloadOptions(response_headers=True, shadow_mode=True))
    exhaust(h, "d", "foo", "x", 60, 10)
    r = await h.decide("d", [("foo", "x")])
    assert r.overall_code == OK
    assert r.headers[:2] == [("RateLimit-Limit", "10"), ("RateLimit-Remaining", "0")]


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
