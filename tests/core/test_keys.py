"""Cache keys, window arithmetic and near-limit maths, pinned to envoyproxy/ratelimit.

Every case runs against both the compiled `_keys` and its pure twin `_keys_py`
(`test/limiter/cache_key_test.go`,
`test/limiter/base_limiter_test.go`, `test/redis/fixed_cache_impl_test.go`).
"""

from __future__ import annotations

import importlib
import math
import os
from types import ModuleType

import pytest

from ratelimitd.config import keys

SECOND, MINUTE, HOUR, DAY, MONTH, YEAR, WEEK = 1, 2, 3, 4, 5, 6, 7
U64 = 2**64


@pytest.fixture(
    params=["ratelimitd.config._keys", "ratelimitd.config._keys_py"], ids=["compiled", "pure"]
)
def km(request: pytest.FixtureRequest) -> ModuleType:
    """The key-maths module under test, imported explicitly (not through the selector)."""
    return importlib.import_module(request.param)


def test_selector_uses_the_compiled_module_in_a_normal_install() -> None:
    expected = "pure" if os.environ.get("RATELIMITD_NO_EXTENSIONS") else "compiled"
    assert expected == keys.IMPLEMENTATION


# The selector's own names; every other public name comes from a twin.
SELECTOR_NAMES = {"IMPLEMENTATION", "METER_TTL_SECONDS", "implementation", "meter_key"}


def test_twins_expose_the_same_names() -> None:
    compiled = importlib.import_module("ratelimitd.config._keys")
    pure = importlib.import_module("ratelimitd.config._keys_py")
    for name in keys.__all__:
        if name not in SELECTOR_NAMES:
            assert hasattr(compiled, name) and hasattr(pure, name), name
    assert compiled.UNIT_SECONDS == pure.UNIT_SECONDS


def test_implementation_is_chosen_by_name() -> None:
    assert keys.implementation("compiled") is importlib.import_module("ratelimitd.config._keys")
    assert keys.implementation("pure") is importlib.import_module("ratelimitd.config._keys_py")
    assert keys.implementation(None).cache_key is keys.cache_key
    with pytest.raises(ValueError, match="unknown implementation 'fast'"):
        keys.implementation("fast")


# --- units and windows -------------------------------------------------------------


@pytest.mark.parametrize(
    ("unit", "seconds"),
    [
        (0, 0),
        (SECOND, 1),
        (MINUTE, 60),
        (HOUR, 3600),
        (DAY, 86400),
        (MONTH, 30 * 86400),
        (YEAR, 365 * 86400),
        (WEEK, 7 * 86400),
        (8, 0),
        (-1, 0),
    ],
)
def test_unit_seconds(km: ModuleType, unit: int, seconds: int) -> None:
    assert km.unit_seconds(unit) == seconds


@pytest.mark.parametrize(
    ("now", "seconds", "start", "reset"),
    [
        (1234, 1, 1234, 1),
        (1234, 60, 1200, 26),
        (2222, 60, 2220, 58),  # the reference service test's reset header value
        (1_000_000, 3600, 997_200, 800),
        (1_000_000, 86400, 950_400, 36_800),
        (1200, 60, 1200, 60),  # on the boundary the whole window remains, never 0
    ],
)
def test_window_start_and_reset(
    km: ModuleType, now: int, seconds: int, start: int, reset: int
) -> None:
    assert km.window_start(now, seconds) == start
    assert km.reset_seconds(now, seconds) == reset


# --- cache keys --------------------------------------------------------------------

T_2024 = 1714825815  # 2024-05-04 12:30:15 UTC (cache_key_test.go)


@pytest.mark.parametrize(
    ("prefix", "domain", "entries", "share", "unit", "now", "expected"),
    [
        ("", "domain", [("key", "value")], None, SECOND, 1234, "domain_key_value_1234"),
        (
            "prefix:",
            "domain",
            [("key", "value")],
            None,
            SECOND,
            1234,
            "prefix:domain_key_value_1234",
        ),
        (
            "",
            "domain",
            [("key2", "value2"), ("subkey2", "subvalue2")],
            None,
            MINUTE,
            1234,
            "domain_key2_value2_subkey2_subvalue2_1200",
        ),
        ("", "domain", [("key3", "value3")], None, HOUR, 1_000_000, "domain_key3_value3_997200"),
        (
            "",
            "domain",
            [("key3", "value3"), ("subkey3", "subvalue3")],
            None,
            DAY,
            1_000_000,
            "domain_key3_value3_subkey3_subvalue3_950400",
        ),
        ("", "domain", [("key", "value")], None, SECOND, T_2024, "domain_key_value_1714825815"),
        ("", "domain", [("key", "value")], None, MINUTE, T_2024, "domain_key_value_1714825800"),
        ("", "domain", [("key", "value")], None, HOUR, T_2024, "domain_key_value_1714824000"),
        ("", "domain", [("key", "value")], None, HOUR, 1714827599, "domain_key_value_1714824000"),
        ("", "domain", [("key", "value")], None, DAY, T_2024, "domain_key_value_1714780800"),
        # WEEK, MONTH and YEAR are fixed 7/30/365-day blocks aligned to the epoch.
        ("", "domain", [("key", "value")], None, WEEK, T_2024, "domain_key_value_1714608000"),
        ("", "domain", [("key", "value")], None, MONTH, T_2024, "domain_key_value_1713312000"),
        ("", "domain", [("key", "value")], None, YEAR, T_2024, "domain_key_value_1702944000"),
        ("", "domain", [("key", "value")], None, MONTH, 1_000_000, "domain_key_value_0"),
        # An empty value keeps both separators.
        ("", "d", [("k", "")], None, MINUTE, 1234, "d_k__1200"),
        # share_threshold: the pattern replaces the value at its index only.
        (
            "",
            "domain",
            [("files", "a/b.txt")],
            ("files/*",),
            SECOND,
            1234,
            "domain_files_files/*_1234",
        ),
        (
            "",
            "d",
            [("svc", "x"), ("path", "/api/v1")],
            ("", "/api*"),
            MINUTE,
            1234,
            "d_svc_x_path_/api*_1200",
        ),
        (
            "",
            "d",
            [("svc", "x"), ("path", "/api/v1")],
            ("", ""),
            MINUTE,
            1234,
            "d_svc_x_path_/api/v1_1200",
        ),
        # A share tuple shorter than the entries leaves the rest as values.
        ("", "d", [("a", "1"), ("b", "2")], ("p*",), SECOND, 5, "d_a_p*_b_2_5"),
        # Nothing is escaped: separators inside keys and values are kept as they are.
        (
            "p_",
            "dom_ain",
            [("k_1", "v_1"), ("ключ", "значение ✓")],
            None,
            SECOND,
            7,
            "p_dom_ain_k_1_v_1_ключ_значение ✓_7",
        ),
    ],
)
def test_cache_key(
    km: ModuleType,
    prefix: str,
    domain: str,
    entries: list[tuple[str, str]],
    share: tuple[str, ...] | None,
    unit: int,
    now: int,
    expected: str,
) -> None:
    key = km.cache_key(prefix, domain, tuple(entries), share, km.unit_seconds(unit), now)
    assert key == expected


# --- near threshold (float32) -------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "ratio", "expected"),
    [
        (15, 0.8, 12),
        (8, 0.8, 6),
        (20, 0.8, 16),
        (14, 0.8, 11),
        (10, 0.8, 8),
        (1, 0.8, 0),
        (0, 0.8, 0),
        (100, 0.29, 29),  # float32: 29; float64 would give 28
        (7, 0.3, 2),
        (3, 1 / 3, 1),
        (50, 1.0, 50),
        (50, 0.0, 0),
        (4294967295, 0.8, 3435973888),  # float32(2^32-1) rounds to 2^32 first
    ],
)
def test_near_threshold_is_float32(km: ModuleType, limit: int, ratio: float, expected: int) -> None:
    assert km.near_threshold(limit, ratio) == expected


def test_float64_would_differ_for_029() -> None:
    # Documents why the float32 maths matters: the naive computation is one lower.
    assert math.floor(100 * 0.29) == 28


# --- evaluate: status and the over/near/within split --------------------------------
# (over, remaining, over_add, near_add, within_add) = evaluate(limit, hits, after, near)


@pytest.mark.parametrize(
    ("limit", "hits", "after", "near", "expected"),
    [
        # Below the near threshold.
        (10, 1, 5, 8, (False, 5, 0, 0, 1)),
        (20, 3, 5, 16, (False, 15, 0, 0, 3)),
        # base_limiter_test TestGetResponseStatusBelowLimit.
        (10, 1, 6, 9, (False, 4, 0, 0, 1)),
        # Crossing the near threshold: only the part above it is near.
        (8, 2, 7, 6, (False, 1, 0, 1, 2)),
        (15, 1, 13, 12, (False, 2, 0, 1, 1)),
        # Entirely above the near threshold.
        (20, 3, 19, 16, (False, 1, 0, 3, 3)),
        # counter == limit is OK with remaining 0.
        (10, 1, 10, 8, (False, 0, 0, 1, 1)),
        # Crossing the limit: over counts only hits above it, near the rest above near.
        (20, 3, 22, 16, (True, 0, 2, 1, 0)),
        (20, 7, 22, 16, (True, 0, 2, 4, 0)),
        (15, 1, 16, 12, (True, 0, 1, 0, 0)),
        (5, 5, 7, 4, (True, 0, 2, 1, 0)),  # TestGetResponseStatusOverLimit
        # Already over before: every hit is over.
        (10, 3, 30, 8, (True, 0, 3, 0, 0)),
        (10, 1, 11, 8, (True, 0, 1, 0, 0)),
        # hits 0 (check only): the status follows the counter, nothing is counted.
        (10, 0, 11, 8, (True, 0, 0, 0, 0)),
        (10, 0, 10, 8, (False, 0, 0, 0, 0)),
        (10, 0, 0, 8, (False, 10, 0, 0, 0)),
        # requests_per_unit 0: any hit is over; no hit at counter 0 is OK with 0 remaining.
        (0, 1, 1, 0, (True, 0, 1, 0, 0)),
        (0, 0, 0, 0, (False, 0, 0, 0, 0)),
        # uint64 wrap of before = after - hits (non-incremented keys in stop-increment mode).
        (10, 1, 0, 8, (False, 10, 0, 0, 1)),
        (10, 12, 9, 8, (False, 1, 0, 12, 12)),  # wrapped before >= near: all hits near
        (10, 20, 11, 8, (True, 0, 20, 0, 0)),  # wrapped before >= limit: all hits over
        # Large counters stay exact.
        (4294967295, 1, 4294967296, 3435973888, (True, 0, 1, 0, 0)),
        (U64 - 2, 1, U64 - 1, 0, (True, 0, 1, 0, 0)),
    ],
)
def test_evaluate(
    km: ModuleType, limit: int, hits: int, after: int, near: int, expected: tuple
) -> None:
    assert tuple(km.evaluate(limit, hits, after, near)) == expected


@pytest.mark.parametrize(
    "module",
    [
        "ratelimitd.config._keys",
        "ratelimitd.config._keys_py",
    ],
)
def test_evaluate_near_above_limit_wraps_like_go(module: str) -> None:
    # NEAR_LIMIT_RATIO is not validated, so 1.5 gives near 15 for limit 10; the over branch
    # then adds limit - max(near, before) = 10 - 15 in uint64.
    km = importlib.import_module(module)
    assert tuple(km.evaluate(10, 5, 12, 15)) == (True, 0, 2, U64 - 5, 0)


def test_a_stale_compiled_module_falls_back_to_the_twin() -> None:
    """A built module lacking a name its twin has (a .so older than its .pyx) is not used:
    the twin serves, as when nothing is built, instead of the import failing."""
    from ratelimitd._twins import select
    from ratelimitd.config import _keys_py
    from ratelimitd.settings import extensions_disabled

    if not extensions_disabled():  # a module with every name is taken
        assert select("ratelimitd.config._keys_py", _keys_py) == (_keys_py, "compiled")
    assert select("json", _keys_py) == (_keys_py, "pure")
    assert select("ratelimitd.no_such_module", _keys_py) == (_keys_py, "pure")
