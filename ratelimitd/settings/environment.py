"""Reading the environment into :class:`Settings`: the package's only ``os.environ`` reader.

Names, defaults and parsing follow envoyproxy/ratelimit (``src/settings/settings.go``) so that
existing deployments move over unchanged; ``goparse.py`` has the Go value syntax. Each section
is read by its table (field -> variable and reader; the default is the field's in
``sections.py``), and what a table cannot say is computed beside it. An invalid value raises
:class:`SettingsError` whose message is one line naming the variable, the bad value and what
is accepted; a variable asking for something ratelimitd does not do is refused the same way
(the table in ``unsupported.py``); the daemon prints the line and exits with status 1.

Deliberate differences from the reference, all more lenient or safer:

* Aliases: every ``KVCACHE_<X>`` variable is accepted as ``REDIS_<X>`` and every ``ALTCACHE_<X>``
  as ``MEMCACHE_<X>`` (the spellings of the service specification); the canonical one wins.
  ``BACKEND_TYPE=altcache`` means ``memcache`` and ``BACKEND_TYPE=kvcache`` means ``redis``.
* ``BACKEND_TYPE`` also accepts ``memory`` (in-process counters, one process only). When it is
  unset or empty and no ``REDIS_*`` / ``MEMCACHE_*`` variable (or alias) has a non-empty value,
  the backend is ``memory`` and ``cache.backend_defaulted`` is true so the daemon can log that
  choice. Otherwise an unset ``BACKEND_TYPE`` means ``redis``, the reference default.
* Two enabled stats sinks (``USE_DOG_STATSD``, ``USE_STATSD``, ``USE_PROMETHEUS``) are reported
  here as a :class:`SettingsError` instead of a fatal log line at sink creation.
* ``REDIS_*`` structural checks (sentinel ``REDIS_URL`` shape) and ``MEMCACHE_*`` ones
  (``MEMCACHE_HOST_PORT`` with ``MEMCACHE_SRV``, the SRV name shape) run only when that backend
  is selected, as the reference only checks them when it builds that client.

Extensions (not in the reference):

* ``RATELIMITD_WORKERS`` (integer >= 1, default 1): worker processes sharing the listening
  ports with SO_REUSEPORT. The supervisor gives each worker ``RATELIMITD_WORKER_INDEX`` and,
  with the Prometheus sink, ``RATELIMITD_STATS_DIR``, and ``RATELIMITD_SUPERVISOR_PID``
  (:func:`worker_environ`); they are not meant to be set by hand.
* ``REDIS_REQUEST_TIMEOUT`` (Go duration > 0, default ``50ms``): the longest a request waits
  for its Redis replies before failing like a Redis error; applies to both instances.
  ``REDIS_TIMEOUT`` stays the dial timeout, as in the reference.
* ``DEBUG_PROFILE_ENABLED`` (bool, default false), ``DEBUG_PROFILE_MAX_DURATION`` (Go
  duration > 0, default ``10s``), ``ADMIN_TOKEN``: the debug listener's
  ``/debug/pprof/profile`` is off unless enabled, at most that long, and with a token set
  only for requests bearing it (:class:`DebugSettings`).
* ``RATELIMITD_NO_EXTENSIONS`` (any non-empty value): the pure-Python twins instead of the
  compiled modules (:func:`extensions_disabled`, read by the selector modules at import).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from .checks import BackendRules, check
from .goparse import Env, Pairs, invalid
from .sections import (
    PERSECOND_URL,
    CacheSettings,
    ConfigSettings,
    ConnectionLimits,
    DebugSettings,
    DogStatsdMogrifier,
    GrpcSettings,
    ListenerSettings,
    LogSettings,
    MemcacheSettings,
    QuotaSettings,
    RedisSettings,
    ReloadOptions,
    RuntimeSettings,
    Settings,
    StatsSettings,
    TracingSettings,
    WorkerSettings,
    XdsSettings,
)
from .unsupported import refuse_unsupported

# logrus.ParseLevel names (case-insensitive) -> the canonical logrus level name.
_LOG_LEVELS = {
    "trace": "trace",
    "debug": "debug",
    "info": "info",
    "warn": "warning",
    "warning": "warning",
    "error": "error",
    "fatal": "fatal",
    "panic": "panic",
}
# BACKEND_TYPE's aliases (the service specification's spellings), besides the registry's
# own names (`backends.BACKENDS`, handed in as `backends`).
_BACKEND_ALIASES = {"kvcache": "redis", "altcache": "memcache"}
_SOCKET_TYPES = {"tcp": "tcp", "unix": "unix"}
# A sentinel REDIS_URL: a master name (no ':' or '/'), then host:port addresses.
_SENTINEL_URL = re.compile(r"^[^,:/@]+(,[^,]+:[0-9]+)+$")
_REDIS_TYPES = {"single": "single", "sentinel": "sentinel", "cluster": "cluster"}
_HEADER_FORMATS = {"reference": "reference", "ietf": "ietf"}
FAILURE_POLICIES = {p: p for p in ("error", "allow", "deny", "local")}
_BACKEND_PREFIXES = ("REDIS_", "MEMCACHE_")


def settings_from_env(
    environ: Mapping[str, str] | None, backends: Mapping[str, BackendRules]
) -> Settings:
    """Build Settings from the environment (None: os.environ) for the BACKEND_TYPE names and
    declarations of `backends` (`backends.load_settings` hands in the registry); raise
    SettingsError."""
    env = Env(os.environ if environ is None else environ)
    backend, defaulted = _backend(env, backends)
    stats = _section(env, StatsSettings, _STATS)
    reload = _reload(env)
    redis = _redis(env, "REDIS_", RedisSettings().url, shared=None)
    per_second = _redis(env, "REDIS_PERSECOND_", PERSECOND_URL, shared=redis)
    settings = Settings(
        listeners=_section(env, ListenerSettings, _LISTENERS),
        connections=_section(env, ConnectionLimits, _CONNECTIONS),
        debug=_section(env, DebugSettings, _DEBUG),
        grpc=_section(env, GrpcSettings, _GRPC),
        log=LogSettings(
            level=env.get_choice("LOG_LEVEL", LogSettings().level, _LOG_LEVELS),
            # The reference switches to JSON on "json" (any case) and uses text otherwise.
            format="json" if env.get_str("LOG_FORMAT", "text").lower() == "json" else "text",
        ),
        config=_section(env, ConfigSettings, _CONFIG),
        xds=_section(
            env,
            XdsSettings,
            _XDS,
            node_metadata=node_metadata(env.get_str("CONFIG_GRPC_XDS_NODE_METADATA")),
        ),
        runtime=_section(env, RuntimeSettings, _RUNTIME),
        stats=stats,
        cache=_section(env, CacheSettings, _CACHE, backend=backend, backend_defaulted=defaulted),
        redis=redis,
        redis_persecond=per_second if env.get_bool("REDIS_PERSECOND", False) else None,
        memcache=_section(env, MemcacheSettings, _MEMCACHE),
        tracing=_section(env, TracingSettings, _TRACING),
        reload=reload,
        quota=_section(env, QuotaSettings, _QUOTA),
        workers=WorkerSettings(
            count=env.get_int("RATELIMITD_WORKERS", 1, lo=1),
            index=(
                env.get_int("RATELIMITD_WORKER_INDEX", 0, lo=0)
                if env.get_str("RATELIMITD_WORKER_INDEX")
                else None
            ),
            stats_dir=env.get_str("RATELIMITD_STATS_DIR"),
            supervisor_pid=(
                env.get_int("RATELIMITD_SUPERVISOR_PID", 0, lo=1)
                if env.get_str("RATELIMITD_SUPERVISOR_PID")
                else None
            ),
        ),
    )
    check(settings, env, backends)
    refuse_unsupported(env)
    if stats.sink == "dogstatsd" and stats.dog_statsd_mogrifier_names:
        # As the reference, mogrifiers are read only when the DogStatsD sink is built.
        mogrifiers = _mogrifiers(env, stats.dog_statsd_mogrifier_names)
        stats = dataclasses.replace(stats, dog_statsd_mogrifiers=mogrifiers)
        settings = dataclasses.replace(settings, stats=stats)
    return settings


def reload_options_from_env(environ: Mapping[str, str] | None = None) -> ReloadOptions:
    """Re-read the settings the reference re-reads on every config load; raise SettingsError."""
    return _reload(Env(os.environ if environ is None else environ))


def extensions_disabled() -> bool:
    """RATELIMITD_NO_EXTENSIONS is set: the selectors load the pure-Python twins."""
    # Read at import by match.py / keys.py / protocodec.py, before any Settings exist (as
    # yarl's YARL_NO_EXTENSIONS); any non-empty value counts.
    return bool(os.environ.get("RATELIMITD_NO_EXTENSIONS"))


def backend_type_from_env(names: Collection[str]) -> str | None:
    """BACKEND_TYPE (one of `names`) as the daemon reads it when set explicitly, else None
    (check-config)."""
    env = Env(os.environ)
    return _backend(env, names)[0] if env.typed("BACKEND_TYPE") is not None else None


def worker_environ(index: int, stats_dir: str) -> dict[str, str]:
    """The environment of worker `index`: this process's, as one worker of a supervised set."""
    env = dict(
        os.environ,
        RATELIMITD_WORKERS="1",
        RATELIMITD_WORKER_INDEX=str(index),
        RATELIMITD_SUPERVISOR_PID=str(os.getpid()),
    )
    if stats_dir:
        env["RATELIMITD_STATS_DIR"] = stats_dir
    return env


# How a section is read: each field from one variable, by one reader, defaulting to the
# field's own default (`sections.py` holds the defaults, these tables the names). A field
# not in its table is either computed by its builder or not read from the environment.
Read = Callable[[Env, str, Any], Any]  # (env, variable, the field's default) -> value
Table = dict[str, tuple[str, Read]]  # field -> (variable, reader)
_INT32 = 2**31 - 1


def _int(lo: int | None = None, hi: int | None = None) -> Read:
    return lambda env, name, default: env.get_int(name, default, lo, hi)


def _float(lo: float, hi: float) -> Read:
    return lambda env, name, default: env.get_float(name, default, lo, hi)


def _choice(choices: Mapping[str, str], case_sensitive: bool = False) -> Read:
    return lambda env, name, default: env.get_choice(name, default, choices, case_sensitive)


def _positive(env: Env, name: str, default: float) -> float:
    """A Go duration > 0."""
    return env.get_duration(name, default, positive=True)


def _list(env: Env, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    return env.get_list(name) or default


def _map(env: Env, name: str, default: Pairs) -> Pairs:
    return env.get_map(name) or default


_str, _bool, _port, _duration = Env.get_str, Env.get_bool, Env.get_port, Env.get_duration

_LISTENERS: Table = {
    "host": ("HOST", _str),
    "port": ("PORT", _port),
    "debug_host": ("DEBUG_HOST", _str),
    "debug_port": ("DEBUG_PORT", _port),
    "grpc_host": ("GRPC_HOST", _str),
    "grpc_port": ("GRPC_PORT", _port),
    "grpc_uds": ("GRPC_UDS", _str),
    "json_enabled": ("HTTP_JSON_ENABLED", _bool),
    "json_domains": ("HTTP_JSON_DOMAINS", _list),
}
_CONNECTIONS: Table = {
    "http_max_connections": ("HTTP_MAX_CONNECTIONS", _int(1, _INT32)),
    "debug_max_connections": ("DEBUG_MAX_CONNECTIONS", _int(1, _INT32)),
    "grpc_max_connections": ("GRPC_MAX_CONNECTIONS", _int(1, _INT32)),
    "http_read_timeout": ("HTTP_READ_TIMEOUT", _positive),
    "http_idle_timeout": ("HTTP_IDLE_TIMEOUT", _positive),
    "http_write_timeout": ("HTTP_WRITE_TIMEOUT", _positive),
    "grpc_read_timeout": ("GRPC_READ_TIMEOUT", _positive),
    "grpc_write_timeout": ("GRPC_WRITE_TIMEOUT", _positive),
    "grpc_connection_timeout": ("GRPC_CONNECTION_TIMEOUT", _positive),
    # Room for two maximal gRPC messages (4 MiB each) with their heads at least.
    "max_buffered_bytes": ("MAX_BUFFERED_BYTES", _int(8 * 1024 * 1024, _INT32)),
}
_DEBUG: Table = {
    "profile_enabled": ("DEBUG_PROFILE_ENABLED", _bool),
    "profile_max_seconds": ("DEBUG_PROFILE_MAX_DURATION", _positive),
    "admin_token": ("ADMIN_TOKEN", _str),
}
_GRPC: Table = {
    "max_connection_age": ("GRPC_MAX_CONNECTION_AGE", _duration),
    "max_connection_age_grace": ("GRPC_MAX_CONNECTION_AGE_GRACE", _duration),
    "server_use_tls": ("GRPC_SERVER_USE_TLS", _bool),
    "server_tls_cert": ("GRPC_SERVER_TLS_CERT", _str),
    "server_tls_key": ("GRPC_SERVER_TLS_KEY", _str),
    "client_tls_cacert": ("GRPC_CLIENT_TLS_CACERT", _str),
    "client_tls_san": ("GRPC_CLIENT_TLS_SAN", _str),
    "transport": ("GRPC_TRANSPORT", _choice({"native": "native", "grpcio": "grpcio"})),
    "max_concurrent_streams": ("GRPC_MAX_CONCURRENT_STREAMS", _int(1, _INT32)),
}
_CONFIG: Table = {
    "type": (
        "CONFIG_TYPE",
        _choice({"FILE": "FILE", "GRPC_XDS_SOTW": "GRPC_XDS_SOTW"}, case_sensitive=True),
    ),
    "force_start_without_initial_config": ("FORCE_START_WITHOUT_INITIAL_CONFIG", _bool),
    "healthy_with_at_least_one_config_loaded": ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", _bool),
}
_XDS: Table = {
    "node_id": ("CONFIG_GRPC_XDS_NODE_ID", _str),
    "server_url": ("CONFIG_GRPC_XDS_SERVER_URL", _str),
    "server_connect_retry_interval": ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", _duration),
    "client_additional_headers": ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", _map),
    "server_use_tls": ("CONFIG_GRPC_XDS_SERVER_USE_TLS", _bool),
    "client_tls_cert": ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", _str),
    "client_tls_key": ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", _str),
    "server_tls_cacert": ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", _str),
    "server_tls_san": ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", _str),
    "backoff_initial_interval": ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", _duration),
    "backoff_max_interval": ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", _duration),
    "backoff_random_factor": ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Env.get_float),
    "backoff_jitter": ("XDS_CLIENT_BACKOFF_JITTER", _bool),
    "max_msg_size_in_bytes": ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", _int(0)),
}
_RUNTIME: Table = {
    "root": ("RUNTIME_ROOT", _str),
    "subdirectory": ("RUNTIME_SUBDIRECTORY", _str),
    "appdirectory": ("RUNTIME_APPDIRECTORY", _str),
    "ignoredotfiles": ("RUNTIME_IGNOREDOTFILES", _bool),
    "watch_root": ("RUNTIME_WATCH_ROOT", _bool),
}
_STATS: Table = {
    "use_dog_statsd": ("USE_DOG_STATSD", _bool),
    "dog_statsd_mogrifier_names": ("USE_DOG_STATSD_MOGRIFIERS", _list),
    "use_statsd": ("USE_STATSD", _bool),
    "statsd_host": ("STATSD_HOST", _str),
    "statsd_port": ("STATSD_PORT", _port),
    "statsd_protocol": ("STATSD_PROTOCOL", _choice({"tcp": "tcp", "udp": "udp"}, True)),
    "use_prometheus": ("USE_PROMETHEUS", _bool),
    "prometheus_addr": ("PROMETHEUS_ADDR", _str),
    "prometheus_path": ("PROMETHEUS_PATH", _str),
    "prometheus_mapper_yaml": ("PROMETHEUS_MAPPER_YAML", _str),
    "prometheus_response_time_as_milliseconds": (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        _bool,
    ),
    "extra_tags": ("EXTRA_TAGS", _map),
    # time.NewTicker panics on a non-positive interval, so 0 is refused here.
    "flush_interval": ("STATS_FLUSH_INTERVAL", _positive),
    "rate_limit_gauges": ("STATS_RATE_LIMIT_GAUGES", _bool),
    "max_request_series": ("STATS_MAX_REQUEST_SERIES", _int(0, _INT32)),
    # At least 64: a cut key keeps more of its text than its 17-byte digest suffix.
    "max_request_key_bytes": ("STATS_MAX_REQUEST_KEY_BYTES", _int(64, 65536)),
    "disable": ("DISABLE_STATS", _bool),
}
_CACHE: Table = {
    "expiration_jitter_max_seconds": ("EXPIRATION_JITTER_MAX_SECONDS", _int(0)),
    "local_cache_size_in_bytes": ("LOCAL_CACHE_SIZE_IN_BYTES", _int(0)),
    "near_limit_ratio": ("NEAR_LIMIT_RATIO", Env.get_float),
    "cache_key_prefix": ("CACHE_KEY_PREFIX", _str),
    "stop_cache_key_increment_when_overlimit": ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", _bool),
    "failure_policy": ("BACKEND_FAILURE_POLICY", _choice(FAILURE_POLICIES)),
    "breaker_failures": ("BACKEND_BREAKER_FAILURES", _int(0)),
    "breaker_probe_interval": ("BACKEND_BREAKER_PROBE_INTERVAL", _positive),
    "max_in_flight": ("MAX_INFLIGHT_DECISIONS", _int(0)),
    "memory_max_keys": ("MEMORY_MAX_KEYS", _int(1, _INT32)),
    "budget_max_transactions": ("BUDGET_MAX_TRANSACTIONS", _int(1, _INT32)),
    "memory_max_budget_transactions": ("MEMORY_MAX_BUDGET_TRANSACTIONS", _int(1, _INT32)),
}
# A Redis instance's own variables, after its prefix (REDIS_, REDIS_PERSECOND_).
_REDIS_INSTANCE: Table = {
    "socket_type": ("SOCKET_TYPE", _choice(_SOCKET_TYPES)),
    "pool_size": ("POOL_SIZE", _int(1)),
    "auth": ("AUTH", _str),
    "sentinel_auth": ("SENTINEL_AUTH", _str),
    "tls": ("TLS", _bool),
    "pipeline_window": ("PIPELINE_WINDOW", _duration),
    "pipeline_limit": ("PIPELINE_LIMIT", _int(0)),
    "cluster_pipeline_parallelism": ("CLUSTER_PIPELINE_PARALLELISM", _int(0)),
    "dial_timeout": ("TIMEOUT", _duration),
}
# What both instances take from the main one's variables.
_REDIS_SHARED: Table = {
    "tls_client_cert": ("REDIS_TLS_CLIENT_CERT", _str),
    "tls_client_key": ("REDIS_TLS_CLIENT_KEY", _str),
    "tls_cacert": ("REDIS_TLS_CACERT", _str),
    "tls_skip_hostname_verification": ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", _bool),
    "startup_initial_interval": ("REDIS_STARTUP_INITIAL_INTERVAL", _duration),
    "startup_max_interval": ("REDIS_STARTUP_MAX_INTERVAL", _duration),
    "startup_max_elapsed_time": ("REDIS_STARTUP_MAX_ELAPSED_TIME", _duration),
    "health_check_active_connection": ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", _bool),
    "request_timeout": ("REDIS_REQUEST_TIMEOUT", _positive),
    # One variable for both instances, as upstream #1191 reads it.
    "close_connection_on_readonly": ("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR", _bool),
}
_MEMCACHE: Table = {
    "host_port": ("MEMCACHE_HOST_PORT", _list),
    "srv": ("MEMCACHE_SRV", _str),
    "srv_refresh": ("MEMCACHE_SRV_REFRESH", _duration),
    "max_idle_conns": ("MEMCACHE_MAX_IDLE_CONNS", _int(0)),
    "tls": ("MEMCACHE_TLS", _bool),
    "tls_client_cert": ("MEMCACHE_TLS_CLIENT_CERT", _str),
    "tls_client_key": ("MEMCACHE_TLS_CLIENT_KEY", _str),
    "tls_cacert": ("MEMCACHE_TLS_CACERT", _str),
    "tls_skip_hostname_verification": ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", _bool),
}
_TRACING: Table = {
    "enabled": ("TRACING_ENABLED", _bool),
    "exporter_protocol": ("TRACING_EXPORTER_PROTOCOL", _choice({"http": "http", "grpc": "grpc"})),
    "service_name": ("TRACING_SERVICE_NAME", _str),
    "service_namespace": ("TRACING_SERVICE_NAMESPACE", _str),
    "service_instance_id": ("TRACING_SERVICE_INSTANCE_ID", _str),
    "sampling_rate": ("TRACING_SAMPLING_RATE", _float(0.0, 1.0)),
}
_RELOAD: Table = {
    "shadow_mode": ("SHADOW_MODE", _bool),
    "quota_mode": ("QUOTA_MODE", _bool),
    "response_dynamic_metadata": ("RESPONSE_DYNAMIC_METADATA", _bool),
    "dynamic_metadata_limit_name": ("RESPONSE_DYNAMIC_METADATA_LIMIT_NAME", _bool),
    "response_headers": ("LIMIT_RESPONSE_HEADERS_ENABLED", _bool),
    "limit_header": ("LIMIT_LIMIT_HEADER", _str),
    "remaining_header": ("LIMIT_REMAINING_HEADER", _str),
    "reset_header": ("LIMIT_RESET_HEADER", _str),
    "headers_format": ("LIMIT_RESPONSE_HEADERS_FORMAT", _choice(_HEADER_FORMATS)),
    "all_descriptors_headers": ("LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED", _bool),
    "request_headers": ("LIMIT_REQUEST_HEADERS_ENABLED", _bool),
    "request_limit_header": ("LIMIT_REQUEST_LIMIT_HEADER", _str),
    "request_remaining_header": ("LIMIT_REQUEST_REMAINING_HEADER", _str),
    "request_reset_header": ("LIMIT_REQUEST_RESET_HEADER", _str),
    "merge_domain_config": ("MERGE_DOMAIN_CONFIG", _bool),
    "max_descriptors": ("MAX_DESCRIPTORS_PER_REQUEST", _int(1, _INT32)),
    "max_entries": ("MAX_ENTRIES_PER_DESCRIPTOR", _int(1, _INT32)),
    "max_value_length": ("MAX_DESCRIPTOR_VALUE_LENGTH", _int(1, _INT32)),
}
_QUOTA: Table = {
    "bucket_keys": ("RLQS_BUCKET_KEYS", _list),
    "assignment_ttl": ("RLQS_ASSIGNMENT_TTL", _positive),
    "report_interval": ("RLQS_REPORT_INTERVAL", _positive),
    "max_buckets_per_stream": ("RLQS_MAX_BUCKETS_PER_STREAM", _int(1)),
    "max_buckets": ("RLQS_MAX_BUCKETS", _int(1)),
    "max_streams": ("RLQS_MAX_STREAMS", _int(1)),
    "idle_timeout": ("RLQS_IDLE_TIMEOUT", _positive),
}


def _read(env: Env, cls: type[Any], table: Table, prefix: str = "") -> dict[str, Any]:
    """The fields of `table` read from `env` (each variable after `prefix`), by field name."""
    default = cls()
    return {
        field: read(env, prefix + name, getattr(default, field))
        for field, (name, read) in table.items()
    }


def _section(env: Env, cls: type[Any], table: Table, **computed: Any) -> Any:
    """A section of `cls` read by `table`, with the fields its builder `computed`."""
    return cls(**_read(env, cls, table), **computed)


def node_metadata(value: str) -> Pairs:
    """CONFIG_GRPC_XDS_NODE_METADATA ``k1=v1,k2=v2``; items without ``=`` are skipped."""
    result: dict[str, str] = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if sep:
            result[key] = val
    return tuple(result.items())


def _backend(env: Env, backends: Collection[str]) -> tuple[str, bool]:
    """The backend name and whether it was chosen because nothing was configured."""
    if env.typed("BACKEND_TYPE") is not None:
        # The aliases are accepted but not advertised: the spec spells them, users rarely do.
        names = {name: name for name in backends} | _BACKEND_ALIASES
        return env.get_choice("BACKEND_TYPE", "redis", names, accepted=", ".join(backends)), False
    configured = any(value and key.startswith(_BACKEND_PREFIXES) for key, value in env.items())
    return ("redis", False) if configured else ("memory", True)


def _redis(env: Env, prefix: str, url: str, shared: RedisSettings | None) -> RedisSettings:
    """One instance from `prefix` variables; the per-second one copies `shared`'s others."""
    d = RedisSettings()
    url = env.get_str(prefix + "URL", url)
    kind = env.get_choice(prefix + "TYPE", d.type, _REDIS_TYPES)
    if _SENTINEL_URL.match(url):
        # Envoy Gateway has one Redis `url` field and sets no REDIS_TYPE: a sentinel
        # address written there (`master,host:port`) means a sentinel, not a host to dial.
        if env.typed(prefix + "TYPE") is None:
            kind = "sentinel"
        elif kind != "sentinel":
            raise invalid(
                prefix + "URL",
                url,
                f"a sentinel address 'master,host:port[,...]' with {prefix}TYPE={kind}: "
                f"set {prefix}TYPE=sentinel, or leave it unset",
            )
    own = _read(env, RedisSettings, _REDIS_INSTANCE, prefix)
    own.update(
        type=kind,
        url=url,
        pool_on_empty_behavior=env.get_str(
            prefix + "POOL_ON_EMPTY_BEHAVIOR", d.pool_on_empty_behavior
        ).upper(),
    )
    if shared is not None:
        return dataclasses.replace(shared, **own)
    return RedisSettings(**own, **_read(env, RedisSettings, _REDIS_SHARED))


def _reload(env: Env) -> ReloadOptions:
    read = _read(env, ReloadOptions, _RELOAD)
    algorithms = _domain_algorithms(env.get_str("DOMAIN_DEFAULT_ALGORITHMS"))
    return ReloadOptions(**read, domain_algorithms=algorithms)


def _domain_algorithms(raw: str) -> tuple[tuple[str, str], ...]:
    """DOMAIN_DEFAULT_ALGORITHMS, `domain=algorithm` pairs separated by commas (`*=` for
    every domain not named). The names are the config's: the rule set's load checks them
    (settings know no config)."""
    name = "DOMAIN_DEFAULT_ALGORITHMS"
    pairs: dict[str, str] = {}
    for part in raw.split(","):
        if not part.strip():
            continue
        domain, sep, algorithm = (p.strip() for p in part.rpartition("="))
        if not sep or not domain or not algorithm or domain in pairs:
            raise invalid(name, raw, "comma-separated domain=algorithm pairs, one per domain")
        pairs[domain] = algorithm
    return tuple(pairs.items())


def _mogrifiers(env: Env, names: Iterable[str]) -> tuple[DogStatsdMogrifier, ...]:
    result = []
    for raw_name in names:
        name = raw_name.upper()  # envconfig upper-cases the prefixed variable names
        prefix = f"DOG_STATSD_MOGRIFIER_{name}_"
        pattern = env.get_str(prefix + "PATTERN")
        if not pattern:
            raise invalid(prefix + "PATTERN", pattern, "expected a non-empty regular expression")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise invalid(
                prefix + "PATTERN", pattern, f"not a valid regular expression: {exc}"
            ) from None
        metric_name = env.get_str(prefix + "NAME")
        if not metric_name:
            raise invalid(prefix + "NAME", metric_name, "expected a non-empty metric name")
        tags = env.get_map(prefix + "TAGS")
        for key, value in tags:
            if not key or not value:
                raw = env.get_str(prefix + "TAGS")
                raise invalid(prefix + "TAGS", raw, "expected non-empty tag:$N pairs")
        result.append(DogStatsdMogrifier(name, pattern, metric_name, tags))
    return tuple(result)
