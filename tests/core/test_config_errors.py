"""Config loading and validation: the reference's exact error texts.

Expectations come from envoyproxy/ratelimit's `test/config/config_test.go` (the `expectConfigPanic`
cases) and the reference's `src/config/config_impl.go`. Every error is `<config name>: <message>`.

Here: the reference's own cases, then what a decoded config may hold: domains and
MERGE_DOMAIN_CONFIG, keys, units, replaces and share_threshold, which problem is reported
first, and that every shipped example config loads. Decoding the YAML as yaml.v2 does (typed
unmarshal, the key whitelist, scalars, syntax) and loading random input without a crash are in
test_config_yaml.py; the check-config CLI is in test_config_cli.py.
"""

from __future__ import annotations

import pytest
from support.core import CONFIGS, error_of, load_text, one_rule

from ratelimitd.config import ConfigError, ConfigFile, RuleSet, load_paths, load_ruleset


def load_config(*names: str, merge: bool = False) -> RuleSet:
    """Load files from tests/configs, named by their bare file name (as the Go tests do)."""
    files = [ConfigFile(n, (CONFIGS / n).read_text()) for n in names]
    return load_ruleset(files, merge_domains=merge)


def config_error(*names: str, merge: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*names, merge=merge)
    return str(info.value)


# --- the reference's own cases (config_test.go expectConfigPanic) ----------------------------


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["empty_domain.yaml"], "empty_domain.yaml: config file cannot have empty domain"),
        (
            ["basic_config.yaml", "duplicate_domain.yaml"],
            "duplicate_domain.yaml: duplicate domain 'test-domain' in config file",
        ),
        (["empty_key.yaml"], "empty_key.yaml: descriptor has empty key"),
        (
            ["duplicate_key.yaml"],
            "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (["bad_limit_unit.yaml"], "bad_limit_unit.yaml: invalid rate limit unit 'foo'"),
        (
            ["replaces_self.yaml"],
            "replaces_self.yaml: replaces should not contain name of same descriptor",
        ),
        (["replaces_empty.yaml"], "replaces_empty.yaml: should not have an empty replaces entry"),
        (
            ["bad_yaml.yaml"],
            "bad_yaml.yaml: error loading config file: "
            "yaml: line 2: found unexpected end of stream",
        ),
        (["misspelled_key.yaml"], "misspelled_key.yaml: config error, unknown key 'ratelimit'"),
        (
            ["misspelled_key2.yaml"],
            "misspelled_key2.yaml: config error, unknown key 'requestsperunit'",
        ),
        (
            ["non_string_key.yaml"],
            "non_string_key.yaml: config error, key is not of type string: 0.25",
        ),
        (
            ["non_map_list.yaml"],
            "non_map_list.yaml: config error, yaml file contains list of type other than map: a",
        ),
        (
            ["unlimited_with_unit.yaml"],
            "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited",
        ),
    ],
)
def test_reference_error_cases(files: list[str], expected: str) -> None:
    assert config_error(*files) == expected


def test_config_error_carries_name_and_message() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("empty_key.yaml")
    assert info.value.name == "empty_key.yaml"
    assert info.value.message == "descriptor has empty key"


def test_load_paths_names_errors_by_path() -> None:
    path = str(CONFIGS / "bad_limit_unit.yaml")
    with pytest.raises(ConfigError) as info:
        load_paths([path])
    assert str(info.value) == f"{path}: invalid rate limit unit 'foo'"


# --- empty domain ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "# only a comment\n",
        "domain:\n",
        "domain: ''\ndescriptors:\n",
        "descriptors: []\n",
    ],
)
def test_empty_domain_including_empty_file(text: str) -> None:
    assert error_of(text) == "a.yaml: config file cannot have empty domain"


def test_empty_domain_reported_for_the_file_that_has_it() -> None:
    assert error_of("domain: x\n", "") == "b.yaml: config file cannot have empty domain"


# --- duplicate domains and MERGE_DOMAIN_CONFIG --------------------------------------------------


def test_duplicate_domain_is_named_after_the_later_file() -> None:
    assert error_of("domain: x\n", "domain: y\n", "domain: x\n") == (
        "c.yaml: duplicate domain 'x' in config file"
    )


def test_merge_domain_config_merges_descriptor_trees() -> None:
    ruleset = load_config("merge_domain_key1.yaml", "merge_domain_key2.yaml", merge=True)
    assert list(ruleset.domains) == ["test-domain"]
    assert [r.full_key for r in ruleset.rules()] == [
        "test-domain.key1_value1",
        "test-domain.key2_value2",
    ]


def test_without_merge_the_same_files_are_a_duplicate_domain() -> None:
    assert config_error("merge_domain_key1.yaml", "merge_domain_key2.yaml") == (
        "merge_domain_key2.yaml: duplicate domain 'test-domain' in config file"
    )


def test_merge_keeps_duplicate_key_detection_across_files() -> None:
    # TestDuplicateKeyDomainMerge: the same file twice with merge on.
    assert config_error("merge_domain_key1.yaml", "merge_domain_key1.yaml", merge=True) == (
        "merge_domain_key1.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"
    )


def test_merge_duplicate_is_named_after_the_file_that_repeats_it() -> None:
    first = "domain: d\ndescriptors:\n  - key: a\n  - key: b\n    value: x\n"
    second = "domain: d\ndescriptors:\n  - key: c\n  - key: b\n    value: x\n"
    assert error_of(first, second, merge=True) == (
        "b.yaml: duplicate descriptor composite key 'd.b_x'"
    )


def test_merge_duplicate_top_level_node_is_an_error_even_if_children_differ() -> None:
    first = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: x\n"
    second = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: y\n"
    assert error_of(first, second, merge=True) == "b.yaml: duplicate descriptor composite key 'd.a'"


# --- keys ------------------------------------------------------------------------------------


def test_empty_key_nested() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: ''\n        value: v\n"
    )
    assert error_of(text) == "a.yaml: descriptor has empty key"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        # key-only twice
        ("domain: d\ndescriptors:\n  - key: a\n  - key: a\n", "d.a"),
        # siblings whose children differ are still duplicates
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: v\n    descriptors:\n"
            "      - key: x\n  - key: a\n    value: v\n    descriptors:\n      - key: y\n",
            "d.a_v",
        ),
        # nested: the full dotted path of the duplicate
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: v\n    descriptors:\n"
            "      - key: b\n        descriptors:\n          - key: c\n            value: w\n"
            "          - key: c\n            value: w\n",
            "d.a_v.b.c_w",
        ),
        # `key: a_b` collides with `key: a, value: b` (the composite key is key_value)
        ("domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n", "d.a_b"),
        # an empty value is no value
        ("domain: d\ndescriptors:\n  - key: a\n  - key: a\n    value: ''\n", "d.a"),
        # wildcard patterns are composite keys like any other
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: x*\n  - key: a\n    value: x*\n",
            "d.a_x*",
        ),
    ],
)
def test_duplicate_composite_key(text: str, path: str) -> None:
    assert error_of(text) == f"a.yaml: duplicate descriptor composite key '{path}'"


def test_same_key_value_at_different_levels_is_not_a_duplicate() -> None:
    text = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: a\n"
    assert isinstance(load_text(text), RuleSet)


def test_same_key_in_different_domains_is_not_a_duplicate() -> None:
    text = "domain: {}\ndescriptors:\n  - key: a\n"
    assert len(load_text(text.format("x"), text.format("y"))) == 2


# --- units -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unit", "number"),
    [
        ("second", 1),
        ("minute", 2),
        ("hour", 3),
        ("day", 4),
        ("month", 5),
        ("year", 6),
        ("week", 7),
        ("SECOND", 1),
        ("Minute", 2),
        ("hOuR", 3),
        ("WeeK", 7),
    ],
)
def test_all_seven_units_case_insensitive(unit: str, number: int) -> None:
    (rule,) = load_text(one_rule(f"      unit: {unit}\n      requests_per_unit: 3\n")).rules()
    assert rule.unit == number
    assert rule.unit_name == unit.upper()
    assert rule.requests_per_unit == 3


@pytest.mark.parametrize(
    ("block", "shown"),
    [
        ("      unit: foo\n", "foo"),
        ("      unit: ''\n", ""),
        ("      requests_per_unit: 5\n", ""),  # no unit at all
        ("      unit: unknown\n", "unknown"),  # the enum's 0 value is not a unit
        ("      unit: UNKNOWN\n", "UNKNOWN"),
        ("      unit: seconds\n", "seconds"),
        ("      unit: ' second'\n", " second"),
        ("      unit: 1\n", "1"),  # a scalar decodes into the string field as written
    ],
)
def test_invalid_unit_is_quoted_as_written(block: str, shown: str) -> None:
    assert error_of(one_rule(block)) == f"a.yaml: invalid rate limit unit '{shown}'"


def test_unlimited_with_a_valid_unit_is_an_error() -> None:
    block = "      unlimited: true\n      unit: Minute\n"
    assert error_of(one_rule(block)) == "a.yaml: should not specify rate limit unit when unlimited"


@pytest.mark.parametrize("unit_line", ["", "      unit: ''\n", "      unit: bogus\n"])
def test_unlimited_without_a_valid_unit_loads(unit_line: str) -> None:
    (rule,) = load_text(one_rule("      unlimited: true\n" + unit_line)).rules()
    assert rule.unlimited
    assert rule.unit_name == "UNKNOWN"


def test_unlimited_false_still_needs_a_unit() -> None:
    assert error_of(one_rule("      unlimited: false\n")) == "a.yaml: invalid rate limit unit ''"


def test_requests_per_unit_zero_and_absent_are_valid() -> None:
    text = (
        "domain: d\ndescriptors:\n"
        "  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n"
        "  - key: b\n    rate_limit:\n      unit: second\n"
    )
    assert [r.requests_per_unit for r in load_text(text).rules()] == [0, 0]


def test_requests_per_unit_max_uint32_is_valid() -> None:
    (rule,) = load_text(one_rule("      unit: day\n      requests_per_unit: 4294967295\n")).rules()
    assert rule.requests_per_unit == 4294967295


def test_empty_rate_limit_block_is_no_limit() -> None:
    # `rate_limit:` with no body decodes to a nil pointer: no unit check, no rule.
    ruleset = load_text("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n")
    assert list(ruleset.rules()) == []


# --- replaces, share_threshold ---------------------------------------------------------------


def test_replaces_other_names_is_fine() -> None:
    block = "      unit: second\n      name: mine\n      replaces:\n        - name: other\n"
    (rule,) = load_text(one_rule(block)).rules()
    assert rule.name == "mine"
    assert rule.replaces == ("other",)


def test_replaces_with_empty_string_name() -> None:
    block = "      unit: second\n      replaces:\n        - name: ''\n"
    assert error_of(one_rule(block)) == "a.yaml: should not have an empty replaces entry"


def test_replaces_self_without_a_name_is_just_empty() -> None:
    # rate_limit.name is "", so an empty replaces entry is reported as empty, not as self.
    block = "      unit: second\n      replaces:\n        - name:\n"
    assert error_of(one_rule(block)) == "a.yaml: should not have an empty replaces entry"


@pytest.mark.parametrize(
    ("entry", "final_key"),
    [("key: k\n    value: v", "k_v"), ("key: k", "k"), ("key: k\n    value: ''", "k")],
)
def test_share_threshold_without_wildcard(entry: str, final_key: str) -> None:
    text = f"domain: d\ndescriptors:\n  - {entry}\n    share_threshold: true\n"
    assert error_of(text) == (
        "a.yaml: share_threshold can only be used with wildcard values (containing '*'), "
        f"but found key '{final_key}'"
    )


def test_share_threshold_nested_without_wildcard() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: a\n    value: x*\n    share_threshold: true\n"
        "    descriptors:\n      - key: b\n        value: y\n        share_threshold: true\n"
    )
    assert error_of(text) == (
        "a.yaml: share_threshold can only be used with wildcard values (containing '*'), "
        "but found key 'b_y'"
    )


def test_share_threshold_false_without_wildcard_is_fine() -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: false\n"
    assert isinstance(load_text(text), RuleSet)


def test_share_threshold_with_wildcard_in_key_is_accepted() -> None:
    text = "domain: d\ndescriptors:\n  - key: k*\n    share_threshold: true\n"
    assert isinstance(load_text(text), RuleSet)


# --- which problem wins ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # step A before step B: an unknown key beats an empty domain
        ("descriptors:\n  - key: k\n    bogus: 1\n", "config error, unknown key 'bogus'"),
        # step A.2 in file order
        ("domain: d\nbogus: 1\n7: x\n", "config error, unknown key 'bogus'"),
        ("domain: d\n7: x\nbogus: 1\n", "config error, key is not of type string: 7"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n  - key: j\n    oops: 1\n",
            "error checking config",
        ),
        # step A.2 (key check) before step A.3 (typed unmarshal)
        (
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n    oops: 1\n",
            "config error, unknown key 'oops'",
        ),
        # step B in descriptor order, depth first
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - value: v\n  - key: a\n",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n    descriptors:\n      - value: v\n",
            "duplicate descriptor composite key 'd.a'",
        ),
        # within one descriptor: unit, then replaces, then share_threshold
        (
            "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n    rate_limit:\n"
            "      unit: foo\n      replaces:\n        - name: ''\n",
            "invalid rate limit unit 'foo'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n    rate_limit:\n"
            "      unit: hour\n      replaces:\n        - name: ''\n",
            "should not have an empty replaces entry",
        ),
        # a descriptor's own checks come before its children's
        (
            "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n"
            "    descriptors:\n      - value: v\n",
            "share_threshold can only be used with wildcard values (containing '*'), "
            "but found key 'a'",
        ),
    ],
)
def test_first_problem_in_file_order_is_reported(text: str, expected: str) -> None:
    for _ in range(3):  # deterministic, unlike the reference's Go map order
        assert error_of(text) == f"a.yaml: {expected}"


def test_files_are_validated_in_order() -> None:
    assert error_of("domain: x\ndescriptors:\n  - key: ''\n", "") == (
        "a.yaml: descriptor has empty key"
    )


def test_a_parse_error_in_a_later_file_is_still_reported() -> None:
    assert error_of("domain: x\n", "'''\n") == (
        "b.yaml: error loading config file: yaml: line 2: found unexpected end of stream"
    )


# --- every shipped example config loads ----------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    sorted(
        p.name
        for p in CONFIGS.glob("*.yaml")
        if not p.name.startswith(
            (
                "bad_",
                "duplicate_",
                "empty_",
                "misspelled_",
                "non_",
                "replaces_",
                "unlimited_with",
            )
        )
    ),
)
def test_valid_reference_configs_load(name: str) -> None:
    ruleset = load_config(name)
    assert len(ruleset) == 1
