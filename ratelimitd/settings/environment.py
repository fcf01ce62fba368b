"""Reading the environment into :class:`Settings`: the package's only ``os.environ`` reader.

Names, defaults and parsing follow envoyproxy/ratelimit (``src/settings/settings.go``) so that
existing deployments move over unchanged; ``goparse.py`` has the Go value syntax. One builder
per section. An invalid value raises :class:`SettingsError` whose message is one line naming
the variable, the bad value and what is accepted; a variable asking for something ratelimitd
does not do is refused the same way (the table in ``unsupported.py``); the daemon prints the
line and exits with status 1.

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
from collections.abc import Collection, Iterable, Mapping
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
    stats = _stats(env)
    reload = _reload(env)
    redis = _redis(env, "REDIS_", RedisSettings().url, shared=None)
    per_second = _redis(env, "REDIS_PERSECOND_", PERSECOND_URL, shared=redis)
    settings = Settings(
        listeners=_listeners(env),
        connections=_connections(env),
        debug=DebugSettings(
            profile_enabled=env.get_bool("DEBUG_PROFILE_ENABLED", False),
            profile_max_seconds=env.get_duration(
                "DEBUG_PROFILE_MAX_DURATION", DebugSettings().profile_max_seconds, positive=True
            ),
            admin_token=env.get_str("ADMIN_TOKEN"),
        ),
        grpc=_grpc(env),
        log=LogSettings(
            level=env.get_choice("LOG_LEVEL", LogSettings().level, _LOG_LEVELS),
            # The reference switches to JSON on "json" (any case) and uses text otherwise.
            format="json" if env.get_str("LOG_FORMAT", "text").lower() == "json" else "text",
        ),
        config=_config(env),
        xds=_xds(env),
        runtime=_runtime(env),
        stats=stats,
        cache=_cache(env, backend, defaulted),
        redis=redis,
        redis_persecond=per_second if env.get_bool("REDIS_PERSECOND", False) else None,
        memcache=_memcache(env),
        tracing=_tracing(env),
        reload=reload,
        quota=_quota(env),
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


def _listeners(env: Env) -> ListenerSettings:
    d = ListenerSettings()
    return ListenerSettings(
        host=env.get_str("HOST", d.host),
        port=env.get_port("PORT", d.port),
        debug_host=env.get_str("DEBUG_HOST", d.debug_host),
        debug_port=env.get_port("DEBUG_PORT", d.debug_port),
        grpc_host=env.get_str("GRPC_HOST", d.grpc_host),
        grpc_port=env.get_port("GRPC_PORT", d.grpc_port),
        grpc_uds=env.get_str("GRPC_UDS"),
        json_enabled=env.get_bool("HTTP_JSON_ENABLED", d.json_enabled),
        json_domains=env.get_list("HTTP_JSON_DOMAINS"),
    )


def _connections(env: Env) -> ConnectionLimits:
    d = ConnectionLimits()
    most = 2**31 - 1
    return ConnectionLimits(
        http_max_connections=env.get_int("HTTP_MAX_CONNECTIONS", d.http_max_connections, 1, most),
        debug_max_connections=env.get_int(
            "DEBUG_MAX_CONNECTIONS", d.debug_max_connections, 1, most
        ),
        grpc_max_connections=env.get_int("GRPC_MAX_CONNECTIONS", d.grpc_max_connections, 1, most),
        http_read_timeout=env.get_duration("HTTP_READ_TIMEOUT", d.http_read_timeout, positive=True),
        http_idle_timeout=env.get_duration("HTTP_IDLE_TIMEOUT", d.http_idle_timeout, positive=True),
        http_write_timeout=env.get_duration(
            "HTTP_WRITE_TIMEOUT", d.http_write_timeout, positive=True
        ),
        grpc_read_timeout=env.get_duration("GRPC_READ_TIMEOUT", d.grpc_read_timeout, positive=True),
        grpc_write_timeout=env.get_duration(
            "GRPC_WRITE_TIMEOUT", d.grpc_write_timeout, positive=True
        ),
        grpc_connection_timeout=env.get_duration(
            "GRPC_CONNECTION_TIMEOUT", d.grpc_connection_timeout, positive=True
        ),
        # Room for two maximal gRPC messages (4 MiB each) with their heads at least.
        max_buffered_bytes=env.get_int(
            "MAX_BUFFERED_BYTES", d.max_buffered_bytes, 8 * 1024 * 1024, most
        ),
    )


def _grpc(env: Env) -> GrpcSettings:
    d = GrpcSettings()
    return GrpcSettings(
        max_connection_age=env.get_duration("GRPC_MAX_CONNECTION_AGE", d.max_connection_age),
        max_connection_age_grace=env.get_duration(
            "GRPC_MAX_CONNECTION_AGE_GRACE", d.max_connection_age_grace
        ),
        server_use_tls=env.get_bool("GRPC_SERVER_USE_TLS", d.server_use_tls),
        server_tls_cert=env.get_str("GRPC_SERVER_TLS_CERT"),
        server_tls_key=env.get_str("GRPC_SERVER_TLS_KEY"),
        client_tls_cacert=env.get_str("GRPC_CLIENT_TLS_CACERT"),
        client_tls_san=env.get_str("GRPC_CLIENT_TLS_SAN"),
        transport=env.get_choice("GRPC_TRANSPORT", "", {"native": "native", "grpcio": "grpcio"}),
        max_concurrent_streams=env.get_int(
            "GRPC_MAX_CONCURRENT_STREAMS", d.max_concurrent_streams, 1, 2**31 - 1
        ),
    )


def _config(env: Env) -> ConfigSettings:
    return ConfigSettings(
        type=env.get_choice(
            "CONFIG_TYPE",
            ConfigSettings().type,
            {"FILE": "FILE", "GRPC_XDS_SOTW": "GRPC_XDS_SOTW"},
            case_sensitive=True,
        ),
        force_start_without_initial_config=env.get_bool(
            "FORCE_START_WITHOUT_INITIAL_CONFIG", False
        ),
        healthy_with_at_least_one_config_loaded=env.get_bool(
            "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", False
        ),
    )


def _xds(env: Env) -> XdsSettings:
    d = XdsSettings()
    return XdsSettings(
        node_id=env.get_str("CONFIG_GRPC_XDS_NODE_ID", d.node_id),
        node_metadata=node_metadata(env.get_str("CONFIG_GRPC_XDS_NODE_METADATA")),
        server_url=env.get_str("CONFIG_GRPC_XDS_SERVER_URL", d.server_url),
        server_connect_retry_interval=env.get_duration(
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", d.server_connect_retry_interval
        ),
        client_additional_headers=env.get_map("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"),
        server_use_tls=env.get_bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", False),
        client_tls_cert=env.get_str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
        client_tls_key=env.get_str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        server_tls_cacert=env.get_str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
        server_tls_san=env.get_str("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
        backoff_initial_interval=env.get_duration(
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", d.backoff_initial_interval
        ),
        backoff_max_interval=env.get_duration(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL", d.backoff_max_interval
        ),
        backoff_random_factor=env.get_float(
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", d.backoff_random_factor
        ),
        backoff_jitter=env.get_bool("XDS_CLIENT_BACKOFF_JITTER", d.backoff_jitter),
        max_msg_size_in_bytes=env.get_int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0, lo=0),
    )


def node_metadata(value: str) -> Pairs:
    """CONFIG_GRPC_XDS_NODE_METADATA ``k1=v1,k2=v2``; items without ``=`` are skipped."""
    result: dict[str, str] = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if sep:
            result[key] = val
    return tuple(result.items())


def _runtime(env: Env) -> RuntimeSettings:
    d = RuntimeSettings()
    return RuntimeSettings(
        root=env.get_str("RUNTIME_ROOT", d.root),
        subdirectory=env.get_str("RUNTIME_SUBDIRECTORY"),
        appdirectory=env.get_str("RUNTIME_APPDIRECTORY", d.appdirectory),
        ignoredotfiles=env.get_bool("RUNTIME_IGNOREDOTFILES", d.ignoredotfiles),
        watch_root=env.get_bool("RUNTIME_WATCH_ROOT", d.watch_root),
    )


def _stats(env: Env) -> StatsSettings:
    d = StatsSettings()
    return StatsSettings(
        use_dog_statsd=env.get_bool("USE_DOG_STATSD", d.use_dog_statsd),
        dog_statsd_mogrifier_names=env.get_list("USE_DOG_STATSD_MOGRIFIERS"),
        use_statsd=env.get_bool("USE_STATSD", d.use_statsd),
        statsd_host=env.get_str("STATSD_HOST", d.statsd_host),
        statsd_port=env.get_port("STATSD_PORT", d.statsd_port),
        statsd_protocol=env.get_choice(
            "STATSD_PROTOCOL", d.statsd_protocol, {"tcp": "tcp", "udp": "udp"}, case_sensitive=True
        ),
        use_prometheus=env.get_bool("USE_PROMETHEUS", d.use_prometheus),
        prometheus_addr=env.get_str("PROMETHEUS_ADDR", d.prometheus_addr),
        prometheus_path=env.get_str("PROMETHEUS_PATH", d.prometheus_path),
        prometheus_mapper_yaml=env.get_str("PROMETHEUS_MAPPER_YAML"),
        prometheus_response_time_as_milliseconds=env.get_bool(
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", False
        ),
        extra_tags=env.get_map("EXTRA_TAGS"),
        # time.NewTicker panics on a non-positive interval, so 0 is refused here.
        flush_interval=env.get_duration("STATS_FLUSH_INTERVAL", d.flush_interval, positive=True),
        rate_limit_gauges=env.get_bool("STATS_RATE_LIMIT_GAUGES", d.rate_limit_gauges),
        max_request_series=env.get_int(
            "STATS_MAX_REQUEST_SERIES", d.max_request_series, 0, 2**31 - 1
        ),
        # At least 64: a cut key keeps more of its text than its 17-byte digest suffix.
        max_request_key_bytes=env.get_int(
            "STATS_MAX_REQUEST_KEY_BYTES", d.max_request_key_bytes, 64, 65536
        ),
        disable=env.get_bool("DISABLE_STATS", d.disable),
    )


def _cache(env: Env, backend: str, defaulted: bool) -> CacheSettings:
    d = CacheSettings()
    return CacheSettings(
        backend=backend,
        backend_defaulted=defaulted,
        expiration_jitter_max_seconds=env.get_int(
            "EXPIRATION_JITTER_MAX_SECONDS", d.expiration_jitter_max_seconds, lo=0
        ),
        local_cache_size_in_bytes=env.get_int("LOCAL_CACHE_SIZE_IN_BYTES", 0, lo=0),
        near_limit_ratio=env.get_float("NEAR_LIMIT_RATIO", d.near_limit_ratio),
        cache_key_prefix=env.get_str("CACHE_KEY_PREFIX"),
        stop_cache_key_increment_when_overlimit=env.get_bool(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", False
        ),
        failure_policy=env.get_choice("BACKEND_FAILURE_POLICY", d.failure_policy, FAILURE_POLICIES),
        breaker_failures=env.get_int("BACKEND_BREAKER_FAILURES", d.breaker_failures, lo=0),
        breaker_probe_interval=env.get_duration(
            "BACKEND_BREAKER_PROBE_INTERVAL", d.breaker_probe_interval, positive=True
        ),
        max_in_flight=env.get_int("MAX_INFLIGHT_DECISIONS", d.max_in_flight, lo=0),
        memory_max_keys=env.get_int("MEMORY_MAX_KEYS", d.memory_max_keys, 1, 2**31 - 1),
        budget_max_transactions=env.get_int(
            "BUDGET_MAX_TRANSACTIONS", d.budget_max_transactions, 1, 2**31 - 1
        ),
        memory_max_budget_transactions=env.get_int(
            "MEMORY_MAX_BUDGET_TRANSACTIONS", d.memory_max_budget_transactions, 1, 2**31 - 1
        ),
    )


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
    own: dict[str, Any] = {
        "socket_type": env.get_choice(prefix + "SOCKET_TYPE", d.socket_type, _SOCKET_TYPES),
        "type": kind,
        "url": url,
        "pool_size": env.get_int(prefix + "POOL_SIZE", d.pool_size, lo=1),
        "auth": env.get_str(prefix + "AUTH"),
        "sentinel_auth": env.get_str(prefix + "SENTINEL_AUTH"),
        "tls": env.get_bool(prefix + "TLS", d.tls),
        "pipeline_window": env.get_duration(prefix + "PIPELINE_WINDOW", d.pipeline_window),
        "pipeline_limit": env.get_int(prefix + "PIPELINE_LIMIT", d.pipeline_limit, lo=0),
        "cluster_pipeline_parallelism": env.get_int(
            prefix + "CLUSTER_PIPELINE_PARALLELISM", d.cluster_pipeline_parallelism, lo=0
        ),
        "dial_timeout": env.get_duration(prefix + "TIMEOUT", d.dial_timeout),
        "pool_on_empty_behavior": env.get_str(
            prefix + "POOL_ON_EMPTY_BEHAVIOR", d.pool_on_empty_behavior
        ).upper(),
    }
    if shared is not None:
        return dataclasses.replace(shared, **own)
    return RedisSettings(
        **own,
        tls_client_cert=env.get_str("REDIS_TLS_CLIENT_CERT"),
        tls_client_key=env.get_str("REDIS_TLS_CLIENT_KEY"),
        tls_cacert=env.get_str("REDIS_TLS_CACERT"),
        tls_skip_hostname_verification=env.get_bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", False),
        startup_initial_interval=env.get_duration(
            "REDIS_STARTUP_INITIAL_INTERVAL", d.startup_initial_interval
        ),
        startup_max_interval=env.get_duration("REDIS_STARTUP_MAX_INTERVAL", d.startup_max_interval),
        startup_max_elapsed_time=env.get_duration(
            "REDIS_STARTUP_MAX_ELAPSED_TIME", d.startup_max_elapsed_time
        ),
        health_check_active_connection=env.get_bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", False),
        request_timeout=env.get_duration("REDIS_REQUEST_TIMEOUT", d.request_timeout, positive=True),
        # One variable for both instances, as upstream #1191 reads it.
        close_connection_on_readonly=env.get_bool(
            "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR", d.close_connection_on_readonly
        ),
    )


def _memcache(env: Env) -> MemcacheSettings:
    d = MemcacheSettings()
    return MemcacheSettings(
        host_port=env.get_list("MEMCACHE_HOST_PORT"),
        srv=env.get_str("MEMCACHE_SRV"),
        srv_refresh=env.get_duration("MEMCACHE_SRV_REFRESH", d.srv_refresh),
        max_idle_conns=env.get_int("MEMCACHE_MAX_IDLE_CONNS", d.max_idle_conns, lo=0),
        tls=env.get_bool("MEMCACHE_TLS", False),
        tls_client_cert=env.get_str("MEMCACHE_TLS_CLIENT_CERT"),
        tls_client_key=env.get_str("MEMCACHE_TLS_CLIENT_KEY"),
        tls_cacert=env.get_str("MEMCACHE_TLS_CACERT"),
        tls_skip_hostname_verification=env.get_bool(
            "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", False
        ),
    )


def _tracing(env: Env) -> TracingSettings:
    d = TracingSettings()
    return TracingSettings(
        enabled=env.get_bool("TRACING_ENABLED", False),
        exporter_protocol=env.get_choice(
            "TRACING_EXPORTER_PROTOCOL", d.exporter_protocol, {"http": "http", "grpc": "grpc"}
        ),
        service_name=env.get_str("TRACING_SERVICE_NAME", d.service_name),
        service_namespace=env.get_str("TRACING_SERVICE_NAMESPACE"),
        service_instance_id=env.get_str("TRACING_SERVICE_INSTANCE_ID"),
        sampling_rate=env.get_float("TRACING_SAMPLING_RATE", d.sampling_rate, lo=0.0, hi=1.0),
    )


def _reload(env: Env) -> ReloadOptions:
    d = ReloadOptions()
    return ReloadOptions(
        shadow_mode=env.get_bool("SHADOW_MODE", False),
        quota_mode=env.get_bool("QUOTA_MODE", False),
        response_dynamic_metadata=env.get_bool("RESPONSE_DYNAMIC_METADATA", False),
        dynamic_metadata_limit_name=env.get_bool(
            "RESPONSE_DYNAMIC_METADATA_LIMIT_NAME", d.dynamic_metadata_limit_name
        ),
        response_headers=env.get_bool("LIMIT_RESPONSE_HEADERS_ENABLED", False),
        limit_header=env.get_str("LIMIT_LIMIT_HEADER", d.limit_header),
        remaining_header=env.get_str("LIMIT_REMAINING_HEADER", d.remaining_header),
        reset_header=env.get_str("LIMIT_RESET_HEADER", d.reset_header),
        headers_format=env.get_choice(
            "LIMIT_RESPONSE_HEADERS_FORMAT", d.headers_format, _HEADER_FORMATS
        ),
        all_descriptors_headers=env.get_bool(
            "LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED", d.all_descriptors_headers
        ),
        request_headers=env.get_bool("LIMIT_REQUEST_HEADERS_ENABLED", False),
        request_limit_header=env.get_str("LIMIT_REQUEST_LIMIT_HEADER", d.request_limit_header),
        request_remaining_header=env.get_str(
            "LIMIT_REQUEST_REMAINING_HEADER", d.request_remaining_header
        ),
        request_reset_header=env.get_str("LIMIT_REQUEST_RESET_HEADER", d.request_reset_header),
        merge_domain_config=env.get_bool("MERGE_DOMAIN_CONFIG", False),
        max_descriptors=env.get_int("MAX_DESCRIPTORS_PER_REQUEST", d.max_descriptors, 1, 2**31 - 1),
        max_entries=env.get_int("MAX_ENTRIES_PER_DESCRIPTOR", d.max_entries, 1, 2**31 - 1),
        max_value_length=env.get_int(
            "MAX_DESCRIPTOR_VALUE_LENGTH", d.max_value_length, 1, 2**31 - 1
        ),
        domain_algorithms=_domain_algorithms(env.get_str("DOMAIN_DEFAULT_ALGORITHMS")),
    )


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


def _quota(env: Env) -> QuotaSettings:
    d = QuotaSettings()
    return QuotaSettings(
        bucket_keys=env.get_list("RLQS_BUCKET_KEYS"),
        assignment_ttl=env.get_duration("RLQS_ASSIGNMENT_TTL", d.assignment_ttl, positive=True),
        report_interval=env.get_duration("RLQS_REPORT_INTERVAL", d.report_interval, positive=True),
        max_buckets_per_stream=env.get_int(
            "RLQS_MAX_BUCKETS_PER_STREAM", d.max_buckets_per_stream, lo=1
        ),
        max_buckets=env.get_int("RLQS_MAX_BUCKETS", d.max_buckets, lo=1),
        max_streams=env.get_int("RLQS_MAX_STREAMS", d.max_streams, lo=1),
        idle_timeout=env.get_duration("RLQS_IDLE_TIMEOUT", d.idle_timeout, positive=True),
    )
