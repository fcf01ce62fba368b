"""ShouldRateLimit on the memory backend when limits are hit, pinned to envoyproxy/ratelimit:
shadow mode and quota mode (rule and global: when an over-limit status is not the answer),
limits overridden by the request, and the rate limit headers that report the tightest limit.

Cases follow `test/service/ratelimit_test.go` (TestServiceGlobalShadowMode, TestRuleShadowMode,
TestMixedRuleShadowMode, TestServiceWithCustomRatelimitHeaders,
TestServiceWithDefaultRatelimitHeaders, TestServiceGlobalQuotaMode,
TestServicePerDescriptorQuotaMode, TestServiceMixedPerDescriptorModes*, TestServiceQuotaModeOnly*)
and `src/service/ratelimit.go`. Instead of mocking the cache, statuses are produced by
presetting counters in the memory backend (support.core.exhaust).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import HOUR, MINUTE, brief, exhaust, rule_counts
from support.core import SERVICE_CONFIG as CONFIG
from support.core import SERVICE_METADATA as METADATA
from support.core import SERVICE_NOW as NOW

from ratelimitd.messages import MAX_UINT32, OK, OVER_LIMIT, Descriptor
from ratelimitd.settings import ReloadOptions
from ratelimitd.transport.protocodec import decode_response, encode_response


def codes(r: Any) -> list[int]:
    return [s.code for s in r.statuses]


# --- shadow mode --------------------------------------------------------------------------


async def test_rule_shadow_mode_turns_over_limit_into_ok(harness: Any) -> None:
    h = harness(CONFIG, now=NOW, local_cache_bytes=1 << 20)
    exhaust(h, "d", "shadow", "x", 60, 1)
    r = await h.decide("d", [("shadow", "x")], [("hello", "world")])
    assert r.overall_code == OK
    assert [brief(s) for s in r.statuses] == [(OK, 1, 0), (OK, None, 0)]
    assert h.rule_stats("d.shadow") == rule_counts(total=1, over=1, shadow=1)
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
    assert h.rule_stats("d.hello_world") == rule_counts(
        total=2, over=1, near=1, within=1
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
