"""xDS `RateLimitConfig` resources -> the documents the YAML loader produces.

The reference converts each resource into its YAML structs (`ConfigXdsProtoToYaml`) and loads
them through the same validation as files, so a resource is rejected with exactly the message a
file with the same content gets, prefixed with `RateLimitConfig.name`. We do the same:
resources become `ConfigSource`s of `RootDoc`s and go through `build_ruleset`. The unit is the
enum's name (`UNKNOWN` for an unlimited policy that names none, the number for one this proto
does not know), so unit checks, too, are the YAML ones. The proto has no
`value_to_metric`/`share_threshold`: those stay file-only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import any_pb2, json_format, struct_pb2
from google.protobuf.message import DecodeError

from .._proto import rls_conf_pb2
from .errors import ConfigError
from .ruleset import ConfigSource
from .yamlfile import DescriptorDoc, RateLimitDoc, RootDoc

MESSAGE_NAME = "ratelimit.config.ratelimit.v3.RateLimitConfig"
TYPE_URL = "type.googleapis.com/" + MESSAGE_NAME

_UNIT_NAMES = {number: name for name, number in rls_conf_pb2.RateLimitUnit.items()}


class ResourceError(ConfigError):
    """A resource that is not a decodable RateLimitConfig: rejected like a bad config, but
    its message has no name prefix (the reference NACKs with Go's bare unmarshal error)."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.name = ""
        self.message = message


def decode_resource(resource: any_pb2.Any) -> rls_conf_pb2.RateLimitConfig:
    """Unpack one `Any`; the messages are Go's `anypb.UnmarshalTo` errors."""
    message_name = resource.type_url.rpartition("/")[2]
    if message_name != MESSAGE_NAME:
        # Go prints got/want this way round (got: the destination, want: the Any's).
        raise ResourceError(
            f'proto: mismatched message type: got "{MESSAGE_NAME}", want "{message_name}"'
        )
    config = rls_conf_pb2.RateLimitConfig()
    try:
        config.ParseFromString(resource.value)
    except DecodeError:
        raise ResourceError("proto: cannot parse invalid wire-format data") from None
    return config


def to_doc(config: rls_conf_pb2.RateLimitConfig) -> RootDoc:
    """One RateLimitConfig as the RootDoc its YAML twin parses to."""
    return RootDoc(domain=config.domain, descriptors=_descriptors(config.descriptors))


def sources(resources: Iterable[any_pb2.Any]) -> list[ConfigSource]:
    """Every resource of one DiscoveryResponse, in order, named by `RateLimitConfig.name`."""
    out = []
    for resource in resources:
        config = decode_resource(resource)
        out.append(ConfigSource(config.name, to_doc(config)))
    return out


def _descriptors(descriptors: Iterable[rls_conf_pb2.RateLimitDescriptor]) -> list[DescriptorDoc]:
    return [
        DescriptorDoc(
            key=d.key,
            value=d.value,
            rate_limit=_rate_limit(d.rate_limit) if d.HasField("rate_limit") else None,
            descriptors=_descriptors(d.descriptors),
            shadow_mode=d.shadow_mode,
            quota_mode=d.quota_mode,
            detailed_metric=d.detailed_metric,
            metadata=_metadata(d.metadata) if d.HasField("metadata") else None,
        )
        for d in descriptors
    ]


def _rate_limit(policy: rls_conf_pb2.RateLimitPolicy) -> RateLimitDoc:
    return RateLimitDoc(
        requests_per_unit=policy.requests_per_unit,
        # Go's enum String(): the name, or the number for a value the enum does not declare.
        unit=_UNIT_NAMES.get(policy.unit, str(policy.unit)),
        unlimited=policy.unlimited,
        name=policy.name,
        replaces=[r.name for r in policy.replaces],
    )


def _metadata(struct: struct_pb2.Struct) -> dict[str, Any]:
    """The Struct as the dict a YAML `metadata:` block gives (integral numbers as ints)."""
    return _ints(json_format.MessageToDict(struct))  # type: ignore[no-any-return]


def _ints(value: Any) -> Any:
    # Struct holds every number as a double; YAML's `5` is an int, and Go prints both as 5.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value
