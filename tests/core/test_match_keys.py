"""Descriptor matching, on both twins: which composite key a request selects, and the stats
key the match is counted under.

Precedence among the entries of one key (exact, then wildcards in config order, then key-only)
without backtracking; underscore collisions and empty values; detailed_metric, value_to_metric
and share_threshold (which request values go into the stats key); the metadata a match keeps;
and the stats names a decision emits, end to end. Expectations come from envoyproxy/ratelimit's
`test/config/config_test.go` (configs in tests/configs) and its `src/config/config_impl.go`;
every matching case runs against the compiled `ratelimitd.config._match` and the pure
`ratelimitd.config._match_py` (the `match` fixture of tests/core/conftest.py).
"""

from __future__ import annotations

import pytest
from support.core import CONFIGS

# --- precedence, no backtracking -------------------------------------------------------------

PRECEDENCE = """
domain: p
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: a*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: j
    value: x*
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: j
    value: xy*
    rate_limit: {unit: second, requests_per_unit: 6}
"""


@pytest.mark.parametrize(
    ("entry", "rpu", "key"),
    [
        (("k", "abc"), 4, "p.k_abc"),  # exact beats an earlier wildcard
        (("k", "abd"), 2, "p.k_ab*"),  # first wildcard in config order
        (("k", "ab"), 2, "p.k_ab*"),
        (("k", "axx"), 3, "p.k_a*"),
        (("k", "zzz"), 1, "p.k"),  # key-only last
        (("k", ""), 1, "p.k"),
        (("j", "xyz"), 5, "p.j_x*"),  # the broader pattern wins because it comes first
    ],
)
def test_precedence_exact_wildcard_key_only(match, entry, rpu: int, key: str) -> None:
    rule, stats_key, _, _ = match(PRECEDENCE)("p", entry)
    assert rule.requests_per_unit == rpu
    assert stats_key == key


NO_BACKTRACK = """
domain: nb
descriptors:
  - key: k
    value: v
    descriptors:
      - key: c
        value: x
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: w*
    descriptors:
      - key: c
        value: x
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: leaf
    value: v
  - key: leaf
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 4}
"""


def test_no_backtracking(match) -> None:
    m = match(NO_BACKTRACK)
    assert m.rule("nb", ("k", "v"), ("c", "x")).requests_per_unit == 1
    assert m.rule("nb", ("k", "w1"), ("c", "x")).requests_per_unit == 2
    assert m.rule("nb", ("k", "other"), ("c", "y")).requests_per_unit == 3
    # the exact / wildcard node is chosen, dead-ends below, and key-only `k` is never retried
    assert m("nb", ("k", "v"), ("c", "y")) is None
    assert m("nb", ("k", "w1"), ("c", "y")) is None
    # an exact leaf without children stops the walk
    assert m("nb", ("leaf", "v"), ("c", "y")) is None
    assert m.rule("nb", ("leaf", "u"), ("c", "y")).requests_per_unit == 4


def test_depth_rule_intermediate_and_shorter_requests(match) -> None:
    m = match("basic_config.yaml")
    # a shorter request matches an intermediate node that has its own limit
    assert m.rule("test-domain", ("key5", "value5")).requests_per_unit == 15
    # a longer request never falls back to an ancestor's limit
    assert m("test-domain", ("key5", "value5"), ("subkey5", "nope")) is None


# --- underscore collision, empty values ------------------------------------------------------

COLLISION = """
domain: u
descriptors:
  - key: key1_local
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: x
    rate_limit: {unit: second, requests_per_unit: 2}
"""


def test_underscore_collision(match) -> None:
    m = match(COLLISION)
    # (key1, local) looks up `key1_local`, which is another entry's key
    rule, stats_key, _, _ = m("u", ("key1", "local"))
    assert rule.requests_per_unit == 7
    assert stats_key == "u.key1_local"
    assert m.rule("u", ("key1_local", "anything")).requests_per_unit == 7
    # and the other way round: (a_x, "") misses `a_x_`, then its key-only probe `a_x` finds
    # the entry (a, x)
    rule, stats_key, _, _ = m("u", ("a_x", ""))
    assert rule.requests_per_unit == 2
    assert stats_key == "u.a_x"
    assert m("u", ("a_x", "y")) is not None


def test_exact_hit_with_empty_value_takes_the_value_to_metric_key(match) -> None:
    # GetLimit's value_to_metric pass writes an exact match as `k` plus `_v` only when the
    # request value is non-empty, so (k, "") hitting a config key `k_` yields `c.k`: that
    # differs from the config path `c.k_`, so the limit is re-created and loses metadata.
    m = match(
        "domain: c\ndescriptors:\n  - key: k_\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: {a: 1}\n"
    )
    assert m("c", ("k", ""))[1:] == ("c.k", None, False)


def test_empty_request_value(match) -> None:
    m = match(COLLISION)
    rule, stats_key, _, _ = m("u", ("a", ""))
    assert rule.requests_per_unit == 1
    assert stats_key == "u.a"


def test_empty_value_is_matched_by_a_bare_star(match) -> None:
    m = match(
        "domain: s\ndescriptors:\n"
        "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
        "  - key: k\n    value: '*'\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
    )
    # `k_` matches the pattern `k_*` before the key-only default is tried
    assert m.key("s", ("k", "")) == "s.k_*"
    assert m.key("s", ("k", "anything")) == "s.k_*"


# --- detailed_metric ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "entries", "rpu", "key"),
    [
        (
            "detailed_metric_nested_both.yaml",
            [("key-1", "value-1"), ("key-2", "value-2")],
            5,
            "nested.key-1_value-1.key-2_value-2",
        ),
        ("detailed_metric_nested_both.yaml", [("key-1", "value-1")], 100, "nested.key-1_value-1"),
        ("detailed_metric_nested_top.yaml", [("key-1", "value-1")], 100, "nested.key-1_value-1"),
        (
            "detailed_metric_nested_top.yaml",
            [("key-1", "value-1"), ("key-2", "value-2")],
            5,
            "nested.key-1.key-2",
        ),
        ("detailed_metric_nested_none.yaml", [("key-1", "value-1")], 100, "nested.key-1"),
        (
            "detailed_metric_nested_none.yaml",
            [("key-1", "value-1"), ("key-2", "value-2")],
            5,
            "nested.key-1.key-2",
        ),
        (
            "detailed_metric_realistic.yaml",
            [("key_1", "some-value-for-key-1")],
            500,
            "nested.key_1_some-value-for-key-1",
        ),
        ("detailed_metric_realistic.yaml", [("key_1", "other")], 500, "nested.key_1_other"),
        (
            "detailed_metric_realistic.yaml",
            [("key_2", "key-2-value")],
            5000,
            "nested.key_2_key-2-value",
        ),
        (
            "detailed_metric_realistic.yaml",
            [("key_2", "specific-id")],
            50000,
            "nested.key_2_specific-id",
        ),
        (
            "detailed_metric_realistic.yaml",
            [("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
            5,
            "nested.key_2_key-2-value.key_3_requested-key3-value",
        ),
        (
            "detailed_metric_realistic.yaml",
            [("key_2", "specific-id"), ("key_3", "requested-key3-value")],
            100,
            "nested.key_2_specific-id.key_3_requested-key3-value",
        ),
    ],
)
def test_detailed_metric_keys(match, config: str, entries, rpu: int, key: str) -> None:
    rule, stats_key, share, _ = match(config)("nested", *entries)
    assert rule.requests_per_unit == rpu
    assert stats_key == key
    assert share is None


def test_detailed_metric_realistic_no_limit(match) -> None:
    m = match("detailed_metric_realistic.yaml")
    # key_3 (key-only) has detailed_metric but no rate_limit: nothing to apply
    assert m("nested", ("key_2", "x"), ("key_3", "other")) is None
    assert m("nested", ("key_2", "specific-id"), ("key_3", "other")) is None


def test_detailed_metric_is_the_leaf_limits_flag(match) -> None:
    # detailed_metric on a node without a rate_limit does not change a child's key
    m = match(
        "domain: dm\ndescriptors:\n  - key: a\n    detailed_metric: true\n    descriptors:\n"
        "      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    assert m.key("dm", ("a", "1"), ("b", "2")) == "dm.a.b"


# --- value_to_metric ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "domain", "entries", "rpu", "key"),
    [
        (
            "vtm_route_method_subject.yaml",
            "domain",
            [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
            60,
            "domain.route_draw.http_method_GET.subject_id",
        ),
        (
            "vtm_route_method_subject.yaml",
            "domain",
            [("route", ""), ("http_method", "GET"), ("subject_id", "123")],
            60,
            "domain.route.http_method_GET.subject_id",
        ),
        (
            "vtm_with_detailed.yaml",
            "domain",
            [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
            60,
            "domain.route_draw.http_method_GET.subject_id_123",
        ),
        (
            "vtm_configured_values.yaml",
            "test-domain",
            [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
            60,
            "test-domain.route_draw.http_method_GET.subject_id",
        ),
        (
            "vtm_configured_values.yaml",
            "test-domain",
            [("route", "draw"), ("http_method", "POST"), ("subject_id", "123")],
            30,
            "test-domain.route_draw.http_method_POST.subject_id",
        ),
        ("vtm_default_key.yaml", "d", [("k1", "X"), ("k2", "Y")], 1, "d.k1_X.k2"),
        ("vtm_mid_level.yaml", "d", [("k1", "X"), ("k2", "Y"), ("k3", "Z")], 1, "d.k1.k2_Y.k3"),
        ("vtm_no_flag.yaml", "d", [("k1", "X"), ("k2", "Y")], 1, "d.k1.k2"),
        (
            "vtm_wildcard.yaml",
            "domain",
            [("user", "alice"), ("action", "readfile"), ("resource", "doc")],
            100,
            "domain.user_alice.action_readfile.resource",
        ),
        (
            "vtm_fullkey_plain.yaml",
            "test-domain-2",
            [("route", "r"), ("http_method", "GET"), ("subject_id", "1")],
            60,
            "test-domain-2.route.http_method.subject_id",
        ),
        (
            "vtm_fullkey_detailed.yaml",
            "test-domain-3",
            [("route", "r"), ("http_method", "GET"), ("subject_id", "1")],
            60,
            "test-domain-3.route_r.http_method_GET.subject_id_1",
        ),
    ],
)
def test_value_to_metric_keys(match, config: str, domain: str, entries, rpu: int, key: str) -> None:
    rule, stats_key, share, _ = match(config)(domain, *entries)
    assert rule.requests_per_unit == rpu
    assert stats_key == key
    assert share is None


def test_value_to_metric_does_not_change_the_rules_config_path(match) -> None:
    m = match("vtm_route_method_subject.yaml")
    rule = m.rule("domain", ("route", "draw"), ("http_method", "GET"), ("subject_id", "1"))
    assert rule.full_key == "domain.route.http_method.subject_id"


def test_value_to_metric_wildcard_non_matching_value(match) -> None:
    m = match("vtm_wildcard.yaml")
    assert m("domain", ("user", "alice"), ("action", "write"), ("resource", "doc")) is None


# --- share_threshold ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "rpu", "key", "share"),
    [
        ([("files", "files/a.pdf")], 100, "files_files/*", ("files/*",)),
        ([("files", "files/")], 100, "files_files/*", ("files/*",)),
        (
            [("nested", "parent"), ("files", "nested/x")],
            200,
            "nested_parent.files_nested/*",
            ("", "nested/*"),
        ),
        (
            [("files", "top/a"), ("files", "nested/b")],
            300,
            "files_top/*.files_nested/*",
            ("top/*", "nested/*"),
        ),
        # share_threshold beats value_to_metric (the README's `route_api.method_GET` is wrong)
        ([("route", "api/v1"), ("method", "GET")], 60, "route_api/*.method", ("api/*", "")),
        # share_threshold beats detailed_metric for its own entry
        (
            [("service", "svc/a"), ("endpoint", "get")],
            80,
            "service_svc/*.endpoint_get",
            ("svc/*", ""),
        ),
        (
            [("path", "path/a"), ("file", "file/b"), ("type", "pdf")],
            120,
            "path_path/*.file_file/*.type",
            ("path/*", "", ""),
        ),
        (
            [("user", "user/1"), ("resource", "res/2"), ("action", "read")],
            150,
            "user_user/*.resource_res/*.action",
            ("user/*", "res/*", ""),
        ),
        ([("file", "test1")], 50, "file_test1", None),  # exact beats the shared wildcard
        ([("file", "test2")], 100, "file_test*", ("test*",)),
        ([("midpath", "/api/users/v1")], 100, "midpath_/api*v1", ("/api*v1",)),
        ([("multiroute", "svcAepBrpc")], 50, "multiroute_svc*ep*rpc", ("svc*ep*rpc",)),
        ([("midroute", "/api/x/v2")], 80, "midroute_/api*v2", ("/api*v2",)),
        (
            [("tenant", "t1prod"), ("resource", "res9v2")],
            60,
            "tenant_t*prod.resource_res*v2",
            ("t*prod", "res*v2"),
        ),
    ],
)
def test_share_threshold(match, entries, rpu: int, key: str, share) -> None:
    rule, stats_key, got_share, _ = match("share_threshold.yaml")("test-domain", *entries)
    assert rule.requests_per_unit == rpu
    assert stats_key == f"test-domain.{key}"
    assert got_share == share


def test_share_threshold_values_share_one_rule(match) -> None:
    m = match("share_threshold.yaml")
    a = m("test-domain", ("files", "files/a"))
    b = m("test-domain", ("files", "files/b"))
    assert a[0] is b[0]
    assert a[1:3] == b[1:3]


def test_share_threshold_non_matching(match) -> None:
    m = match("share_threshold.yaml")
    assert m("test-domain", ("files", "other/a")) is None
    assert m("test-domain", ("midpath", "/api/users/v2")) is None
    assert m("test-domain", ("tenant", "t1prod"), ("resource", "res9v3")) is None


def test_integration_share_threshold(match) -> None:
    m = match("integration_share_threshold.yaml")
    d = "share-threshold-test"
    _, key, share, _ = m(d, ("files", "files/a.txt"))
    assert (key, share) == (f"{d}.files_files/*", ("files/*",))
    _, key, share, _ = m(d, ("files_no_share", "files_no_share/a.txt"))
    assert (key, share) == (f"{d}.files_no_share_files_no_share/*", None)


# --- metadata ------------------------------------------------------------------------------------


def test_metadata_is_carried_by_the_matched_rule(match) -> None:
    m = match("metadata.yaml")
    rule, _, _, keep = m("test-domain", ("key1", "value1"), ("subkey1", "x"))
    assert rule.metadata == {"name": "service_1"}
    assert keep
    rule, _, _, keep = m("test-domain", ("key2", "x"))
    assert rule.metadata == {"service_with_quota": {"name": "service_2"}}
    assert keep
    rule, _, _, keep = m("test-domain", ("key1", "value1"), ("subkey1", "subvalue1"))
    assert rule.metadata is None


METADATA_QUIRK = """
domain: md
descriptors:
  - key: leaf
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: {m: 1}
  - key: parent
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 2}
    metadata: {m: 2}
    descriptors:
      - key: child
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 3}
        metadata: {m: 3}
  - key: plain
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 4}
    metadata: {m: 4}
  - key: wild
    value: x*
    rate_limit: {unit: second, requests_per_unit: 5}
    metadata: {m: 5}
"""


@pytest.mark.parametrize(
    ("entries", "keep", "key"),
    [
        ([("leaf", "v")], False, "md.leaf_v"),  # detailed leaf without children: re-created
        ([("parent", "v")], True, "md.parent_v"),  # detailed with children: kept
        ([("route", "r"), ("method", "GET")], False, "md.route_r.method"),  # vtm key differs
        ([("route", ""), ("method", "GET")], True, "md.route.method"),  # vtm key == path
        ([("plain", "v")], False, "md.plain_v"),
        ([("plain", "")], True, "md.plain"),
        ([("wild", "x1")], True, "md.wild_x*"),
    ],
)
def test_metadata_quirk(match, entries, keep: bool, key: str) -> None:
    rule, stats_key, _, got_keep = match(METADATA_QUIRK)("md", *entries)
    assert stats_key == key
    assert got_keep is keep
    assert rule.metadata is not None  # the rule keeps it; the service decides what to send


# --- end to end: the emitted stats names --------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "domain", "entries", "stat"),
    [
        ("basic_config.yaml", "test-domain", [("key2", "x")], "test-domain.key2"),
        (
            "basic_config.yaml",
            "test-domain",
            [("key7", "unspecified_value")],
            "test-domain.key7_unspecified_value",
        ),
        (
            "share_threshold.yaml",
            "test-domain",
            [("files", "files/a")],
            "test-domain.files_files/*",
        ),
        (
            "vtm_route_method_subject.yaml",
            "domain",
            [("route", "draw"), ("http_method", "GET"), ("subject_id", "1")],
            "domain.route_draw.http_method_GET.subject_id",
        ),
        # SanitizeStatName: the dots of an IPv4-looking substring become `_`
        (
            "readme_example3_blacklist.yaml",
            "edge_proxy_per_ip",
            [("remote_address", "50.0.0.5")],
            "edge_proxy_per_ip.remote_address_50_0_0_5",
        ),
    ],
)
async def test_stats_key_end_to_end(harness, config, domain, entries, stat) -> None:
    h = harness(CONFIGS / config)
    await h.decide(domain, entries)
    assert h.stat(f"ratelimit.service.rate_limit.{stat}.total_hits") == 1


async def test_unknown_domain_end_to_end(harness) -> None:
    h = harness(CONFIGS / "basic_config.yaml")
    await h.decide("foo_domain", [("key2", "x")])
    assert h.stat("ratelimit.service.rate_limit.foo_domain.domain_not_found") == 1
