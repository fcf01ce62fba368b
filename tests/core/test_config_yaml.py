"""Config loading: decoding the YAML as the reference's yaml.v2 does, with its exact error texts
(yaml.v2's two passes in the reference's `src/config/config_impl.go`).

yaml.v2's typed-unmarshal errors; validateYamlKeys (step A.2: the key whitelist, non-string
keys, lists of non-maps, float leaves); yaml.v2's scalar resolution, which is not PyYAML's
YAML 1.1; YAML syntax errors; then random texts, YAML structures and descriptor lists, which
must load or raise a ConfigError, never crash. Every error is `<config name>: <message>`.
"""

from __future__ import annotations

import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.core import error_of, load_text, one_rule

from ratelimitd.config import ConfigError, RuleSet
from ratelimitd.config.yamlfile import VALID_KEYS

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
