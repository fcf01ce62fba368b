from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RateLimitUnit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[RateLimitUnit]
    SECOND: _ClassVar[RateLimitUnit]
    MINUTE: _ClassVar[RateLimitUnit]
    HOUR: _ClassVar[RateLimitUnit]
    DAY: _ClassVar[RateLimitUnit]
    WEEK: _ClassVar[RateLimitUnit]
    MONTH: _ClassVar[RateLimitUnit]
    YEAR: _ClassVar[RateLimitUnit]
UNKNOWN: RateLimitUnit
SECOND: RateLimitUnit
MINUTE: RateLimitUnit
HOUR: RateLimitUnit
DAY: RateLimitUnit
WEEK: RateLimitUnit
MONTH: RateLimitUnit
YEAR: RateLimitUnit

class RateLimitConfig(_message.Message):
    __slots__ = ("name", "domain", "descriptors")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    name: str
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[RateLimitDescriptor]
    def __init__(self, name: _Optional[str] = ..., domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[RateLimitDescriptor, _Mapping]]] = ...) -> None: ...

class RateLimitDescriptor(_message.Message):
    __slots__ = ("key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric", "quota_mode", "metadata")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_MODE_FIELD_NUMBER: _ClassVar[int]
    DETAILED_METRIC_FIELD_NUMBER: _ClassVar[int]
    QUOTA_MODE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    rate_limit: RateLimitPolicy
    descriptors: _containers.RepeatedCompositeFieldContainer[RateLimitDescriptor]
    shadow_mode: bool
    detailed_metric: bool
    quota_mode: bool
    metadata: _struct_pb2.Struct
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., rate_limit: _Optional[_Union[RateLimitPolicy, _Mapping]] = ..., descriptors: _Optional[_Iterable[_Union[RateLimitDescriptor, _Mapping]]] = ..., shadow_mode: _Optional[bool] = ..., detailed_metric: _Optional[bool] = ..., quota_mode: _Optional[bool] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class RateLimitPolicy(_message.Message):
    __slots__ = ("unit", "requests_per_unit", "unlimited", "name", "replaces")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_UNIT_FIELD_NUMBER: _ClassVar[int]
    UNLIMITED_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLACES_FIELD_NUMBER: _ClassVar[int]
    unit: RateLimitUnit
    requests_per_unit: int
    unlimited: bool
    name: str
    replaces: _containers.RepeatedCompositeFieldContainer[RateLimitReplace]
    def __init__(self, unit: _Optional[_Union[RateLimitUnit, str]] = ..., requests_per_unit: _Optional[int] = ..., unlimited: _Optional[bool] = ..., name: _Optional[str] = ..., replaces: _Optional[_Iterable[_Union[RateLimitReplace, _Mapping]]] = ...) -> None: ...

class RateLimitReplace(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...
