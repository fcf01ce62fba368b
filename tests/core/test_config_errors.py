"""Config loading and validation: the reference's exact error texts (reference doc section 3).

Expectations come from envoyproxy/ratelimit's `test/config/config_test.go` (the `expectConfigPanic`
cases) and `ratelimit-reference.md` section 3.2. Every error is `<config name>: <message>`.
"""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core import CONFIGS
from support.daemon import run_check_config

from ratelimitd.config import ConfigError, ConfigFile, RuleSet, load_paths, load_ruleset
from ratelimitd.config.yamlfile import VALID_KEYS


def load_text(*texts: str, merge: bool = False) -> RuleSet:
    """Load YAML texts named a.yaml, b.yaml, ... in order."""
    files = [ConfigFile(f"{chr(ord('a') + i)}.yaml", t) for i, t in enumerate(texts)]
    return load_ruleset(files, merge_domains=merge)


def error_of(*texts: str, merge: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(*texts, merge=merge)
    return str(info.value)


def load_config(*names: str, merge: bool = False) -> RuleSet:
    """Load files from tests/configs, named by their bare file name (as the Go tests do)."""
    files = [ConfigFile(n, (CONFIGS / n).read_text()) for n in names]
    return load_ruleset(files, merge_domains=merge)


def config_error(*names: str, merge: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*names, merge=merge)
    return str(info.value)


def one_rule(unit_block: str) -> str:
    return f"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{unit_block}"


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


# --- yaml.v2 typed-unmarshal errors ----------------------------------------------------------

UNMARSHAL = "a.yaml: error loading config file: yaml: unmarshal errors:\n  "


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ("-1", "line 6: cannot unmarshal !!int `-1` into uint32"),
        ("4294967296", "line 6: cannot unmarshal !!int `4294967296` into uint32"),
        ("42949672960", "line 6: cannot unmarshal !!int `4294967...` into uint32"),
        ("abc", "line 6: cannot unmarshal !!str `abc` into uint32"),
        ("'5'", "line 6: cannot unmarshal !!str `5` into uint32"),
        ("true", "line 6: cannot unmarshal !!bool `true` into uint32"),
        ("{}", "line 6: cannot unmarshal !!map into uint32"),
        ("[]", "line 6: cannot unmarshal !!seq into uint32"),
    ],
)
def test_requests_per_unit_type_errors(value: str, detail: str) -> None:
    text = (
        "domain: d\n"
        "descriptors:\n"
        "  - key: k\n"
        "    rate_limit:\n"
        "      unit: second\n"
        f"      requests_per_unit: {value}\n"
    )
    assert error_of(text) == UNMARSHAL + detail


def test_bool_field_type_error() -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n"
    assert error_of(text) == UNMARSHAL + "line 4: cannot unmarshal !!str `maybe` into bool"


def test_several_unmarshal_errors_are_listed_in_document_order() -> None:
    text = (
        "domain: d\n"
        "descriptors:\n"
        "  - key: k\n"
        "    shadow_mode: maybe\n"
        "    rate_limit:\n"
        "      unit: second\n"
        "      requests_per_unit: -3\n"
    )
    assert error_of(text) == UNMARSHAL + (
        "line 4: cannot unmarshal !!str `maybe` into bool\n"
        "  line 7: cannot unmarshal !!int `-3` into uint32"
    )


# --- validateYamlKeys (step A.2) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("0.25", "0.25"),
        ("1", "1"),
        ("-7", "-7"),
        ("true", "true"),
        ("false", "false"),
        ("~", "<nil>"),
    ],
)
def test_non_string_key(key: str, shown: str) -> None:
    text = f"domain: d\ndescriptors:\n  - key: k\n    {key}: x\n"
    assert error_of(text) == f"a.yaml: config error, key is not of type string: {shown}"


def test_quoted_numeric_key_is_a_string_and_then_unknown() -> None:
    assert error_of("'1': x\ndomain: d\n") == "a.yaml: config error, unknown key '1'"


@pytest.mark.parametrize("key", ["Domain", "descriptor", "rate-limit", "requestsPerUnit", "limit"])
def test_unknown_key(key: str) -> None:
    assert error_of(f"domain: d\n{key}: x\n") == f"a.yaml: config error, unknown key '{key}'"


def test_unknown_key_nested_deep() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n"
        "        rate_limit:\n          unit: second\n          burst: 3\n"
    )
    assert error_of(text) == "a.yaml: config error, unknown key 'burst'"


@pytest.mark.parametrize(
    "text",
    [
        # `name:` at top level, `unit:` at descriptor level, `key:` inside rate_limit: all accepted
        "domain: d\nname: ignored\ndescriptors:\n  - key: k\n",
        "domain: d\ndescriptors:\n  - key: k\n    unit: hour\n    requests_per_unit: 3\n",
        "domain: d\nshadow_mode: true\ndescriptors:\n  - key: k\n    rate_limit:\n"
        "      unit: second\n      key: x\n      metadata: {}\n",
    ],
)
def test_whitelist_is_flat_and_position_independent(text: str) -> None:
    ruleset = load_text(text)
    assert list(ruleset.domains) == ["d"]


def test_misplaced_unit_does_not_create_a_limit() -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    unit: hour\n    requests_per_unit: 3\n"
    assert list(load_text(text).rules()) == []


def test_metadata_contents_are_not_key_checked() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
        "    metadata:\n      anything: 1.5\n      nested:\n        whatever: [1, x]\n"
    )
    (rule,) = load_text(text).rules()
    assert rule.metadata == {"anything": 1.5, "nested": {"whatever": [1, "x"]}}


@pytest.mark.parametrize(
    ("items", "shown"),
    [("[a, b]", "a"), ("[1]", "1"), ("[1.5]", "1.5"), ("[[x]]", "[x]"), ("[true]", "true")],
)
def test_list_of_non_maps(items: str, shown: str) -> None:
    text = f"domain: d\ndescriptors: {items}\n"
    assert error_of(text) == (
        f"a.yaml: config error, yaml file contains list of type other than map: {shown}"
    )


def test_list_of_non_maps_in_replaces() -> None:
    text = one_rule("      unit: second\n      replaces:\n        - other\n")
    assert error_of(text) == (
        "a.yaml: config error, yaml file contains list of type other than map: other"
    )


@pytest.mark.parametrize(
    "leaf",
    [
        "requests_per_unit: 1.5",
        "value: 2.0",
        "key: .inf",
        "value: -.5",
        "shadow_mode: 1e3",
        "value: 1.5e3",
    ],
)
def test_float_leaf_is_error_checking_config(leaf: str) -> None:
    text = f"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n  - {leaf}\n"
    assert error_of(text) == "a.yaml: error checking config"


def test_int_bool_and_null_leaves_are_fine_for_the_key_check() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: 7\n    value: 8\n    shadow_mode: true\n"
        "    quota_mode: ~\n"
    )
    ruleset = load_text(text)
    assert "7_8" in ruleset.domains["d"].children


# --- scalar resolution: yaml.v2 (Go) is not PyYAML's YAML 1.1 -----------------------------------


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("yes", True),
        ("On", True),
        ("TRUE", True),
        ("No", False),
        ("off", False),
        ("y", True),
        ("Y", True),
        ("n", False),
    ],
)
def test_yaml_v2_bool_words(word: str, expected: bool) -> None:
    text = f"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: {word}\n"
    text += "    rate_limit:\n      unit: second\n"
    (rule,) = load_text(text).rules()
    assert rule.shadow_mode is expected


def test_y_key_is_a_bool_key() -> None:
    assert error_of("domain: d\ny: x\n") == "a.yaml: config error, key is not of type string: true"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("017", 15),  # Go's ParseInt(s, 0, 64): a leading 0 is octal
        ("0x1F", 31),
        ("0b101", 5),
        ("1_000", 1000),  # yaml.v2 drops underscores before parsing
        ("+5", 5),
        ("0o17", 15),
    ],
)
def test_yaml_v2_integer_forms(value: str, expected: int) -> None:
    (rule,) = load_text(one_rule(f"      unit: second\n      requests_per_unit: {value}\n")).rules()
    assert rule.requests_per_unit == expected


def test_sexagesimal_is_a_string_in_yaml_v2() -> None:
    assert error_of(one_rule("      unit: second\n      requests_per_unit: 1:30\n")) == (
        UNMARSHAL + "line 6: cannot unmarshal !!str `1:30` into uint32"
    )


# --- YAML syntax -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("'''\n", "yaml: line 2: found unexpected end of stream"),
        # yaml.v2 prints no line number for a problem on the first line (its mark line is 0)
        ("domain: a: b\n", "yaml: mapping values are not allowed in this context"),
        ("domain: d\nkey: a: b\n", "yaml: line 2: mapping values are not allowed in this context"),
    ],
)
def test_yaml_syntax_errors(text: str, detail: str) -> None:
    assert error_of(text) == f"a.yaml: error loading config file: {detail}"


@pytest.mark.parametrize("text", ["\x1f", "domain: d\x00\n", "domain: \x7f\n"])
def test_control_characters_are_a_yaml_error(text: str) -> None:
    # yaml.v2 readerc.go: "control characters are not allowed" (reader errors carry no line).
    assert error_of(text) == (
        "a.yaml: error loading config file: yaml: control characters are not allowed"
    )


def test_top_level_not_a_map() -> None:
    assert error_of("- a\n- b\n") == (
        UNMARSHAL + "line 1: cannot unmarshal !!seq into map[interface {}]interface {}"
    )


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


# --- never crash ---------------------------------------------------------------------------------

# Every key the parser knows: the reference's whitelist and this project's extensions.
_FIELDS = sorted(VALID_KEYS)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True),
    st.sampled_from(["second", "MINUTE", "day", "", "*", "a*b", "foo", "x_y"]),
    st.text(string.ascii_letters + "*_ -", max_size=6),
)
_keys = st.one_of(st.sampled_from(_FIELDS), st.sampled_from([1, 0.5, True]), st.text(max_size=4))
_documents = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=15,
)


def _load_or_error(text: str) -> None:
    try:
        ruleset = load_text(text)
    except ConfigError as exc:
        assert str(exc).startswith("a.yaml: ")
    else:
        assert isinstance(ruleset, RuleSet)
        ruleset.dump()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # Control characters are pinned by test_control_characters_are_a_yaml_error.
    st.text(
        st.one_of(
            st.characters(blacklist_categories=("Cc", "Cs", "Cn", "Co")),
            st.sampled_from("\t\n\r:-[]{}*'\"#&!|>%@`,?"),
        ),
        max_size=80,
    )
)
def test_random_text_never_crashes(text: str) -> None:
    _load_or_error(text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_keys, _documents, max_size=4))
def test_random_yaml_structures_never_crash(doc: dict[object, object]) -> None:
    _load_or_error(yaml.safe_dump(doc, sort_keys=False))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.fixed_dictionaries(
            {"key": st.sampled_from(["a", "b", "", "a_b"])},
            optional={
                "value": st.sampled_from(["", "b", "x*", "*"]),
                "share_threshold": st.booleans(),
                "value_to_metric": st.booleans(),
                "rate_limit": st.fixed_dictionaries(
                    {"unit": st.sampled_from(["second", "bogus", ""])},
                    optional={"unlimited": st.booleans(), "requests_per_unit": st.integers(-1, 9)},
                ),
            },
        ),
        max_size=4,
    )
)
def test_random_descriptor_lists_never_crash(descriptors: list[dict[str, object]]) -> None:
    _load_or_error(yaml.safe_dump({"domain": "d", "descriptors": descriptors}, sort_keys=False))


# --- the check-config CLI ------------------------------------------------------------------------


def test_cli_valid_config() -> None:
    result = run_check_config(str(CONFIGS / "basic_config.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "all rate limit configs ok: 1 files, 1 domains, 10 rules" in result.stdout


def test_cli_invalid_config_prints_exactly_the_error() -> None:
    path = str(CONFIGS / "misspelled_key2.yaml")
    result = run_check_config(path)
    assert result.returncode == 1
    assert result.stderr == f"{path}: config error, unknown key 'requestsperunit'\n"


def test_cli_missing_file_is_named() -> None:
    path = Path(__file__).parent / "_never_written.yaml"
    result = run_check_config(str(CONFIGS / "basic_config.yaml"), str(path))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}: ")


def test_cli_directory(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("domain: a\ndescriptors:\n  - key: k\n")
    (tmp_path / "two.conf").write_text(
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n"
    )
    result = run_check_config(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "all rate limit configs ok: 2 files, 2 domains, 1 rules" in result.stdout


def test_cli_directory_with_an_invalid_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("domain: a\n")
    (tmp_path / "b.yaml").write_text("domain: b\ndescriptors:\n  - key: ''\n")
    result = run_check_config(str(tmp_path))
    assert result.returncode == 1
    assert result.stderr == f"{tmp_path / 'b.yaml'}: descriptor has empty key\n"


def test_cli_merge(tmp_path: Path) -> None:
    first = CONFIGS / "merge_domain_key1.yaml"
    second = CONFIGS / "merge_domain_key2.yaml"
    plain = run_check_config(str(first), str(second))
    assert plain.returncode == 1
    assert plain.stderr == f"{second}: duplicate domain 'test-domain' in config file\n"
    merged = run_check_config("--merge-domain-config", str(first), str(second))
    assert merged.returncode == 0, merged.stderr
    assert "1 domains, 2 rules" in merged.stdout


def test_cli_yaml_unmarshal_error_is_multiline(tmp_path: Path) -> None:
    path = tmp_path / "neg.yaml"
    path.write_text(one_rule("      unit: second\n      requests_per_unit: -1\n"))
    result = run_check_config(str(path))
    assert result.returncode == 1
    assert result.stderr == (
        f"{path}: error loading config file: yaml: unmarshal errors:\n"
        "  line 6: cannot unmarshal !!int `-1` into uint32\n"
    )
