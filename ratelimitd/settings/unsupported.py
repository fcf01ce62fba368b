"""Variables of the reference that ratelimitd refuses at start-up rather than ignore.

A setting accepted and then ignored is a defect: the operator believes it does something. So
each variable below is refused, with one line naming it and why, when its value asks for
behaviour ratelimitd does not implement. The rule: a refused variable is still accepted when
it is unset, empty, or set to the reference's default (that asks for nothing more than leaving
it unset) or to a value that describes what ratelimitd does anyway; any other value stops
start-up. Values are validated first, with the usual "invalid value" errors.

This table is the one place to shrink: implementing a setting means deleting its rows here
(and turning its rows in ``tests/daemon/test_reference_settings.py`` from refused into
implemented).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .goparse import Env, SettingsError

__all__ = ["UNSUPPORTED", "Unsupported", "refuse_unsupported"]

Accepts = Callable[[Env, str], bool]


@dataclass(frozen=True, slots=True)
class Unsupported:
    """One refused variable: which values are still accepted, and why the others are not."""

    variable: str
    accepts: Accepts  # (env, variable) -> True when the value asks for nothing we lack
    why: str
    secret: bool = False  # never echo the value (it may carry credentials)


def _str(*accepted: str) -> Accepts:
    return lambda env, name: env.get_str(name) in accepted


def _upper(*accepted: str) -> Accepts:
    return lambda env, name: env.get_str(name).upper() in accepted


def _bool(*accepted: bool) -> Accepts:
    return lambda env, name: env.get_bool(name, accepted[0]) in accepted


def _int(*accepted: int) -> Accepts:
    return lambda env, name: env.get_int(name, accepted[0]) in accepted


def _float(default: float) -> Accepts:
    return lambda env, name: env.get_float(name, default) == default


def _duration(default: float) -> Accepts:
    return lambda env, name: env.get_duration(name, default) == default


def _none(env: Env, name: str) -> bool:
    return False


_XDS = "not implemented yet: ratelimitd has no xDS config provider; use CONFIG_TYPE=FILE"
_XDS_VARIABLE = _XDS.replace("; use CONFIG_TYPE=FILE", "; unset it")
_POOL = (
    "not implemented: requests share pipelined connections, so the pool never runs empty; "
    "the reference refuses CREATE and ERROR too since radix v4; unset it or set WAIT"
)
_WAIT = "not a setting since the reference moved to radix v4 (only its README names it); unset it"
_PARALLEL = (
    "not implemented yet: a bound on parallel cluster pipelines; ratelimitd always sends a "
    "request's per-node pipelines all at once; unset it or set 0"
)
_REQUEST_HEADERS = (
    "not implemented yet: rate-limit headers on the upstream request (request_headers_to_add, "
    "upstream #1168); unset it"
)


def _redis(suffix: str, accepts: Accepts, why: str) -> tuple[Unsupported, ...]:
    # The main and the per-second instance take the same variable.
    return tuple(
        Unsupported(prefix + suffix, accepts, why) for prefix in ("REDIS_", "REDIS_PERSECOND_")
    )


UNSUPPORTED: tuple[Unsupported, ...] = (
    # xDS (CONFIG_TYPE=GRPC_XDS_SOTW and its client settings).
    Unsupported("CONFIG_TYPE", _str("FILE"), _XDS),
    Unsupported("CONFIG_GRPC_XDS_NODE_ID", _str("default"), _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_NODE_METADATA", _none, _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_SERVER_URL", _str("localhost:18000"), _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", _duration(3.0), _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", _none, _XDS_VARIABLE, secret=True),
    Unsupported("CONFIG_GRPC_XDS_SERVER_USE_TLS", _bool(False), _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", _none, _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", _none, _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", _none, _XDS_VARIABLE),
    Unsupported("CONFIG_GRPC_XDS_SERVER_TLS_SAN", _none, _XDS_VARIABLE),
    Unsupported("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", _duration(10.0), _XDS_VARIABLE),
    Unsupported("XDS_CLIENT_BACKOFF_MAX_INTERVAL", _duration(60.0), _XDS_VARIABLE),
    Unsupported("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", _float(0.5), _XDS_VARIABLE),
    Unsupported("XDS_CLIENT_BACKOFF_JITTER", _bool(True), _XDS_VARIABLE),
    Unsupported("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", _int(0), _XDS_VARIABLE),
    # Redis pool knobs of the reference's driver that ratelimitd's pool has no use for.
    *_redis("POOL_ON_EMPTY_BEHAVIOR", _upper("WAIT"), _POOL),
    *_redis("POOL_ON_EMPTY_WAIT_DURATION", _none, _WAIT),
    *_redis("CLUSTER_PIPELINE_PARALLELISM", _int(1, 0), _PARALLEL),
    # Merged upstream after f2fb157 (ratelimit-upstream-2026.md section 1.1), not done yet.
    Unsupported("LIMIT_REQUEST_HEADERS_ENABLED", _bool(False), _REQUEST_HEADERS),
    Unsupported("LIMIT_REQUEST_LIMIT_HEADER", _str("RateLimit-Limit"), _REQUEST_HEADERS),
    Unsupported("LIMIT_REQUEST_REMAINING_HEADER", _str("RateLimit-Remaining"), _REQUEST_HEADERS),
    Unsupported("LIMIT_REQUEST_RESET_HEADER", _str("RateLimit-Reset"), _REQUEST_HEADERS),
)


def refuse_unsupported(env: Env) -> None:
    """Raise SettingsError for the first variable whose value asks for what we lack."""
    for entry in UNSUPPORTED:
        value = env.get(entry.variable)
        if value and not entry.accepts(env, entry.variable):
            shown = "" if entry.secret else f" {value!r}"
            raise SettingsError(f"{entry.variable}: unsupported value{shown} ({entry.why})")
