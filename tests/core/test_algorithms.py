"""The algorithm extension on the memory backend: sliding windows, token buckets, N-unit
windows and several limits per descriptor (docs/algorithms.md).

Config parsing and its errors, check-config, the exact semantics on a controlled clock
(limit_remaining, duration_until_reset, the deciding limit of several), and hypothesis
tests of the compiled window maths against the pure twin. The concurrency tests (memory
and Redis, 200 callers) are in tests/redis/test_algorithms.py, the daemon's in
tests/daemon/test_algorithms.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core import suite_config
from support.daemon import run_check_config

from ratelimitd.config import ConfigError, ConfigFile, _keys_py, load_ruleset
from ratelimitd.config.windows import FIXED_WINDOW, ONLY_FIXED_WINDOW, SLIDING_WINDOW, TOKEN_BUCKET
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor
from ratelimitd.stats import RULE_STATS, RuleStats

_keys = pytest.importorskip("ratelimitd.config._keys", reason="compiled extension not built")

T0 = 1_000_000.0  # window-aligned for every unit used here

# api: user 20/s sliding window, bucket 20/s token bucket, fixed 20/s fixed window, report
# 3 per 2 s, account 5/s and 8/minute (per_minute).
CONFIG = suite_config("core_algorithms")


def load(text: str, backend: tuple[str, frozenset[int]] | None = None) -> Any:
    return load_ruleset([ConfigFile("c.yaml", text)], backend=backend)


def error(text: str, backend: tuple[str, frozenset[int]] | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        load(text, backend)
    return str(e.value)


def one(rate_limit: str, key: str = "k") -> str:
    return f"domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {rate_limit}\n"


# -- config -------------------------------------------------------------------------------


def test_config_fields_become_rules() -> None:
    rules = {r.full_key: r for r in load(CONFIG).rules()}
    assert rules["api.user"].algorithm == SLIDING_WINDOW
    assert rules["api.bucket"].algorithm == TOKEN_BUCKET
    assert rules["api.fixed"].algorithm == FIXED_WINDOW and not rules["api.fixed"].extended
    report = rules["api.report"]
    assert (report.unit_multiplier, report.unit_seconds, report.extended) == (2, 2, True)
    account = rules["api.account"]
    assert [(lim.requests_per_unit, lim.unit_seconds, lim.name) for lim in account.limits] == [
        (5, 1, ""),
        (8, 60, "per_minute"),
    ]
    assert account.name == "" and account.extended


def test_dump_shows_extensions_only_where_used() -> None:
    dump = load(CONFIG).dump()
    assert "api.fixed: unit=SECOND requests_per_unit=20, shadow_mode: false" in dump
    assert "api.user: unit=SECOND requests_per_unit=20 algorithm=sliding_window," in dump
    assert "api.report: unit=SECOND requests_per_unit=3 unit_multiplier=2," in dump
    assert "api.account: unit=SECOND requests_per_unit=5, shadow" in dump
    assert "api.account: unit=MINUTE requests_per_unit=8 name=per_minute, shadow" in dump


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            one("{unit: second, requests_per_unit: 1, algorithm: leaky_bucket}"),
            "c.yaml: line 4: invalid rate limit algorithm 'leaky_bucket' of 'd.k' "
            "(expected fixed_window, sliding_window or token_bucket)",
        ),
        (
            one("{unit: second, requests_per_unit: 1, unit_multiplier: 0}"),
            "c.yaml: line 4: invalid rate limit unit_multiplier 0 of 'd.k' (must be at least 1)",
        ),
        (
            one("{unit: second, requests_per_unit: 1, unit_multiplier: -3}"),
            "c.yaml: line 4: invalid rate limit unit_multiplier -3 of 'd.k' (must be at least 1)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n"
            "    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n",
            "c.yaml: line 3: descriptor 'd.k' has both rate_limit and rate_limits",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n",
            "c.yaml: line 3: rate_limits of 'd.k' is empty",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n"
            "      - {unit: second, requests_per_unit: 1}\n"
            "      - {unit: second, requests_per_unit: 2}\n",
            "c.yaml: line 6: rate_limits of 'd.k' has two fixed_window limits of 1s "
            "(lines 5 and 6): a window is limited once",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unlimited: true}\n",
            "c.yaml: line 5: a limit in rate_limits of 'd.k' cannot be unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n"
            "      - {unit: fortnight, requests_per_unit: 1}\n",
            "c.yaml: invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n"
            "      - {unit: second, requests_per_unit: 1, name: a}\n"
            "      - {unit: minute, requests_per_unit: 1, replaces: [{name: a}]}\n",
            "c.yaml: replaces should not contain name of same descriptor",
        ),
        (
            one("{unlimited: true, algorithm: token_bucket}"),
            "c.yaml: line 4: should not specify algorithm or unit_multiplier when unlimited",
        ),
        (
            one("{unit: year, requests_per_unit: 4000000000, algorithm: token_bucket}"),
            "c.yaml: line 4: token_bucket of 'd.k' cannot be counted exactly: "
            "requests_per_unit x window (4000000000 x 31536000s) must be at most 2^50",
        ),
        (
            one("{unit: second, requests_per_unit: 1, unit_multiplier: x}"),
            "c.yaml: error loading config file: yaml: unmarshal errors:\n"
            "  line 4: cannot unmarshal !!str `x` into int",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    algorithm: token_bucket\n"
            "    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "c.yaml: line 4: 'algorithm' has no effect in a descriptor "
            "(it belongs in a rate_limit or a rate_limits entry)",
        ),
        (
            "domain: d\nrate_limits: []\ndescriptors: []\n",
            "c.yaml: line 2: 'rate_limits' has no effect at the top level (it belongs in a "
            "descriptor)",
        ),
        (
            one("{unit: second, requests_per_unit: 1, rate_limits: []}"),
            "c.yaml: line 4: 'rate_limits' has no effect in a rate limit (it belongs in a "
            "descriptor)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits: {unit: second}\n",
            "c.yaml: error loading config file: yaml: unmarshal errors:\n"
            "  line 4: cannot unmarshal !!map into []config.YamlRateLimit",
        ),
    ],
)
def test_config_errors(text: str, message: str) -> None:
    assert error(text) == message


def test_memcache_refuses_what_it_cannot_count_exactly() -> None:
    memcache = ("memcache", ONLY_FIXED_WINDOW)
    for algorithm in ("sliding_window", "token_bucket"):
        text = one(f"{{unit: second, requests_per_unit: 1, algorithm: {algorithm}}}")
        assert error(text, memcache) == (
            f"c.yaml: line 4: algorithm {algorithm} of 'd.k' cannot be counted exactly by the "
            "memcache backend (it counts fixed_window only)"
        )
    # N-unit fixed windows and several fixed limits are fine on memcache.
    load(one("{unit: second, requests_per_unit: 1, unit_multiplier: 5}"), memcache)
    load(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n"
        "      - {unit: second, requests_per_unit: 1}\n"
        "      - {unit: hour, requests_per_unit: 9}\n",
        memcache,
    )


def test_long_windows_of_large_limits_count_in_seconds() -> None:
    (ms,) = load(one("{unit: day, requests_per_unit: 1000, algorithm: token_bucket}")).rules()
    (s,) = load(one("{unit: day, requests_per_unit: 100000000, algorithm: sliding_window}")).rules()
    assert (ms.tick, ms.window_ticks) == (1, 86_400_000)
    assert (s.tick, s.window_ticks) == (1000, 86_400)


def test_check_config_validates_the_extension(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "c.yaml").write_text(CONFIG)
    bad = tmp_path / "bad.yaml"
    bad.write_text(one("{unit: second, requests_per_unit: 1, algorithm: leaky}"))

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return run_check_config(*args, env={"PATH": "/usr/bin:/bin"})

    ok = check(str(good))
    assert ok.returncode == 0, ok.stderr
    assert "all rate limit configs ok: 1 files, 1 domains, 5 rules" in ok.stdout
    refused = check(str(bad))
    assert refused.returncode == 1
    assert "invalid rate limit algorithm 'leaky'" in refused.stderr
    memcache = check("--backend-type", "memcache", str(good))
    assert memcache.returncode == 1
    assert "algorithm sliding_window of 'api.user' cannot be counted exactly by the memcache" in (
        memcache.stderr
    )


# -- semantics on a controlled clock --------------------------------------------------------


async def ask(h: Any, key: str, n: int = 1, value: str = "a", hits: int | None = None) -> list[Any]:
    out = []
    for _ in range(n):
        response = await h.decide("api", Descriptor(((key, value),), hits_addend=hits))
        out.append(response.statuses[0])
    return out


def codes(statuses: list[Any]) -> list[int]:
    return [s.code for s in statuses]


async def test_sliding_window_boundary_burst_admits_one_burst(harness: Any) -> None:
    """20 requests late in a second, 20 just after the boundary: 21 admitted (fixed: 40)."""
    h = harness(CONFIG, now=T0 + 0.9)
    late = await ask(h, "user", 20) + await ask(h, "fixed", 20)
    assert codes(late).count(OK) == 40
    h.clock.now = T0 + 1.05
    sliding = await ask(h, "user", 20)
    fixed = await ask(h, "fixed", 20)
    assert codes(sliding).count(OK) == 1  # ceil(20 x 0.95) = 19 still weigh: room for one
    assert codes(fixed).count(OK) == 20
    # remaining after the one: 20 - 19 - 1 = 0; it can all be forgotten at the end of the
    # next window (1.95 s, so 2 s); the refused ones wait for the weight to drop to 18:
    # left 900 ms -> 50 ms from now (1 s rounded up).
    assert (sliding[0].limit_remaining, sliding[0].duration_until_reset) == (0, 2)
    assert (sliding[1].code, sliding[1].duration_until_reset) == (OVER_LIMIT, 1)


async def test_sliding_window_exact_levels(harness: Any) -> None:
    h = harness(CONFIG, now=T0)
    assert codes(await ask(h, "user", 25)).count(OK) == 20
    h.clock.now = T0 + 1.25  # previous 20 weigh ceil(20 x 0.75) = 15: room for 5
    got = await ask(h, "user", 6)
    assert codes(got) == [OK] * 5 + [OVER_LIMIT]
    assert [s.limit_remaining for s in got[:5]] == [4, 3, 2, 1, 0]
    assert got[0].duration_until_reset == 2  # this window's hits count until 3.0
    # refused: room = 20 - 5 - 1 = 14 -> weight 14 at left <= 700 ms: 50 ms from now -> 1 s
    assert got[5].duration_until_reset == 1


async def test_token_bucket_burst_then_one_per_interval(harness: Any) -> None:
    h = harness(CONFIG, now=T0)
    burst = await ask(h, "bucket", 25)
    assert codes(burst) == [OK] * 20 + [OVER_LIMIT] * 5
    assert [s.limit_remaining for s in burst[:3]] == [19, 18, 17]
    assert burst[19].duration_until_reset == 1  # full again after 1 s
    assert burst[20].duration_until_reset == 1  # the next token: 50 ms, rounded up
    for _ in range(10):  # one token every 50 ms
        h.clock.now += 0.05
        assert codes(await ask(h, "bucket", 3)) == [OK, OVER_LIMIT, OVER_LIMIT]
    h.clock.now += 10
    assert codes(await ask(h, "bucket", 21)).count(OK) == 20  # capacity, not more


async def test_hits_addend_on_the_new_algorithms(harness: Any) -> None:
    h = harness(CONFIG, now=T0)
    assert codes(await ask(h, "bucket", 1, hits=15)) == [OK]
    (refused,) = await ask(h, "bucket", 1, hits=6)  # 15 + 6 > 20: nothing counted
    assert refused.code == OVER_LIMIT
    (check,) = await ask(h, "bucket", 1, hits=0)  # hits 0: a check, counts nothing
    assert (check.code, check.limit_remaining) == (OK, 5)
    assert codes(await ask(h, "bucket", 1, hits=5)) == [OK]
    (never,) = await ask(h, "bucket", 1, hits=21)  # more than the capacity: never
    assert never.code == OVER_LIMIT


async def test_multiplier_window_holds_across_the_unit_boundary(harness: Any) -> None:
    h = harness(CONFIG, now=T0 + 0.5)
    first = await ask(h, "report", 2)
    h.clock.now = T0 + 1.5  # another second, the same 2-second window
    second = await ask(h, "report", 2)
    assert codes(first + second) == [OK, OK, OK, OVER_LIMIT]
    assert [s.duration_until_reset for s in first + second] == [2, 2, 1, 1]
    h.clock.now = T0 + 2.0  # windows are aligned to multiples of 2 s since the epoch
    assert codes(await ask(h, "report", 3)) == [OK] * 3
    # Its counter never shares the 1-second reference key of the same entries.
    assert h.backend.ttl("api_report_a_1000002_2s") > 0


async def test_several_limits_the_second_decides(harness: Any) -> None:
    h = harness(CONFIG, now=T0)
    first = await ask(h, "account", 5)
    assert codes(first) == [OK] * 5
    assert first[-1].rule.name == "" and first[-1].limit_remaining == 0  # per-second: least
    assert first[-1].rule.requests_per_unit == 5
    h.clock.now = T0 + 1
    second = await ask(h, "account", 4)
    assert codes(second) == [OK, OK, OK, OVER_LIMIT]
    # 3 left per minute < 4 per second: the per-minute limit reports, then decides.
    assert [(s.rule.name, s.limit_remaining) for s in second] == [
        ("per_minute", 2),
        ("per_minute", 1),
        ("per_minute", 0),
        ("per_minute", 0),
    ]
    assert second[-1].rule.requests_per_unit == 8
    assert second[-1].duration_until_reset == 60 - 1_000_001 % 60  # the per-minute window's
    # Stats are the descriptor's, once per hit.
    assert h.stat("ratelimit.service.rate_limit.api.account.total_hits") == 9
    assert h.stat("ratelimit.service.rate_limit.api.account.over_limit") == 1
    assert h.stat("ratelimit.service.rate_limit.api.account.within_limit") == 8


async def test_several_limits_over_reports_the_longest(harness: Any) -> None:
    text = (
        "domain: api\ndescriptors:\n  - key: k\n    rate_limits:\n"
        "      - {unit: second, requests_per_unit: 1}\n"
        "      - {unit: hour, requests_per_unit: 1, name: hourly}\n"
    )
    h = harness(text, now=T0)
    ok, over = await ask(h, "k", 2)
    assert ok.code == OK and over.code == OVER_LIMIT
    assert (over.rule.name, over.duration_until_reset) == ("hourly", 3600 - 1_000_000 % 3600)


async def test_replaces_drops_one_of_several_limits(harness: Any) -> None:
    text = CONFIG + (
        "  - key: plan\n    value: gold\n"
        "    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: per_minute}]}\n"
    )
    h = harness(text, now=T0)
    got = [await h.decide("api", [("account", "a")], [("plan", "gold")]) for _ in range(6)]
    # Only the per-second limit is left: the 6th is over it, and per_minute never counted.
    assert [r.statuses[0].code for r in got] == [OK] * 5 + [OVER_LIMIT]
    assert {r.statuses[0].rule.name for r in got} == {""}
    assert h.backend.ttl("api_account_a_1000000_1s") > 0
    assert h.backend.ttl("api_account_a_999960_60s") == -2


async def test_stop_increment_counts_no_limit_of_an_over_descriptor(harness: Any) -> None:
    h = harness(CONFIG, now=T0, stop_increment=True)
    await ask(h, "account", 5)
    (over,) = await ask(h, "account", 1)  # over per second: the per-minute one is not counted
    assert over.code == OVER_LIMIT
    h.clock.now += 1
    got = await ask(h, "account", 3)
    assert [(s.rule.name, s.limit_remaining) for s in got] == [
        ("per_minute", 2),
        ("per_minute", 1),
        ("per_minute", 0),
    ]


async def test_local_cache_answers_the_new_algorithms(harness: Any) -> None:
    h = harness(CONFIG, now=T0, local_cache_bytes=1 << 20)
    await ask(h, "user", 20)
    (over,) = await ask(h, "user", 1)
    assert over.code == OVER_LIMIT
    # Over until its window (and the next's weight) lets one in: cached while certain.
    cached = await ask(h, "user", 3)
    assert codes(cached) == [OVER_LIMIT] * 3
    assert h.stat("ratelimit.service.rate_limit.api.user.over_limit_with_local_cache") == 3
    h.clock.now = T0 + 1.5  # weight 10 of 20: open again, the cache entry has expired
    assert codes(await ask(h, "user", 1)) == [OK]


async def test_response_headers_use_the_deciding_limits_reset(harness: Any) -> None:
    from ratelimitd.settings import ReloadOptions

    h = harness(CONFIG, now=T0 + 0.5, options=ReloadOptions(response_headers=True))
    r = await h.decide("api", [("bucket", "a")])
    assert dict(r.headers)["RateLimit-Reset"] == "1"
    r = await h.decide("api", [("report", "a")])
    assert dict(r.headers)["RateLimit-Reset"] == "2"  # 1.5 s left of the 2-second window


# -- the compiled maths against the pure twin ------------------------------------------------

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def window_args(draw: st.DrawFn) -> tuple[int, ...]:
    window = draw(
        st.one_of(st.sampled_from([1, 1000, 2000, 60_000, 86_400]), st.integers(1, 10**7))
    )
    limit = draw(st.one_of(st.integers(0, 50), st.integers(0, (1 << 50) // window)))
    now = draw(st.integers(window, 10**13))
    hits = draw(st.one_of(st.integers(0, 5), st.integers(0, limit + 2)))
    return window, limit, now, hits


@PROPS
@given(window_args(), st.data())
def test_sliding_window_twins_agree(args: tuple[int, ...], data: st.DataObject) -> None:
    window, limit, now, hits = args
    start = now - now % window
    w = data.draw(st.sampled_from([0, start, start - window, start - 3 * window, start + window]))
    c = data.draw(st.integers(0, limit + 3))
    p = data.draw(st.integers(0, limit + 3))
    pure = _keys_py.sliding_window(w, c, p, now, window, limit, hits)
    assert tuple(_keys.sliding_window(w, c, p, now, window, limit, hits)) == pure
    after, w2, c2, _p2, reset = pure
    assert reset >= 0
    if after <= limit:  # admitted: counted, and the level stays within the limit
        assert c2 - hits >= 0 and after <= limit
    else:
        assert reset > 0 and c2 == (c if w2 == w else 0)


@PROPS
@given(window_args(), st.data())
def test_token_bucket_twins_agree(args: tuple[int, ...], data: st.DataObject) -> None:
    window, limit, now, hits = args
    t = data.draw(st.one_of(st.just(0), st.integers(now - 2 * window, now + 2 * window)))
    f = data.draw(st.integers(0, limit + 1))
    pure = _keys_py.token_bucket(t, f, now, window, limit, hits)
    assert tuple(_keys.token_bucket(t, f, now, window, limit, hits)) == pure
    after, t2, f2, reset = pure
    if limit and after <= limit:
        assert now <= t2 + (f2 > 0) <= now + window + 1 and 0 <= f2 < limit
    assert reset >= 0


@PROPS
@given(
    st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), min_size=1, max_size=4),
    st.one_of(st.none(), st.lists(st.sampled_from(["", "a*", "*"]), max_size=5)),
    st.text(max_size=4),
)
def test_state_key_twins_agree(entries: list[tuple[str, str]], share: Any, prefix: str) -> None:
    share_t = tuple(share) if share is not None else None
    pure = _keys_py.state_key(prefix, "d", tuple(entries), share_t)
    assert _keys.state_key(prefix, "d", tuple(entries), share_t) == pure
    assert pure + "10" == _keys_py.cache_key(prefix, "d", tuple(entries), share_t, 10, 15)


@PROPS
@given(
    st.integers(0, 1 << 32),
    st.integers(0, 40),
    st.integers(0, (1 << 32) + 40),
    st.floats(0, 1),
    st.integers(0, 10**6),
    st.booleans(),
)
def test_verdict_twins_agree(
    limit: int, hits: int, after: int, ratio: float, reset: int, shadow: bool
) -> None:
    from ratelimitd.config import Rule

    rule = Rule("d.k", limit, 1, shadow_mode=shadow)
    a, b = RuleStats("d.k"), RuleStats("d.k")
    sa = _keys.verdict(rule, a, hits, after, ratio, reset)
    sb = _keys_py.verdict(rule, b, hits, after, ratio, reset)
    assert (sa.code, sa.limit_remaining, sa.duration_until_reset) == (
        sb.code,
        sb.limit_remaining,
        sb.duration_until_reset,
    )
    assert [getattr(a, n) for n in RULE_STATS] == [getattr(b, n) for n in RULE_STATS]
