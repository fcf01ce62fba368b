"""Descriptor matching: the reference's `GetLimit`, on both twins.

Expectations come from envoyproxy/ratelimit's `test/config/config_test.go` (its configs are the
files in tests/configs) and its `GetLimit` (`src/config/config_impl.go`). Every matching case runs
against the compiled `ratelimitd.config._match` and the pure `ratelimitd.config._match_py` (the
`impl` and `match` fixtures of tests/core/conftest.py).

Here: basic_config.yaml, the README examples, wildcard values and their stats keys, the
/rlconfig dump, the compiled trie against its pure twin, and limit overrides. Which entry a
request value selects when several could (precedence, underscore collisions, empty values) and
the stats key a match is counted under are in test_match_keys.py.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from support.core import CONFIGS, DAY, HOUR, MINUTE, SECOND, Matcher, ruleset_of
from support.core import MATCH_IMPLEMENTATIONS as IMPLEMENTATIONS

from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.messages import Descriptor


def test_both_implementations_are_distinct(impl: ModuleType) -> None:
    # Guard against the compiled module silently being the twin (or failing to build).
    assert impl.__name__ in IMPLEMENTATIONS
    assert impl.__file__ is not None
    if impl.__name__ == "ratelimitd.config._match":
        assert not impl.__file__.endswith(".py")


# --- basic_config.yaml (TestBasicConfig) ----------------------------------------------------


def test_basic_no_entries(match) -> None:
    assert match("basic_config.yaml")("test-domain") is None


@pytest.mark.parametrize(
    "entries",
    [
        [("key1", "something")],  # no key-only key1
        [("key1", "value1")],  # key1_value1 has no limit of its own
        [("key2", "value2"), ("subkey", "subvalue")],  # depth rule: no fallback to key2_value2
        [("key5", "value5"), ("subkey5", "subvalue")],  # depth rule under a node with a limit
        [("key2", "value3")],  # whitelisted value, although key-only key2 exists
        [("key2", "value3"), ("x", "y")],
        [("key1", "value1"), ("subkey1", "x"), ("deeper", "y")],  # past a leaf
        [("nokey", "x")],
    ],
)
def test_basic_no_limit(match, entries: list[tuple[str, str]]) -> None:
    assert match("basic_config.yaml")("test-domain", *entries) is None


@pytest.mark.parametrize(
    ("entries", "rpu", "unit", "key"),
    [
        ([("key1", "value1"), ("subkey1", "something")], 5, SECOND, "key1_value1.subkey1"),
        (
            [("key1", "value1"), ("subkey1", "subvalue1")],
            10,
            SECOND,
            "key1_value1.subkey1_subvalue1",
        ),
        ([("key2", "something")], 20, MINUTE, "key2"),
        ([("key2", "value2")], 30, MINUTE, "key2_value2"),
        ([("key3", "foo")], 1, HOUR, "key3"),
        ([("key4", "foo")], 1, DAY, "key4"),
        ([("key5", "value5")], 15, DAY, "key5_value5"),
        ([("key5", "value5"), ("subkey5", "subvalue5")], 25, DAY, "key5_value5.subkey5_subvalue5"),
        # detailed_metric: every request value is in the stats key
        ([("key7", "unspecified_value")], 70, MINUTE, "key7_unspecified_value"),
        ([("key7", "another_value")], 70, MINUTE, "key7_another_value"),
        # an empty request value looks up `key2_`, then the key-only node
        ([("key2", "")], 20, MINUTE, "key2"),
        # detailed_metric with an empty value yields `k_` (reference doc 5.1, inferred)
        ([("key7", "")], 70, MINUTE, "key7_"),
    ],
)
def test_basic_limits(match, entries, rpu: int, unit: int, key: str) -> None:
    rule, stats_key, share, _ = match("basic_config.yaml")("test-domain", *entries)
    assert (rule.requests_per_unit, rule.unit) == (rpu, unit)
    assert stats_key == f"test-domain.{key}"
    assert share is None
    assert not rule.unlimited


def test_basic_rule_attributes(match) -> None:
    m = match("basic_config.yaml")
    key4 = m.rule("test-domain", ("key4", "x"))
    assert key4.name == "key4_rate_limit"
    assert key4.full_key == "test-domain.key4"
    assert key4.unit_name == "DAY"
    assert key4.replaces == ()
    assert not (key4.shadow_mode or key4.quota_mode or key4.detailed_metric)
    assert key4.metadata is None
    assert m.rule("test-domain", ("key7", "x")).detailed_metric


def test_unlimited(match) -> None:
    rule, stats_key, share, _ = match("basic_config.yaml")("test-domain", ("key6", "foo"))
    assert rule.unlimited
    assert stats_key == "test-domain.key6"
    assert rule.unit_name == "UNKNOWN"
    assert rule.requests_per_unit == 0
    assert share is None


def test_key_only_rule_is_shared_by_all_values(match) -> None:
    m = match("basic_config.yaml")
    first = m("test-domain", ("key2", "a"))
    second = m("test-domain", ("key2", "b"))
    assert first[0] is second[0]
    assert first[1] == second[1] == "test-domain.key2"


def test_shadow_mode_flags(match) -> None:
    m = match("shadowmode_config.yaml")
    assert not m.rule("test-domain", ("key1", "value1"), ("subkey1", "x")).shadow_mode
    assert m.rule("test-domain", ("key1", "value1"), ("subkey1", "subvalue1")).shadow_mode
    assert m.rule("test-domain", ("key2", "x")).shadow_mode
    assert not m.rule("test-domain", ("key2", "value2")).shadow_mode


def test_quota_mode_flag_is_per_entry(match) -> None:
    m = match(
        "domain: q\ndescriptors:\n"
        "  - key: a\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
        "    descriptors:\n      - key: b\n        rate_limit: {unit: hour, requests_per_unit: 1}\n"
    )
    assert m.rule("q", ("a", "1")).quota_mode
    assert not m.rule("q", ("a", "1"), ("b", "2")).quota_mode  # nothing is inherited


def test_merged_domains(impl: ModuleType) -> None:
    files = [
        ConfigFile(n, (CONFIGS / n).read_text())
        for n in ("merge_domain_key1.yaml", "merge_domain_key2.yaml")
    ]
    m = Matcher(impl, load_ruleset(files, merge_domains=True))
    assert m.rule("test-domain", ("key1", "value1")).requests_per_unit == 10
    assert m.rule("test-domain", ("key2", "value2")).requests_per_unit == 20


# --- README examples -------------------------------------------------------------------------


def test_readme_depth_rule(match) -> None:
    m = match("readme_example4_depth.yaml")
    assert m.rule("example4", ("key", "value")).requests_per_unit == 300
    assert m("example4", ("key", "value"), ("user", "x")) is None
    assert m("example4", ("user", "x"), ("key", "value")) is None


def test_readme_blacklist_exact_beats_key_only(match) -> None:
    m = match("readme_example3_blacklist.yaml")
    assert m.rule("edge_proxy_per_ip", ("remote_address", "50.0.0.5")).requests_per_unit == 0
    assert m.rule("edge_proxy_per_ip", ("remote_address", "1.2.3.4")).requests_per_unit == 10


def test_readme_replaces(match) -> None:
    m = match("readme_example7_replaces.yaml")
    specific = m.rule("example7", ("key_1", "value_1"), ("user", "bkthomps"))
    replacing = m.rule("example7", ("key_2", "value_2"), ("user", "bkthomps"))
    assert (specific.name, specific.replaces) == ("specific_limit", ())
    assert (replacing.name, replacing.replaces) == ("", ("specific_limit",))
    assert (specific.requests_per_unit, replacing.requests_per_unit) == (5, 10)


# --- wildcards (wildcard.yaml, TestWildcardConfig) ------------------------------------------


def test_wildcard_config(match) -> None:
    m = match("wildcard.yaml")
    d = "test-domain"
    assert m(d, ("noVal", "foo1"))[:2] == m(d, ("noVal", "foo2"))[:2]
    assert m.key(d, ("noVal", "foo1")) == "test-domain.noVal"
    w1, w2 = m(d, ("wild", "foo1")), m(d, ("wild", "foo2"))
    assert w1 is not None and w1[0] is w2[0]
    assert w1[1] == w2[1] == "test-domain.wild_foo*"
    assert w1[2] is None  # no share_threshold: one counter per value
    assert m(d, ("wild", "bar")) is None
    assert m(d, ("noWild", "foo1")) is None  # a plain value is not a prefix
    assert m(d, ("midWildcard", "barab")) is None  # no such key


@pytest.mark.parametrize(
    ("entry", "matches"),
    [
        (("wild", "foo"), True),  # a trailing * matches the empty string
        (("wild", "foo/x/y"), True),
        (("wild", "fo"), False),
        (("wild", "xfoo"), False),
        (("midWild", "barb"), True),  # bar*b matches barb
        (("midWild", "barab"), True),
        (("midWild", "bar123b"), True),
        (("midWild", "bar"), False),
        (("midWild", "barbx"), False),
        (("multiWild", "foo123baz"), False),  # foo*bar*baz needs `bar`
        (("multiWild", "foobarbaz"), True),
        (("multiWild", "foo1bar2baz"), True),
        (("multiWild", "foobazbarbaz"), True),
        (("multiWild", "foobarba"), False),
    ],
)
def test_wildcard_anywhere(match, entry: tuple[str, str], matches: bool) -> None:
    assert (match("wildcard.yaml")("test-domain", entry) is not None) is matches


def test_nested_wildcards_are_per_level(match) -> None:
    m = match("wildcard.yaml")
    rule, key, _, _ = m("test-domain", ("nestedWild", "val1"), ("wild", "goo1"))
    assert rule.requests_per_unit == 20
    assert key == "test-domain.nestedWild_val1.wild_goo*"
    # the top-level `wild_foo*` is not consulted below `nestedWild_val1`
    assert m("test-domain", ("nestedWild", "val1"), ("wild", "foo1")) is None
    assert m("test-domain", ("nestedWild", "val2"), ("wild", "goo1")) is None


MORE_WILDCARDS = """
domain: w
descriptors:
  - key: lead
    value: '*bar'
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: ovl
    value: x*ab*ba
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: star*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: both
    value: a*
    descriptors:
      - key: inner
        value: '*z'
        rate_limit: {unit: second, requests_per_unit: 4}
"""


@pytest.mark.parametrize(
    ("entries", "rpu"),
    [
        ([("lead", "bar")], 1),
        ([("lead", "xbar")], 1),
        ([("lead", "barx")], None),
        ([("ovl", "xaba")], None),  # middle and last parts may not overlap
        ([("ovl", "xabba")], 2),
        ([("ovl", "xabxba")], 2),
        # `*` in a key makes a key-only wildcard on the whole `key_value` string
        ([("starry", "x")], 3),
        ([("star", "")], 3),
        ([("both", "a1"), ("inner", "xyz")], 4),
        ([("both", "a1"), ("inner", "xy")], None),
    ],
)
def test_more_wildcard_shapes(match, entries, rpu: int | None) -> None:
    found = match(MORE_WILDCARDS)("w", *entries)
    assert (found[0].requests_per_unit if found else None) == rpu


def _oracle(pattern: str, s: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, s, re.DOTALL) is not None


@settings(max_examples=100, deadline=None)
@given(
    st.text("ab*", min_size=1, max_size=7).filter(lambda p: "*" in p),
    st.text("ab", max_size=8),
)
def test_wildcard_match_agrees_with_a_regex_oracle(pattern: str, s: str) -> None:
    parts = tuple(pattern.split("*"))
    expected = _oracle(pattern, s)
    for name in IMPLEMENTATIONS:
        assert importlib.import_module(name).wildcard_match(parts, s) is expected, name


# --- wildcard stats behaviour (wsb_*.yaml, TestWildcardStatsBehavior) ---------------------------


@pytest.mark.parametrize(
    ("config", "entries", "key", "share"),
    [
        ("wsb_no_flags.yaml", [("wild", "foo1")], "test-domain.wild_foo*", None),
        ("wsb_share_threshold.yaml", [("wild", "foo1")], "test-domain.wild_foo*", ("foo*",)),
        ("wsb_value_to_metric.yaml", [("wild", "foo1")], "test-domain.wild_foo1", None),
        ("wsb_share_and_vtm.yaml", [("wild", "foo1")], "test-domain.wild_foo*", ("foo*",)),
        ("wsb_mid_trailing.yaml", [("wild", "foo1bar2")], "test-domain.wild_foo*bar*", None),
        ("wsb_mid_trailing_vtm.yaml", [("wild", "foo1bar2")], "test-domain.wild_foo1bar2", None),
        (
            "wsb_vtm_other_descriptor.yaml",
            [("wild", "foo1"), ("other", "o1"), ("limit", "l")],
            "test-domain.wild_foo*.other_o1.limit",
            None,
        ),
    ],
)
def test_wildcard_stats_behaviour(match, config: str, entries, key: str, share) -> None:
    rule, stats_key, got_share, _ = match(config)("test-domain", *entries)
    assert rule.requests_per_unit == 20
    assert stats_key == key
    assert got_share == share


# --- dump (/rlconfig) ----------------------------------------------------------------------------


def test_dump_basic_config() -> None:
    line = "test-domain.{}: unit={} requests_per_unit={}, shadow_mode: false, quota_mode: false\n"
    expected = "".join(
        line.format(*row)
        for row in [
            ("key1_value1.subkey1", "SECOND", 5),
            ("key1_value1.subkey1_subvalue1", "SECOND", 10),
            ("key2", "MINUTE", 20),
            ("key2_value2", "MINUTE", 30),
            ("key3", "HOUR", 1),
            ("key4", "DAY", 1),
            ("key5_value5", "DAY", 15),
            ("key5_value5.subkey5_subvalue5", "DAY", 25),
            ("key6", "UNKNOWN", 0),
            ("key7", "MINUTE", 70),
        ]
    )
    assert ruleset_of("basic_config.yaml").dump() == expected


def test_dump_flags_and_units() -> None:
    text = (
        "domain: f\ndescriptors:\n"
        "  - key: a\n    shadow_mode: true\n    rate_limit: {unit: Week, requests_per_unit: 2}\n"
        "  - key: b\n    quota_mode: true\n    rate_limit: {unit: month, requests_per_unit: 0}\n"
        "  - key: c\n    rate_limit: {unit: YEAR, requests_per_unit: 9}\n"
        "  - key: d\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n"
        "  - key: e\n"
    )
    assert ruleset_of(text).dump() == (
        "f.a: unit=WEEK requests_per_unit=2, shadow_mode: true, quota_mode: false\n"
        "f.b: unit=MONTH requests_per_unit=0, shadow_mode: false, quota_mode: true\n"
        "f.c: unit=YEAR requests_per_unit=9, shadow_mode: false, quota_mode: false\n"
        "f.d: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n"
    )


def test_dump_without_rules_is_empty() -> None:
    assert ruleset_of("domain: x\ndescriptors:\n  - key: a\n").dump() == ""
    assert load_ruleset([]).dump() == ""


def test_rules_in_config_order() -> None:
    keys = [r.full_key for r in ruleset_of("share_threshold.yaml").rules()]
    assert keys[:3] == [
        "test-domain.files_files/*",
        "test-domain.nested_parent.files_nested/*",
        "test-domain.files_top/*.files_nested/*",
    ]


# --- the compiled trie agrees with its pure twin --------------------------------------------

_KEYS = ["a", "b", "a_x", "b*"]
_VALUES = ["", "x", "x*", "*", "*y", "x*y"]


def _descriptor(depth: int) -> st.SearchStrategy[dict[str, object]]:
    children = st.lists(_descriptor(depth - 1), max_size=3) if depth > 1 else st.just([])
    return st.fixed_dictionaries(
        {"key": st.sampled_from(_KEYS), "value": st.sampled_from(_VALUES)},
        optional={
            "rate_limit": st.fixed_dictionaries(
                {"unit": st.just("second"), "requests_per_unit": st.integers(0, 3)}
            ),
            "detailed_metric": st.booleans(),
            "value_to_metric": st.booleans(),
            "share_threshold": st.just(True),
            "descriptors": children,
        },
    )


def _unique(descriptors: list[dict[str, object]]) -> list[dict[str, object]]:
    """Drop duplicate composite keys and share_threshold without `*`, recursively."""
    seen, out = set(), []
    for d in descriptors:
        final = f"{d['key']}_{d['value']}" if d["value"] else d["key"]
        if final in seen:
            continue
        seen.add(final)
        d = dict(d)
        if d.get("share_threshold") and "*" not in str(final):
            del d["share_threshold"]
        if "descriptors" in d:
            d["descriptors"] = _unique(d["descriptors"])  # type: ignore[arg-type]
        out.append(d)
    return out


@settings(max_examples=80, deadline=None)
@given(
    st.lists(_descriptor(3), max_size=5),
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["a", "b", "a_x", "bz"]),
                st.sampled_from(["", "x", "xy", "y", "xay"]),
            ),
            min_size=1,
            max_size=3,
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_compiled_agrees_with_pure_twin(descriptors, requests) -> None:
    text = yaml.safe_dump({"domain": "t", "descriptors": _unique(descriptors)}, sort_keys=False)
    ruleset = ruleset_of(text)
    compiled = Matcher(importlib.import_module("ratelimitd.config._match"), ruleset)
    pure = Matcher(importlib.import_module("ratelimitd.config._match_py"), ruleset)
    for entries in requests:
        got, want = compiled("t", *entries), pure("t", *entries)
        if want is None:
            assert got is None
        else:
            assert got is not None
            assert got[0] is want[0]
            assert got[1:] == want[1:]


# --- limit override (TestConfigLimitOverride) -----------------------------------------------------


async def test_limit_override_end_to_end(harness) -> None:
    h = harness(CONFIGS / "basic_config.yaml")
    entries = (("key1", "value1"), ("subkey1", "something"))
    first = await h.decide("test-domain", Descriptor(entries, limit=(10, DAY)))
    second = await h.decide("test-domain", Descriptor(entries, limit=(42, HOUR)))
    other = (("key1", "value1"), ("subkey1", "something_else"))
    await h.decide("test-domain", Descriptor(other, limit=(42, HOUR)))
    # the override is used instead of the config's 5/SECOND rule, with every value in the key
    assert (first.statuses[0].rule.requests_per_unit, first.statuses[0].rule.unit) == (10, DAY)
    assert (second.statuses[0].rule.requests_per_unit, second.statuses[0].rule.unit) == (42, HOUR)
    assert second.statuses[0].rule.full_key == "test-domain.key1_value1.subkey1_something"
    prefix = "ratelimit.service.rate_limit.test-domain.key1_value1"
    assert h.stat(f"{prefix}.subkey1_something.total_hits") == 2  # a new override keeps stats
    assert h.stat(f"{prefix}.subkey1_something_else.total_hits") == 1
    assert h.stat(f"{prefix}.subkey1.total_hits") == 0


async def test_limit_override_applies_to_any_descriptor_of_a_known_domain(harness) -> None:
    h = harness(CONFIGS / "basic_config.yaml")
    # (key2, value3) is whitelisted in the config, but the override is checked first
    response = await h.decide("test-domain", Descriptor((("key2", "value3"),), limit=(3, MINUTE)))
    assert response.statuses[0].rule.requests_per_unit == 3
    assert h.stat("ratelimit.service.rate_limit.test-domain.key2_value3.total_hits") == 1
