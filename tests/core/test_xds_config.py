"""xDS RateLimitConfig resources load through the YAML path: same rules, same error texts."""

from __future__ import annotations

import pytest
from google.protobuf import any_pb2
from support.ads_server import Unit, rl_config, rl_descriptor

from ratelimitd._proto import rls_conf_pb2
from ratelimitd.config import ConfigError, ConfigFile, RuleSet, build_ruleset, load_ruleset, xds
from ratelimitd.config.xds_client import backoff_delay, linear_jitter


def packed(*configs: rls_conf_pb2.RateLimitConfig) -> list[any_pb2.Any]:
    out = []
    for config in configs:
        a = any_pb2.Any()
        a.Pack(config)
        out.append(a)
    return out


def load_xds(*configs: rls_conf_pb2.RateLimitConfig, merge: bool = False) -> RuleSet:
    return build_ruleset(xds.sources(packed(*configs)), merge_domains=merge)


def load_yaml(*files: tuple[str, str], merge: bool = False) -> RuleSet:
    return load_ruleset([ConfigFile(n, t) for n, t in files], merge_domains=merge)


def test_the_references_deeper_config_dumps_as_its_test_expects() -> None:
    # The reference's testDeeperLimitsXdsConfigUpdate.
    foo = rl_config(
        "foo",
        "foo",
        rl_descriptor(
            "k1",
            "v1",
            unit=Unit.MINUTE,
            requests_per_unit=10,
            children=[
                rl_descriptor("k2", unlimited=True),
                rl_descriptor("k2", "v2", unit=Unit.HOUR, requests_per_unit=15),
            ],
        ),
        rl_descriptor(
            "j1",
            "v2",
            unlimited=True,
            children=[
                rl_descriptor("j2", unlimited=True),
                rl_descriptor(
                    "j2",
                    "v2",
                    unit=Unit.DAY,
                    requests_per_unit=15,
                    shadow_mode=True,
                    quota_mode=True,
                ),
            ],
        ),
    )
    bar = rl_config(
        "bar", "bar", rl_descriptor("k1", "v1", unit=Unit.MINUTE, requests_per_unit=100)
    )
    tail = ", shadow_mode: false, quota_mode: false"
    assert sorted(load_xds(foo, bar).dump().splitlines()) == sorted(
        [
            "foo.k1_v1: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false",
            "foo.k1_v1.k2: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
            "foo.k1_v1.k2_v2: unit=HOUR requests_per_unit=15" + tail,
            "foo.j1_v2: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
            "foo.j1_v2.j2: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
            "foo.j1_v2.j2_v2: unit=DAY requests_per_unit=15, shadow_mode: true, quota_mode: true",
            "bar.k1_v1: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false",
        ]
    )


def test_every_field_becomes_the_rule_its_yaml_twin_gives() -> None:
    config = rl_config(
        "full",
        "d",
        rl_descriptor(
            "k",
            "v",
            unit=Unit.WEEK,
            requests_per_unit=7,
            detailed_metric=True,
            shadow_mode=True,
            quota_mode=True,
            metadata={
                "team": "a",
                "n": 5,
                "ratio": 0.5,
                "tags": ["x", True],
                "nested": {"z": None},
            },
        ),
        rl_descriptor("other", unit=Unit.YEAR, requests_per_unit=1),
    )
    config.descriptors[0].rate_limit.name = "first"
    config.descriptors[1].rate_limit.name = "second"
    config.descriptors[1].rate_limit.replaces.add(name="first")
    yaml_text = """
domain: d
descriptors:
  - key: k
    value: v
    detailed_metric: true
    shadow_mode: true
    quota_mode: true
    metadata: {team: a, n: 5, ratio: 0.5, tags: [x, true], nested: {z: null}}
    rate_limit: {unit: week, requests_per_unit: 7, name: first}
  - key: other
    rate_limit: {unit: year, requests_per_unit: 1, name: second, replaces: [{name: first}]}
"""
    got, want = list(load_xds(config).rules()), list(load_yaml(("full", yaml_text)).rules())
    fields = ["full_key", "requests_per_unit", "unit", "name", "replaces", "unlimited"]
    fields += ["shadow_mode", "quota_mode", "detailed_metric", "metadata"]
    assert [[getattr(r, f) for f in fields] for r in got] == [
        [getattr(r, f) for f in fields] for r in want
    ]


def _policy(**fields: object) -> rls_conf_pb2.RateLimitPolicy:
    replaces = fields.pop("replaces", ())
    policy = rls_conf_pb2.RateLimitPolicy(**fields)  # type: ignore[arg-type]
    for name in replaces:  # type: ignore[attr-defined]
        policy.replaces.add(name=name)
    return policy


def _one(
    policy: rls_conf_pb2.RateLimitPolicy | None, key: str = "k"
) -> rls_conf_pb2.RateLimitConfig:
    d = rls_conf_pb2.RateLimitDescriptor(key=key)
    if policy is not None:
        d.rate_limit.CopyFrom(policy)
    return rl_config("res", "d", d)


# (resource, the YAML file with the same content): both must be refused with one message.
REJECTED = {
    "empty domain": (rl_config("res", ""), "domain: ''\n"),
    "empty key": (_one(None, key=""), "domain: d\ndescriptors: [{key: ''}]\n"),
    "duplicate key": (
        rl_config("res", "d", rl_descriptor("k", "v"), rl_descriptor("k", "v")),
        "domain: d\ndescriptors: [{key: k, value: v}, {key: k, value: v}]\n",
    ),
    "no unit": (
        _one(_policy(requests_per_unit=3)),
        "domain: d\ndescriptors: [{key: k, rate_limit: {unit: UNKNOWN, requests_per_unit: 3}}]\n",
    ),
    "unknown unit number": (
        _one(_policy(unit=99, requests_per_unit=3)),
        "domain: d\ndescriptors: [{key: k, rate_limit: {unit: '99', requests_per_unit: 3}}]\n",
    ),
    "unit when unlimited": (
        _one(_policy(unit=Unit.MINUTE, unlimited=True)),
        "domain: d\ndescriptors: [{key: k, rate_limit: {unit: minute, unlimited: true}}]\n",
    ),
    "empty replaces": (
        _one(_policy(unit=Unit.MINUTE, replaces=[""])),
        "domain: d\ndescriptors: [{key: k, rate_limit: {unit: minute, replaces: [{name: ''}]}}]\n",
    ),
    "replaces itself": (
        _one(_policy(unit=Unit.MINUTE, name="me", replaces=["me"])),
        "domain: d\ndescriptors:\n"
        "  - {key: k, rate_limit: {unit: minute, name: me, replaces: [{name: me}]}}\n",
    ),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_a_bad_resource_gets_the_file_providers_message(case: str) -> None:
    resource, yaml_text = REJECTED[case]
    with pytest.raises(ConfigError) as from_file:
        load_yaml(("res", yaml_text))
    with pytest.raises(ConfigError) as from_xds:
        load_xds(resource)
    assert str(from_xds.value) == str(from_file.value)
    assert str(from_xds.value).startswith("res: ")


def test_one_domain_in_two_resources_needs_merge_domain_config() -> None:
    a = rl_config("foo-1", "foo", rl_descriptor("k1", "v1", unit=Unit.MINUTE, requests_per_unit=10))
    b = rl_config(
        "foo-2", "foo", rl_descriptor("k1", "v2", unit=Unit.MINUTE, requests_per_unit=100)
    )
    with pytest.raises(ConfigError, match=r"^foo-2: duplicate domain 'foo' in config file$"):
        load_xds(a, b)
    assert load_xds(a, b, merge=True).dump().splitlines() == [
        "foo.k1_v1: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false",
        "foo.k1_v2: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false",
    ]
    again = rl_config("foo-3", "foo", rl_descriptor("k1", "v1", unit=Unit.HOUR))
    with pytest.raises(
        ConfigError, match=r"^foo-3: duplicate descriptor composite key 'foo.k1_v1'$"
    ):
        load_xds(a, again, merge=True)


def test_a_resource_of_another_type_is_refused_with_gos_unmarshal_message() -> None:
    other = any_pb2.Any(type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster", value=b"")
    with pytest.raises(xds.ResourceError) as err:
        xds.sources([other])
    assert str(err.value) == (
        'proto: mismatched message type: got "ratelimit.config.ratelimit.v3.RateLimitConfig", '
        'want "envoy.config.cluster.v3.Cluster"'
    )
    garbage = any_pb2.Any(type_url=xds.TYPE_URL, value=b"\x0a\xff")
    with pytest.raises(xds.ResourceError, match=r"^proto: cannot parse invalid wire-format data$"):
        xds.sources([garbage])


def test_no_resources_is_an_empty_config() -> None:
    assert len(load_xds()) == 0


def test_reconnect_backoff_is_jpillora_backoff() -> None:
    # Factor 0.5 (the default XDS_CLIENT_BACKOFF_RANDOM_FACTOR) never grows past the minimum.
    assert {backoff_delay(n, 10, 60, 0.5, True, lambda: 0.9) for n in range(6)} == {10}
    # Factor 2 without jitter doubles up to the maximum.
    assert [backoff_delay(n, 1, 5, 2, False) for n in range(5)] == [1, 2, 4, 5, 5]
    # Jitter picks between the minimum and the un-jittered delay.
    assert backoff_delay(2, 1, 60, 2, True, lambda: 0.5) == 2.5
    assert backoff_delay(10_000, 1, 60, 2, False) == 60  # no overflow
    assert backoff_delay(0, 70, 60, 2, False) == 60  # min >= max: max


def test_connect_retry_interval_is_linear_with_half_jitter() -> None:
    assert linear_jitter(3.0, lambda: 0.0) == 1.5
    assert linear_jitter(3.0, lambda: 0.5) == 3.0
    assert linear_jitter(3.0, lambda: 1.0) == 4.5
