"""Property tests: the compiled modules agree with their pure-Python twins (the oracles).

`_keys` vs `_keys_py` on random inputs, and `_match` vs `_match_py` lookups on random
generated configs and requests (both twins compile the same NodeSpecs).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimitd.config import Rule, _keys_py, _match_py
from ratelimitd.config.ruleset import NodeSpec
from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.stats import RULE_STATS, RuleStats

_keys = pytest.importorskip("ratelimitd.config._keys", reason="compiled extension not built")
_match = pytest.importorskip("ratelimitd.config._match", reason="compiled extension not built")

U64 = 2**64 - 1
U32 = 2**32 - 1
PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- _keys ---------------------------------------------------------------------------------


@st.composite
def evaluate_args(draw: st.DrawFn) -> tuple[int, int, int, int]:
    limit = draw(st.one_of(st.integers(0, 64), st.integers(0, U32), st.integers(0, U64)))
    # near = floor(limit * ratio) with a ratio in [0, 1], so never above the limit.
    near = draw(st.integers(0, limit))
    hits = draw(st.one_of(st.integers(0, 16), st.integers(0, U64)))
    after = draw(
        st.one_of(st.integers(0, 2 * limit + 16).map(lambda x: min(x, U64)), st.integers(0, U64))
    )
    return limit, hits, after, near


@PROPS
@given(evaluate_args())
def test_evaluate_twins_agree(args: tuple[int, int, int, int]) -> None:
    compiled = tuple(_keys.evaluate(*args))
    pure = tuple(_keys_py.evaluate(*args))
    assert compiled == pure
    over, remaining, over_add, near_add, within_add = pure
    limit, hits, after, _near = args
    assert all(0 <= x <= U64 for x in (remaining, over_add, near_add, within_add))
    assert over == (after > limit)
    if not over:
        assert remaining == limit - after and within_add == hits and over_add == 0


@PROPS
@given(
    st.integers(0, U32),
    st.integers(0, 1000),
    st.integers(0, 2 * U32),
    st.floats(0.0, 1.0, allow_nan=False),
    st.booleans(),
    st.sampled_from([1, 2, 3, 4, 5, 6, 7]),
    st.integers(0, 2**40),
)
def test_settle_twins_agree(
    limit: int, hits: int, after: int, ratio: float, shadow: bool, unit: int, now: int
) -> None:
    """The status split (Status and stats) is the same in both twins, and is `evaluate`'s."""
    rule = Rule("d.k", limit, unit, shadow_mode=shadow)
    results = []
    for module in (_keys, _keys_py):
        stats = RuleStats("d.k")
        status = module.settle(rule, stats, hits, after, ratio, now)
        counters = {name: getattr(stats, name) for name in RULE_STATS}
        results.append((status, counters))
    assert results[0] == results[1]
    status, counters = results[1]
    over, remaining, over_add, near_add, within_add = _keys_py.evaluate(
        limit, hits, after, _keys_py.near_threshold(limit, ratio)
    )
    assert counters["over_limit"] == over_add and counters["near_limit"] == near_add
    assert counters["within_limit"] == within_add
    assert counters["shadow_mode"] == (over_add if shadow else 0)
    assert status.code == (OVER_LIMIT if over and not shadow else OK)
    assert status.limit_remaining == remaining and status.rule is rule
    assert status.duration_until_reset == _keys_py.reset_seconds(now, rule.unit_seconds)


@PROPS
@given(st.integers(0, U32), st.floats(0.0, 1.0, allow_nan=False))
def test_near_threshold_twins_agree(limit: int, ratio: float) -> None:
    value = _keys.near_threshold(limit, ratio)
    assert value == _keys_py.near_threshold(limit, ratio)
    assert value >= 0


@PROPS
@given(
    st.integers(0, 10_000),
    st.sampled_from([0.0, 0.1, 0.25, 0.29, 1 / 3, 0.5, 0.75, 0.8, 0.9, 0.99, 1.0]),
)
def test_near_threshold_common_ratios(limit: int, ratio: float) -> None:
    value = _keys.near_threshold(limit, ratio)
    assert value == _keys_py.near_threshold(limit, ratio)
    assert value <= limit


TEXT = st.text(max_size=12)
ENTRIES = st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=5).map(tuple)
SECONDS = st.sampled_from(_keys_py.UNIT_SECONDS[1:])
NOW = st.integers(0, 2**40)


@st.composite
def cache_key_args(draw: st.DrawFn) -> tuple:
    entries = draw(ENTRIES)
    share = draw(
        st.one_of(
            st.none(), st.lists(st.one_of(st.just(""), TEXT), max_size=len(entries) + 1).map(tuple)
        )
    )
    return draw(TEXT), draw(TEXT), entries, share, draw(SECONDS), draw(NOW)


@PROPS
@given(cache_key_args())
def test_cache_key_twins_agree(args: tuple) -> None:
    prefix, domain, _entries, _share, seconds, now = args
    key = _keys.cache_key(*args)
    assert key == _keys_py.cache_key(*args)
    assert key.startswith(prefix + domain + "_")
    assert key.endswith("_" + str(now - now % seconds))


@PROPS
@given(st.integers(-3, 12), NOW, SECONDS)
def test_unit_and_window_twins_agree(unit: int, now: int, seconds: int) -> None:
    assert _keys.unit_seconds(unit) == _keys_py.unit_seconds(unit)
    assert _keys.window_start(now, seconds) == _keys_py.window_start(now, seconds)
    assert _keys.reset_seconds(now, seconds) == _keys_py.reset_seconds(now, seconds)
    assert 0 < _keys.reset_seconds(now, seconds) <= seconds


# --- _match --------------------------------------------------------------------------------

KEYS = ["a", "b", "a_x", "a*", "k"]
VALUES = ["", "", "x", "y", "xy", "x*", "*", "*y", "x*y", "x_y", "*x*"]
REQUEST_VALUES = ["", "x", "y", "xy", "xzy", "yx", "x_y", "xx", "*", "x*", "a", "_x"]


@st.composite
def level(draw: st.DrawFn, parent_key: str, depth: int) -> list[NodeSpec]:
    """One level of random config entries with unique composite keys."""
    specs: list[NodeSpec] = []
    seen: set[str] = set()
    for _ in range(draw(st.integers(1 if depth == 0 else 0, 4))):
        key = draw(st.sampled_from(KEYS))
        value = draw(st.sampled_from(VALUES))
        final_key = key + "_" + value if value else key
        if final_key in seen:
            continue
        seen.add(final_key)
        full_key = parent_key + "." + final_key
        rule = None
        if draw(st.booleans()):
            rule = Rule(
                full_key,
                draw(st.integers(0, 100)),
                draw(st.integers(1, 7)),
                detailed_metric=draw(st.booleans()),
                metadata={"k": full_key},
            )
        spec = NodeSpec(
            key,
            value,
            final_key,
            rule,
            value_to_metric=draw(st.booleans()),
            share_threshold="*" in final_key and draw(st.booleans()),
        )
        if depth < 2 and draw(st.booleans()):
            spec.children = draw(level(full_key, depth + 1))
        specs.append(spec)
    return specs


REQUESTS = st.lists(
    st.lists(
        st.tuples(st.sampled_from(KEYS), st.sampled_from(REQUEST_VALUES)), min_size=1, max_size=4
    ).map(tuple),
    min_size=1,
    max_size=8,
)


def _norm(found: Any) -> Any:
    if found is None:
        return None
    rule, key, share, keep = found
    return id(rule), key, None if share is None else tuple(share), bool(keep)


@st.composite
def guided_request(draw: st.DrawFn, specs: list[NodeSpec]) -> tuple:
    """A request that mostly walks the generated config (so lookups often find a rule)."""
    entries: list[tuple[str, str]] = []
    level_specs: list[NodeSpec] = specs
    for _ in range(draw(st.integers(1, 4))):
        walk: int = draw(st.integers(0, 4))
        if level_specs and walk:
            spec = draw(st.sampled_from(level_specs))
            if spec.value and draw(st.booleans()):
                filler = draw(st.sampled_from(["", "x", "zz", "_"]))
                value = spec.value.replace("*", filler)
            else:
                value = draw(st.sampled_from(REQUEST_VALUES))
            entries.append((spec.key, value))
            level_specs = spec.children
        else:
            entries.append((draw(st.sampled_from(KEYS)), draw(st.sampled_from(REQUEST_VALUES))))
            level_specs = []
    return tuple(entries)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(level("dom", 0), REQUESTS, st.data())
def test_match_twins_agree(
    specs: list[NodeSpec], requests: list[tuple], data: st.DataObject
) -> None:
    compiled_root = _match.compile_level(specs)
    pure_root = _match_py.compile_level(specs)
    guided = [data.draw(guided_request(specs)) for _ in range(6)]
    for entries in [*requests, *guided]:
        compiled = _match.lookup(compiled_root, "dom", entries)
        pure = _match_py.lookup(pure_root, "dom", entries)
        assert _norm(compiled) == _norm(pure), entries
        if pure is not None:
            assert compiled[0] is pure[0]  # the very same Rule object


@PROPS
@given(
    st.lists(st.text(alphabet="ab*", max_size=6), min_size=1, max_size=4),
    st.text(alphabet="abc", max_size=8),
)
def test_wildcard_match_twins_agree(parts: list[str], s: str) -> None:
    pattern = tuple("*".join(parts).split("*"))
    assert _match.wildcard_match(pattern, s) == _match_py.wildcard_match(pattern, s)


def test_lookup_of_empty_entries() -> None:
    specs = [NodeSpec("a", "", "a", Rule("dom.a", 1, 1), False, False)]
    assert _match.lookup(_match.compile_level(specs), "dom", ()) is None
    assert _match_py.lookup(_match_py.compile_level(specs), "dom", ()) is None
