"""Cross-field checks of Settings: what the reference checks when it builds its sinks and
clients, and what ratelimitd refuses rather than accept and ignore.

Which failure, breaker and in-flight settings apply, and which settings sections are
checked, follows the selected backend's declaration (`backends.Capabilities`), never its
name. The declarations are handed in by whoever composes the process (`backends.load_settings`):
this package imports no backend.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Protocol

from .goparse import Env, SettingsError, invalid
from .sections import ConnectionLimits, Settings, mask_url

_MEMCACHE_SRV = re.compile(r"^_(.+?)\._(.+?)\.(.+)$")
_SINK_VARIABLES = ("USE_DOG_STATSD", "USE_STATSD", "USE_PROMETHEUS")


class BackendRules(Protocol):
    """What the checks read of a backend's declaration (`backends.Capabilities`)."""

    @property
    def raises(self) -> bool: ...
    @property
    def breakers(self) -> bool: ...
    @property
    def waits(self) -> bool: ...
    @property
    def no_failures(self) -> str: ...
    @property
    def sections(self) -> tuple[str, ...]: ...
    @property
    def budgets(self) -> Collection[int]: ...


def check(settings: Settings, env: Env, backends: Mapping[str, BackendRules]) -> None:
    """Raise SettingsError (one line) for a combination that cannot work or would be
    accepted and do nothing."""
    reload = settings.reload
    if reload.headers_format != "reference" and not reload.response_headers:
        raise SettingsError(
            f"LIMIT_RESPONSE_HEADERS_FORMAT: {reload.headers_format!r} formats the response "
            "headers, which are off: set LIMIT_RESPONSE_HEADERS_ENABLED=true too"
        )
    _check_backend(settings, env, backends[settings.cache.backend])
    if reload.dynamic_metadata_limit_name and not reload.response_dynamic_metadata:
        raise SettingsError(
            "RESPONSE_DYNAMIC_METADATA_LIMIT_NAME: has no effect without "
            "RESPONSE_DYNAMIC_METADATA=true (no dynamic metadata is sent)"
        )
    if settings.listeners.json_domains and not settings.listeners.json_enabled:
        raise SettingsError(
            "HTTP_JSON_DOMAINS: has no effect with HTTP_JSON_ENABLED=false (/json is off): "
            "unset one of them"
        )
    if settings.grpc.transport == "grpcio":
        refuse_native_only(settings)
    _check_sinks(settings, env)


def refuse_native_only(settings: Settings) -> None:
    """With grpc.aio serving gRPC: refuse the settings only the native transport applies
    (grpc.aio bounds neither the connections nor the time a request takes to arrive)."""
    limits = settings.connections
    defaults = ConnectionLimits()
    native_only = (
        "grpc_max_connections",
        "grpc_read_timeout",
        "grpc_write_timeout",
        "grpc_connection_timeout",
    )
    if any(getattr(limits, name) != getattr(defaults, name) for name in native_only):
        raise SettingsError(
            "GRPC_MAX_CONNECTIONS, GRPC_READ_TIMEOUT, GRPC_WRITE_TIMEOUT and "
            "GRPC_CONNECTION_TIMEOUT need the native gRPC transport "
            "(unset GRPC_TRANSPORT=grpcio, or unset them)"
        )


def _check_backend(settings: Settings, env: Env, can: BackendRules) -> None:
    """The selected backend's settings, as its declaration says they apply."""
    cache = settings.cache
    for name, on, applies in (
        ("BACKEND_FAILURE_POLICY", cache.failure_policy != "error", can.raises),
        ("BACKEND_BREAKER_FAILURES", bool(cache.breaker_failures), can.raises and can.breakers),
        ("MAX_INFLIGHT_DECISIONS", bool(cache.max_in_flight), can.waits),
    ):
        if on and not applies:
            why = can.no_failures or "it has no circuit breakers"
            raise SettingsError(f"{name}: has no effect with BACKEND_TYPE={cache.backend} ({why})")
    for name in ("MEMORY_MAX_KEYS", "MEMORY_MAX_BUDGET_TRANSACTIONS"):
        if (
            env.typed(name) is not None
            and "memory" not in can.sections
            and cache.failure_policy != "local"
        ):
            raise SettingsError(
                f"{name}: has no effect with BACKEND_TYPE={cache.backend} (it bounds the "
                "memory backend, and the store of BACKEND_FAILURE_POLICY=local)"
            )
    if env.typed("BUDGET_MAX_TRANSACTIONS") is not None and not can.budgets:
        raise SettingsError(
            f"BUDGET_MAX_TRANSACTIONS: has no effect with BACKEND_TYPE={cache.backend} (it "
            "keeps no token budgets)"
        )
    if env.get("BACKEND_BREAKER_PROBE_INTERVAL") is not None and not cache.breaker_failures:
        raise SettingsError(
            "BACKEND_BREAKER_PROBE_INTERVAL: has no effect without BACKEND_BREAKER_FAILURES "
            "(the breaker is off)"
        )
    # As the reference, a client's settings are checked only when that client is built.
    if "redis" in can.sections:
        if settings.redis.type == "sentinel":
            _check_sentinel_url("REDIS_URL", settings.redis.url)
        per_second = settings.redis_persecond
        if per_second is not None and per_second.type == "sentinel":
            _check_sentinel_url("REDIS_PERSECOND_URL", per_second.url)
    if "memcache" in can.sections:
        memcache = settings.memcache
        if memcache.host_port and memcache.srv:
            values = (
                f"MEMCACHE_HOST_PORT={env.get_str('MEMCACHE_HOST_PORT')}, "
                f"MEMCACHE_SRV={memcache.srv}"
            )
            raise SettingsError(
                f"MEMCACHE_HOST_PORT, MEMCACHE_SRV: invalid combination {values!r} "
                "(accepted: only one of MEMCACHE_HOST_PORT, MEMCACHE_SRV)"
            )
        if memcache.srv and not _MEMCACHE_SRV.match(memcache.srv):
            raise invalid("MEMCACHE_SRV", memcache.srv, "expected _service._proto.name")


def _check_sinks(settings: Settings, env: Env) -> None:
    stats = settings.stats
    if stats.disable:
        return
    enabled = [
        name
        for name, on in zip(
            _SINK_VARIABLES,
            (stats.use_dog_statsd, stats.use_statsd, stats.use_prometheus),
            strict=True,
        )
        if on
    ]
    if len(enabled) > 1:
        both = ", ".join(enabled)
        values = ", ".join(f"{name}={env.get_str(name, 'true')}" for name in enabled)
        raise SettingsError(
            f"{both}: invalid combination {values!r} (accepted: at most one of "
            "USE_DOG_STATSD, USE_STATSD, USE_PROMETHEUS true; USE_STATSD defaults to "
            "true, so set USE_STATSD=false to use another sink)"
        )


def _check_sentinel_url(name: str, url: str) -> None:
    if len(url.split(",")) < 2:
        raise invalid(name, mask_url(url), "a sentinel URL is 'master,host:port[,host:port...]'")
