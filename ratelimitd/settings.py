"""Process settings: one frozen :class:`Settings` built from the environment.

This module is the only reader of the process environment in the package. Names, defaults and
parsing follow envoyproxy/ratelimit (``src/settings/settings.go``, envconfig) so existing
deployments move over unchanged:

* booleans use Go ``strconv.ParseBool`` (``1 t T TRUE true True`` / ``0 f F FALSE false False``);
* integers use Go ``strconv.ParseInt(s, 0, 64)`` (``8080``, ``0x1F90``, ``017``, ``1_000``);
* durations use Go ``time.ParseDuration`` (``10s``, ``150us``, ``1h30m``, ``0``) and are stored
  as float seconds;
* maps are ``k1:v1,k2:v2`` and are stored as tuples of ``(key, value)`` pairs; lists are comma
  separated and stored as tuples.

An invalid value raises :class:`SettingsError` whose message is one line naming the variable,
the bad value and what is accepted; the daemon prints it and exits.

Deliberate differences from the reference, all more lenient or safer:

* A variable that is set but empty takes its default when the setting is a number, boolean,
  duration or enumeration (envconfig would fail to parse ``""``). Plain strings (paths, URLs,
  names) keep the empty value, as in the reference.
* List items and map keys/values are stripped of surrounding blanks and empty list items are
  dropped; a map item is split at its first ``:`` so a value may itself contain ``:``.
* Aliases: every ``KVCACHE_<X>`` variable is accepted as ``REDIS_<X>`` and every ``ALTCACHE_<X>``
  as ``MEMCACHE_<X>`` (the spellings of the service specification). When both spellings are
  set, the ``REDIS_`` / ``MEMCACHE_`` one wins. ``BACKEND_TYPE=altcache`` means ``memcache`` and
  ``BACKEND_TYPE=kvcache`` means ``redis``.
* ``BACKEND_TYPE`` also accepts ``memory`` (in-process counters, one process only). When
  ``BACKEND_TYPE`` is unset or empty and no ``REDIS_*`` / ``MEMCACHE_*`` variable (or alias) has
  a non-empty value, the backend is ``memory`` and :attr:`Settings.backend_defaulted` is true so
  the daemon can log that choice. Otherwise an unset ``BACKEND_TYPE`` means ``redis``, the
  reference default.
* Two enabled stats sinks (``USE_DOG_STATSD``, ``USE_STATSD``, ``USE_PROMETHEUS``) are reported
  here as a :class:`SettingsError` instead of a fatal log line at sink creation.
* ``REDIS_*`` structural checks (sentinel ``REDIS_URL`` shape) and ``MEMCACHE_*`` ones
  (``MEMCACHE_HOST_PORT`` with ``MEMCACHE_SRV``, the SRV name shape) run only when that backend
  is selected, as the reference only checks them when it builds that client.

Extensions (not in the reference):

* ``RATELIMITD_WORKERS`` (integer >= 1, default 1): number of worker processes sharing the
  listening ports with SO_REUSEPORT. The supervisor gives each worker
  ``RATELIMITD_WORKER_INDEX`` and, with the Prometheus sink, ``RATELIMITD_STATS_DIR`` (where
  workers publish their totals so any worker's endpoint serves the sum); they are not meant
  to be set by hand.
* ``REDIS_REQUEST_TIMEOUT`` (Go duration, default ``50ms``): the longest a request waits for its
  Redis replies before failing like a Redis error; applies to the main and per-second
  instances. ``REDIS_TIMEOUT`` stays the dial timeout, as in the reference.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DogStatsdMogrifier",
    "ReloadOverrides",
    "Settings",
    "SettingsError",
    "env_overrides_on_reload",
    "mask_url",
    "parse_go_bool",
    "parse_go_duration",
    "parse_go_int",
    "redis_auth",
]

StatsSink = Literal["null", "dogstatsd", "statsd", "prometheus", "stdout"]
Pairs = tuple[tuple[str, str], ...]

_BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_BOOL_ACCEPTED = "accepted: 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False"
_DURATION_EXPECTED = "expected a Go duration >= 0 such as 10s, 150us, 1h30m or 0"

# Nanoseconds per Go duration unit; both micro signs are accepted by time.ParseDuration.
_DURATION_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_MAX_DURATION_NS = (1 << 63) - 1

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
_BACKENDS = {
    "redis": "redis",
    "kvcache": "redis",
    "memcache": "memcache",
    "altcache": "memcache",
    "memory": "memory",
}
_SOCKET_TYPES = {"tcp": "tcp", "unix": "unix"}
_REDIS_TYPES = {"single": "single", "sentinel": "sentinel", "cluster": "cluster"}
_ALIAS_PREFIXES = (("KVCACHE_", "REDIS_"), ("ALTCACHE_", "MEMCACHE_"))
_BACKEND_PREFIXES = ("REDIS_", "MEMCACHE_")
_MEMCACHE_SRV = re.compile(r"^_(.+?)\._(.+?)\.(.+)$")
_SINK_VARIABLES = ("USE_DOG_STATSD", "USE_STATSD", "USE_PROMETHEUS")


class SettingsError(ValueError):
    """An environment variable holds a value the daemon cannot start with."""


def _invalid(name: str, value: str, accepted: str) -> SettingsError:
    # repr() keeps the message on one line whatever the value contains.
    return SettingsError(f"{name}: invalid value {value!r} ({accepted})")


def parse_go_bool(value: str) -> bool:
    """Parse a boolean as Go's strconv.ParseBool does; raise ValueError otherwise."""
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    raise ValueError(f"invalid boolean {value!r}")


def parse_go_int(value: str) -> int:
    """Parse an integer as Go's strconv.ParseInt(s, 0, 64) does; raise ValueError otherwise."""
    if not value.isascii() or value != value.strip():
        raise ValueError(f"invalid integer {value!r}")
    sign, body = (value[0], value[1:]) if value[:1] in ("+", "-") else ("", value)
    if not body or body[0] in ("+", "-"):
        raise ValueError(f"invalid integer {value!r}")
    if len(body) > 1 and body[0] == "0" and body[1] not in "xXoObB":
        # Go reads a bare leading zero as octal ("017" == 15); Python's int(s, 0) refuses it.
        body = "0o" + body[1:]
    result = int(sign + body, 0)
    if not -(1 << 63) <= result < (1 << 63):
        raise ValueError(f"integer out of range {value!r}")
    return result


def parse_go_duration(value: str) -> float:
    """Parse a Go time.ParseDuration string (``10s``, ``150us``, ``1h30m``) into seconds."""
    text = value
    negative = False
    if text[:1] in ("-", "+"):
        negative = text[0] == "-"
        text = text[1:]
    if text == "0":
        return 0.0
    if not text:
        raise ValueError(f"invalid duration {value!r}")
    total = 0
    pos = 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        assert match is not None  # every part of the pattern is optional
        whole, frac, unit = match.groups()
        if not whole and not frac:
            raise ValueError(f"invalid duration {value!r}")
        if not unit:
            raise ValueError(f"missing unit in duration {value!r}")
        scale = _DURATION_UNITS.get(unit)
        if scale is None:
            raise ValueError(f"unknown unit {unit!r} in duration {value!r}")
        part = int(whole or "0") * scale
        if frac:
            part += int(frac) * scale // 10 ** len(frac)
        total += part
        if total > _MAX_DURATION_NS:
            raise ValueError(f"invalid duration {value!r}")
        pos = match.end()
    return -total / 1e9 if negative else total / 1e9


def mask_url(url: str) -> str:
    """Mask credentials in a (comma-separated) Redis URL as the reference logs it."""
    items = url.split(",")
    for index, item in enumerate(items):
        scheme, sep, rest = item.partition("://")
        # The reference masks only redis://; rediss:// and unix:// carry passwords the same way.
        if sep and scheme in ("redis", "rediss", "unix") and "@" in rest:
            items[index] = f"{scheme}://*****@{rest.rsplit('@', 1)[1]}"
    return ",".join(items)


def redis_auth(auth: str) -> tuple[str | None, str | None]:
    """Split REDIS_AUTH (``password`` or ``user:password``) into (username, password)."""
    if not auth:
        return None, None
    user, sep, password = auth.partition(":")
    if not sep:
        return None, auth
    return user, password


@dataclass(frozen=True, slots=True)
class DogStatsdMogrifier:
    """One DOG_STATSD_MOGRIFIER_<NAME>_* rule: a regex, a metric name and tag templates."""

    name: str
    pattern: str
    metric_name: str
    tags: Pairs = ()

    @property
    def regex(self) -> re.Pattern[str]:
        """The compiled pattern (the re module caches compilations)."""
        return re.compile(self.pattern)


@dataclass(frozen=True, slots=True)
class ReloadOverrides:
    """Settings the reference re-reads from the environment on every config (re)load."""

    shadow_mode: bool = False
    quota_mode: bool = False
    response_dynamic_metadata: bool = False
    limit_response_headers_enabled: bool = False
    limit_limit_header: str = "RateLimit-Limit"
    limit_remaining_header: str = "RateLimit-Remaining"
    limit_reset_header: str = "RateLimit-Reset"
    merge_domain_config: bool = False


class _Env:
    """Typed lookups over one snapshot of the environment (aliases already applied)."""

    __slots__ = ("env",)

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def typed(self, name: str) -> str | None:
        value = self.env.get(name)
        return value if value else None

    def get_str(self, name: str, default: str = "") -> str:
        value = self.env.get(name)
        return default if value is None else value

    def get_bool(self, name: str, default: bool) -> bool:
        value = self.typed(name)
        if value is None:
            return default
        try:
            return parse_go_bool(value)
        except ValueError:
            raise _invalid(name, value, _BOOL_ACCEPTED) from None

    def get_int(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value = self.typed(name)
        if value is None:
            return default
        if lo is not None and hi is not None:
            expected = f"expected an integer {lo}-{hi}"
        elif lo is not None:
            expected = f"expected an integer >= {lo}"
        else:
            expected = "expected an integer"
        try:
            result = parse_go_int(value)
        except ValueError:
            raise _invalid(name, value, expected) from None
        if (lo is not None and result < lo) or (hi is not None and result > hi):
            raise _invalid(name, value, expected)
        return result

    def get_port(self, name: str, default: int) -> int:
        return self.get_int(name, default, 0, 65535)

    def get_float(
        self, name: str, default: float, lo: float | None = None, hi: float | None = None
    ) -> float:
        value = self.typed(name)
        if value is None:
            return default
        if lo is not None and hi is not None:
            expected = f"expected a number between {lo:g} and {hi:g}"
        else:
            expected = "expected a number"
        try:
            if not value.isascii() or value != value.strip():
                raise ValueError(value)
            result = float(value)
        except ValueError:
            raise _invalid(name, value, expected) from None
        if not math.isfinite(result):
            raise _invalid(name, value, expected)
        if (lo is not None and result < lo) or (hi is not None and result > hi):
            raise _invalid(name, value, expected)
        return result

    def get_duration(self, name: str, default: float, positive: bool = False) -> float:
        value = self.typed(name)
        if value is None:
            return default
        expected = _DURATION_EXPECTED.replace(">= 0", "> 0") if positive else _DURATION_EXPECTED
        try:
            result = parse_go_duration(value)
        except ValueError:
            raise _invalid(name, value, expected) from None
        if result < 0 or (positive and result == 0):
            raise _invalid(name, value, expected)
        return result

    def get_choice(
        self,
        name: str,
        default: str,
        choices: Mapping[str, str],
        case_sensitive: bool = False,
        accepted: str = "",
    ) -> str:
        value = self.typed(name)
        if value is None:
            return default
        key = value if case_sensitive else value.lower()
        if key not in choices:
            accepted = accepted or ", ".join(choices)
            raise _invalid(name, value, f"accepted: {accepted}")
        return choices[key]

    def get_list(self, name: str) -> tuple[str, ...]:
        value = self.env.get(name, "")
        return tuple(item.strip() for item in value.split(",") if item.strip())

    def get_map(self, name: str, separator: str = ":") -> Pairs:
        value = self.env.get(name, "")
        result: dict[str, str] = {}
        for item in value.split(","):
            if not item.strip():
                continue
            key, sep, val = item.partition(separator)
            if not sep:
                raise _invalid(name, value, f"expected k1{separator}v1,k2{separator}v2")
            result[key.strip()] = val.strip()
        return tuple(result.items())


def _apply_aliases(environ: Mapping[str, str]) -> dict[str, str]:
    env = dict(environ)
    for key, value in environ.items():
        for alias, canonical in _ALIAS_PREFIXES:
            if key.startswith(alias):
                # setdefault: the canonical REDIS_/MEMCACHE_ spelling wins when both are set.
                env.setdefault(canonical + key[len(alias) :], value)
    return env


def _reload_overrides(env: _Env) -> ReloadOverrides:
    return ReloadOverrides(
        shadow_mode=env.get_bool("SHADOW_MODE", False),
        quota_mode=env.get_bool("QUOTA_MODE", False),
        response_dynamic_metadata=env.get_bool("RESPONSE_DYNAMIC_METADATA", False),
        limit_response_headers_enabled=env.get_bool("LIMIT_RESPONSE_HEADERS_ENABLED", False),
        limit_limit_header=env.get_str("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
        limit_remaining_header=env.get_str("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
        limit_reset_header=env.get_str("LIMIT_RESET_HEADER", "RateLimit-Reset"),
        merge_domain_config=env.get_bool("MERGE_DOMAIN_CONFIG", False),
    )


def env_overrides_on_reload(environ: Mapping[str, str] | None = None) -> ReloadOverrides:
    """Re-read the settings the reference refreshes on every config reload."""
    return _reload_overrides(_Env(os.environ if environ is None else environ))


def _mogrifiers(env: _Env, names: Iterable[str]) -> tuple[DogStatsdMogrifier, ...]:
    result = []
    for raw_name in names:
        name = raw_name.upper()  # envconfig upper-cases the prefixed variable names
        prefix = f"DOG_STATSD_MOGRIFIER_{name}_"
        pattern = env.get_str(prefix + "PATTERN")
        if not pattern:
            raise _invalid(prefix + "PATTERN", pattern, "expected a non-empty regular expression")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _invalid(
                prefix + "PATTERN", pattern, f"not a valid regular expression: {exc}"
            ) from None
        metric_name = env.get_str(prefix + "NAME")
        if not metric_name:
            raise _invalid(prefix + "NAME", metric_name, "expected a non-empty metric name")
        tags = env.get_map(prefix + "TAGS")
        for key, value in tags:
            if not key or not value:
                raw = env.get_str(prefix + "TAGS")
                raise _invalid(prefix + "TAGS", raw, "expected non-empty tag:$N pairs")
        result.append(DogStatsdMogrifier(name, pattern, metric_name, tags))
    return tuple(result)


def _check_sentinel_url(name: str, url: str) -> None:
    if len(url.split(",")) < 2:
        raise _invalid(name, mask_url(url), "a sentinel URL is 'master,host:port[,host:port...]'")


@dataclass(frozen=True, slots=True)
class Settings:
    """How the process runs: every setting of the reference plus a few extensions."""

    # Listeners.
    host: str = "0.0.0.0"
    port: int = 8080
    debug_host: str = "0.0.0.0"
    debug_port: int = 6070
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 8081
    grpc_uds: str = ""
    grpc_max_connection_age: float = 24 * 3600.0
    grpc_max_connection_age_grace: float = 3600.0
    grpc_server_use_tls: bool = False
    grpc_server_tls_cert: str = ""
    grpc_server_tls_key: str = ""
    grpc_client_tls_cacert: str = ""
    grpc_client_tls_san: str = ""

    # Logging: log_level is the canonical logrus name, log_format is "text" or "json".
    log_level: str = "warning"
    log_format: str = "text"

    # Configuration source.
    config_type: str = "FILE"
    force_start_without_initial_config: bool = False
    config_grpc_xds_node_id: str = "default"
    config_grpc_xds_node_metadata: Pairs = ()
    config_grpc_xds_server_url: str = "localhost:18000"
    config_grpc_xds_server_connect_retry_interval: float = 3.0
    config_grpc_xds_client_additional_headers: Pairs = ()
    config_grpc_xds_server_use_tls: bool = False
    config_grpc_xds_client_tls_cert: str = ""
    config_grpc_xds_client_tls_key: str = ""
    config_grpc_xds_server_tls_cacert: str = ""
    config_grpc_xds_server_tls_san: str = ""
    xds_client_backoff_initial_interval: float = 10.0
    xds_client_backoff_max_interval: float = 60.0
    xds_client_backoff_random_factor: float = 0.5
    xds_client_backoff_jitter: bool = True
    xds_client_max_msg_size_in_bytes: int = 0

    # Statistics.
    use_statsd: bool = True
    statsd_host: str = "localhost"
    statsd_port: int = 8125
    use_dog_statsd: bool = False
    use_dog_statsd_mogrifiers: tuple[str, ...] = ()
    dog_statsd_mogrifiers: tuple[DogStatsdMogrifier, ...] = ()
    use_prometheus: bool = False
    prometheus_addr: str = ":9090"
    prometheus_path: str = "/metrics"
    prometheus_mapper_yaml: str = ""
    prometheus_response_time_as_milliseconds: bool = False
    extra_tags: Pairs = ()
    stats_flush_interval: float = 10.0
    disable_stats: bool = False

    # File provider (goruntime).
    runtime_root: str = "/srv/runtime_data/current"
    runtime_subdirectory: str = ""
    runtime_appdirectory: str = "config"
    runtime_ignoredotfiles: bool = False
    runtime_watch_root: bool = True

    # All cache types.
    expiration_jitter_max_seconds: int = 300
    local_cache_size_in_bytes: int = 0
    near_limit_ratio: float = 0.8  # float32 in the reference; keys/limiter round as needed
    cache_key_prefix: str = ""
    backend_type: str = "redis"
    backend_defaulted: bool = False
    stop_cache_key_increment_when_overlimit: bool = False

    # Response headers, health.
    limit_response_headers_enabled: bool = False
    limit_limit_header: str = "RateLimit-Limit"
    limit_remaining_header: str = "RateLimit-Remaining"
    limit_reset_header: str = "RateLimit-Reset"
    healthy_with_at_least_one_config_loaded: bool = False

    # Redis (main instance); redis_type and redis_socket_type are lower-case.
    redis_socket_type: str = "unix"
    redis_type: str = "single"
    redis_url: str = "/var/run/nutcracker/ratelimit.sock"
    redis_pool_size: int = 10
    redis_auth: str = ""
    redis_sentinel_auth: str = ""
    redis_tls: bool = False
    redis_tls_client_cert: str = ""
    redis_tls_client_key: str = ""
    redis_tls_cacert: str = ""
    redis_tls_skip_hostname_verification: bool = False
    redis_pipeline_window: float = 0.0
    redis_pipeline_limit: int = 0
    redis_cluster_pipeline_parallelism: int = 1
    redis_timeout: float = 10.0
    redis_pool_on_empty_behavior: str = "WAIT"
    redis_startup_initial_interval: float = 1.0
    redis_startup_max_interval: float = 30.0
    redis_startup_max_elapsed_time: float = 0.0
    redis_health_check_active_connection: bool = False
    redis_request_timeout: float = 0.05

    # Redis per-second instance (shares the REDIS_TLS_* files and the health-check flag).
    redis_persecond: bool = False
    redis_persecond_socket_type: str = "unix"
    redis_persecond_type: str = "single"
    redis_persecond_url: str = "/var/run/nutcracker/ratelimitpersecond.sock"
    redis_persecond_pool_size: int = 10
    redis_persecond_auth: str = ""
    redis_persecond_sentinel_auth: str = ""
    redis_persecond_tls: bool = False
    redis_persecond_pipeline_window: float = 0.0
    redis_persecond_pipeline_limit: int = 0
    redis_persecond_cluster_pipeline_parallelism: int = 1
    redis_persecond_timeout: float = 10.0
    redis_persecond_pool_on_empty_behavior: str = "WAIT"

    # Memcached.
    memcache_host_port: tuple[str, ...] = ()
    memcache_srv: str = ""
    memcache_srv_refresh: float = 0.0
    memcache_max_idle_conns: int = 2
    memcache_tls: bool = False
    memcache_tls_client_cert: str = ""
    memcache_tls_client_key: str = ""
    memcache_tls_cacert: str = ""
    memcache_tls_skip_hostname_verification: bool = False

    # Global modes (re-read on every config reload, see env_overrides_on_reload).
    shadow_mode: bool = False
    quota_mode: bool = False
    response_dynamic_metadata: bool = False
    merge_domain_config: bool = False

    # Tracing (OTLP); an empty instance id means "random UUID v4", chosen by the tracing layer.
    tracing_enabled: bool = False
    tracing_exporter_protocol: str = "http"
    tracing_service_name: str = "RateLimit"
    tracing_service_namespace: str = ""
    tracing_service_instance_id: str = ""
    tracing_sampling_rate: float = 1.0

    # Extensions.
    ratelimitd_workers: int = 1
    ratelimitd_worker_index: int | None = None
    ratelimitd_stats_dir: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build Settings from the environment (default os.environ); raise SettingsError."""
        raw = os.environ if environ is None else environ
        env = _Env(_apply_aliases(raw))
        backend, defaulted = _backend(env)
        use_dog_statsd = env.get_bool("USE_DOG_STATSD", False)
        mogrifier_names = env.get_list("USE_DOG_STATSD_MOGRIFIERS")
        reload = _reload_overrides(env)
        settings = cls(
            host=env.get_str("HOST", "0.0.0.0"),
            port=env.get_port("PORT", 8080),
            debug_host=env.get_str("DEBUG_HOST", "0.0.0.0"),
            debug_port=env.get_port("DEBUG_PORT", 6070),
            grpc_host=env.get_str("GRPC_HOST", "0.0.0.0"),
            grpc_port=env.get_port("GRPC_PORT", 8081),
            grpc_uds=env.get_str("GRPC_UDS"),
            grpc_max_connection_age=env.get_duration("GRPC_MAX_CONNECTION_AGE", 24 * 3600.0),
            grpc_max_connection_age_grace=env.get_duration("GRPC_MAX_CONNECTION_AGE_GRACE", 3600.0),
            grpc_server_use_tls=env.get_bool("GRPC_SERVER_USE_TLS", False),
            grpc_server_tls_cert=env.get_str("GRPC_SERVER_TLS_CERT"),
            grpc_server_tls_key=env.get_str("GRPC_SERVER_TLS_KEY"),
            grpc_client_tls_cacert=env.get_str("GRPC_CLIENT_TLS_CACERT"),
            grpc_client_tls_san=env.get_str("GRPC_CLIENT_TLS_SAN"),
            log_level=env.get_choice("LOG_LEVEL", "warning", _LOG_LEVELS),
            # The reference switches to JSON on "json" (any case) and uses text otherwise.
            log_format="json" if env.get_str("LOG_FORMAT", "text").lower() == "json" else "text",
            config_type=env.get_choice(
                "CONFIG_TYPE",
                "FILE",
                {"FILE": "FILE", "GRPC_XDS_SOTW": "GRPC_XDS_SOTW"},
                case_sensitive=True,
            ),
            force_start_without_initial_config=env.get_bool(
                "FORCE_START_WITHOUT_INITIAL_CONFIG", False
            ),
            config_grpc_xds_node_id=env.get_str("CONFIG_GRPC_XDS_NODE_ID", "default"),
            config_grpc_xds_node_metadata=_node_metadata(
                env.get_str("CONFIG_GRPC_XDS_NODE_METADATA")
            ),
            config_grpc_xds_server_url=env.get_str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
            config_grpc_xds_server_connect_retry_interval=env.get_duration(
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", 3.0
            ),
            config_grpc_xds_client_additional_headers=env.get_map(
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"
            ),
            config_grpc_xds_server_use_tls=env.get_bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", False),
            config_grpc_xds_client_tls_cert=env.get_str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            config_grpc_xds_client_tls_key=env.get_str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
            config_grpc_xds_server_tls_cacert=env.get_str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
            config_grpc_xds_server_tls_san=env.get_str("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
            xds_client_backoff_initial_interval=env.get_duration(
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10.0
            ),
            xds_client_backoff_max_interval=env.get_duration(
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL", 60.0
            ),
            xds_client_backoff_random_factor=env.get_float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", 0.5),
            xds_client_backoff_jitter=env.get_bool("XDS_CLIENT_BACKOFF_JITTER", True),
            xds_client_max_msg_size_in_bytes=env.get_int(
                "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0, lo=0
            ),
            use_statsd=env.get_bool("USE_STATSD", True),
            statsd_host=env.get_str("STATSD_HOST", "localhost"),
            statsd_port=env.get_port("STATSD_PORT", 8125),
            use_dog_statsd=use_dog_statsd,
            use_dog_statsd_mogrifiers=mogrifier_names,
            use_prometheus=env.get_bool("USE_PROMETHEUS", False),
            prometheus_addr=env.get_str("PROMETHEUS_ADDR", ":9090"),
            prometheus_path=env.get_str("PROMETHEUS_PATH", "/metrics"),
            prometheus_mapper_yaml=env.get_str("PROMETHEUS_MAPPER_YAML"),
            prometheus_response_time_as_milliseconds=env.get_bool(
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", False
            ),
            extra_tags=env.get_map("EXTRA_TAGS"),
            # time.NewTicker panics on a non-positive interval, so 0 is refused here.
            stats_flush_interval=env.get_duration("STATS_FLUSH_INTERVAL", 10.0, positive=True),
            disable_stats=env.get_bool("DISABLE_STATS", False),
            runtime_root=env.get_str("RUNTIME_ROOT", "/srv/runtime_data/current"),
            runtime_subdirectory=env.get_str("RUNTIME_SUBDIRECTORY"),
            runtime_appdirectory=env.get_str("RUNTIME_APPDIRECTORY", "config"),
            runtime_ignoredotfiles=env.get_bool("RUNTIME_IGNOREDOTFILES", False),
            runtime_watch_root=env.get_bool("RUNTIME_WATCH_ROOT", True),
            expiration_jitter_max_seconds=env.get_int("EXPIRATION_JITTER_MAX_SECONDS", 300, lo=0),
            local_cache_size_in_bytes=env.get_int("LOCAL_CACHE_SIZE_IN_BYTES", 0, lo=0),
            near_limit_ratio=env.get_float("NEAR_LIMIT_RATIO", 0.8),
            cache_key_prefix=env.get_str("CACHE_KEY_PREFIX"),
            backend_type=backend,
            backend_defaulted=defaulted,
            stop_cache_key_increment_when_overlimit=env.get_bool(
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", False
            ),
            limit_response_headers_enabled=reload.limit_response_headers_enabled,
            limit_limit_header=reload.limit_limit_header,
            limit_remaining_header=reload.limit_remaining_header,
            limit_reset_header=reload.limit_reset_header,
            healthy_with_at_least_one_config_loaded=env.get_bool(
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", False
            ),
            redis_socket_type=env.get_choice("REDIS_SOCKET_TYPE", "unix", _SOCKET_TYPES),
            redis_type=env.get_choice("REDIS_TYPE", "single", _REDIS_TYPES),
            redis_url=env.get_str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
            redis_pool_size=env.get_int("REDIS_POOL_SIZE", 10, lo=1),
            redis_auth=env.get_str("REDIS_AUTH"),
            redis_sentinel_auth=env.get_str("REDIS_SENTINEL_AUTH"),
            redis_tls=env.get_bool("REDIS_TLS", False),
            redis_tls_client_cert=env.get_str("REDIS_TLS_CLIENT_CERT"),
            redis_tls_client_key=env.get_str("REDIS_TLS_CLIENT_KEY"),
            redis_tls_cacert=env.get_str("REDIS_TLS_CACERT"),
            redis_tls_skip_hostname_verification=env.get_bool(
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", False
            ),
            redis_pipeline_window=env.get_duration("REDIS_PIPELINE_WINDOW", 0.0),
            redis_pipeline_limit=env.get_int("REDIS_PIPELINE_LIMIT", 0, lo=0),
            redis_cluster_pipeline_parallelism=env.get_int(
                "REDIS_CLUSTER_PIPELINE_PARALLELISM", 1, lo=0
            ),
            redis_timeout=env.get_duration("REDIS_TIMEOUT", 10.0),
            redis_pool_on_empty_behavior=env.get_str(
                "REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT"
            ).upper(),
            redis_startup_initial_interval=env.get_duration("REDIS_STARTUP_INITIAL_INTERVAL", 1.0),
            redis_startup_max_interval=env.get_duration("REDIS_STARTUP_MAX_INTERVAL", 30.0),
            redis_startup_max_elapsed_time=env.get_duration("REDIS_STARTUP_MAX_ELAPSED_TIME", 0.0),
            redis_health_check_active_connection=env.get_bool(
                "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", False
            ),
            redis_request_timeout=env.get_duration("REDIS_REQUEST_TIMEOUT", 0.05, positive=True),
            redis_persecond=env.get_bool("REDIS_PERSECOND", False),
            redis_persecond_socket_type=env.get_choice(
                "REDIS_PERSECOND_SOCKET_TYPE", "unix", _SOCKET_TYPES
            ),
            redis_persecond_type=env.get_choice("REDIS_PERSECOND_TYPE", "single", _REDIS_TYPES),
            redis_persecond_url=env.get_str(
                "REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock"
            ),
            redis_persecond_pool_size=env.get_int("REDIS_PERSECOND_POOL_SIZE", 10, lo=1),
            redis_persecond_auth=env.get_str("REDIS_PERSECOND_AUTH"),
            redis_persecond_sentinel_auth=env.get_str("REDIS_PERSECOND_SENTINEL_AUTH"),
            redis_persecond_tls=env.get_bool("REDIS_PERSECOND_TLS", False),
            redis_persecond_pipeline_window=env.get_duration(
                "REDIS_PERSECOND_PIPELINE_WINDOW", 0.0
            ),
            redis_persecond_pipeline_limit=env.get_int("REDIS_PERSECOND_PIPELINE_LIMIT", 0, lo=0),
            redis_persecond_cluster_pipeline_parallelism=env.get_int(
                "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", 1, lo=0
            ),
            redis_persecond_timeout=env.get_duration("REDIS_PERSECOND_TIMEOUT", 10.0),
            redis_persecond_pool_on_empty_behavior=env.get_str(
                "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT"
            ).upper(),
            memcache_host_port=env.get_list("MEMCACHE_HOST_PORT"),
            memcache_srv=env.get_str("MEMCACHE_SRV"),
            memcache_srv_refresh=env.get_duration("MEMCACHE_SRV_REFRESH", 0.0),
            memcache_max_idle_conns=env.get_int("MEMCACHE_MAX_IDLE_CONNS", 2, lo=0),
            memcache_tls=env.get_bool("MEMCACHE_TLS", False),
            memcache_tls_client_cert=env.get_str("MEMCACHE_TLS_CLIENT_CERT"),
            memcache_tls_client_key=env.get_str("MEMCACHE_TLS_CLIENT_KEY"),
            memcache_tls_cacert=env.get_str("MEMCACHE_TLS_CACERT"),
            memcache_tls_skip_hostname_verification=env.get_bool(
                "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", False
            ),
            shadow_mode=reload.shadow_mode,
            quota_mode=reload.quota_mode,
            response_dynamic_metadata=reload.response_dynamic_metadata,
            merge_domain_config=reload.merge_domain_config,
            tracing_enabled=env.get_bool("TRACING_ENABLED", False),
            tracing_exporter_protocol=env.get_choice(
                "TRACING_EXPORTER_PROTOCOL", "http", {"http": "http", "grpc": "grpc"}
            ),
            tracing_service_name=env.get_str("TRACING_SERVICE_NAME", "RateLimit"),
            tracing_service_namespace=env.get_str("TRACING_SERVICE_NAMESPACE"),
            tracing_service_instance_id=env.get_str("TRACING_SERVICE_INSTANCE_ID"),
            tracing_sampling_rate=env.get_float("TRACING_SAMPLING_RATE", 1.0, lo=0.0, hi=1.0),
            ratelimitd_workers=env.get_int("RATELIMITD_WORKERS", 1, lo=1),
            ratelimitd_worker_index=(
                env.get_int("RATELIMITD_WORKER_INDEX", 0, lo=0)
                if env.get_str("RATELIMITD_WORKER_INDEX")
                else None
            ),
            ratelimitd_stats_dir=env.get_str("RATELIMITD_STATS_DIR"),
        )
        settings._check(env)
        if settings.stats_sink == "dogstatsd" and mogrifier_names:
            # As the reference, mogrifiers are read only when the DogStatsD sink is built.
            settings = dataclasses.replace(
                settings, dog_statsd_mogrifiers=_mogrifiers(env, mogrifier_names)
            )
        return settings

    def _check(self, env: _Env) -> None:
        """Cross-field checks that the reference makes when it builds the sinks and clients."""
        if not self.disable_stats:
            enabled = [
                name
                for name, on in zip(
                    _SINK_VARIABLES,
                    (self.use_dog_statsd, self.use_statsd, self.use_prometheus),
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
        if self.backend_type == "redis":
            if self.redis_type == "sentinel":
                _check_sentinel_url("REDIS_URL", self.redis_url)
            if self.redis_persecond and self.redis_persecond_type == "sentinel":
                _check_sentinel_url("REDIS_PERSECOND_URL", self.redis_persecond_url)
        elif self.backend_type == "memcache":
            if self.memcache_host_port and self.memcache_srv:
                values = (
                    f"MEMCACHE_HOST_PORT={env.get_str('MEMCACHE_HOST_PORT')}, "
                    f"MEMCACHE_SRV={self.memcache_srv}"
                )
                raise SettingsError(
                    f"MEMCACHE_HOST_PORT, MEMCACHE_SRV: invalid combination {values!r} "
                    "(accepted: only one of MEMCACHE_HOST_PORT, MEMCACHE_SRV)"
                )
            if self.memcache_srv and not _MEMCACHE_SRV.match(self.memcache_srv):
                raise _invalid("MEMCACHE_SRV", self.memcache_srv, "expected _service._proto.name")

    @property
    def stats_sink(self) -> StatsSink:
        """The stats sink the reference's runner would build: null, dogstatsd, statsd, ..."""
        if self.disable_stats:
            return "null"
        if self.use_dog_statsd:
            return "dogstatsd"
        if self.use_statsd:
            return "statsd"
        if self.use_prometheus:
            return "prometheus"
        return "stdout"

    @property
    def reload_overrides(self) -> ReloadOverrides:
        """The current values of the settings that are re-read on config reload."""
        return ReloadOverrides(
            shadow_mode=self.shadow_mode,
            quota_mode=self.quota_mode,
            response_dynamic_metadata=self.response_dynamic_metadata,
            limit_response_headers_enabled=self.limit_response_headers_enabled,
            limit_limit_header=self.limit_limit_header,
            limit_remaining_header=self.limit_remaining_header,
            limit_reset_header=self.limit_reset_header,
            merge_domain_config=self.merge_domain_config,
        )

    def with_reload_overrides(self, overrides: ReloadOverrides) -> Settings:
        """Return a copy with the reload-time values applied."""
        return dataclasses.replace(
            self, **{f.name: getattr(overrides, f.name) for f in dataclasses.fields(overrides)}
        )


def _backend(env: _Env) -> tuple[str, bool]:
    """The backend name and whether it was chosen because nothing was configured."""
    if env.typed("BACKEND_TYPE") is not None:
        # The aliases are accepted but not advertised: the spec spells them, users rarely do.
        return env.get_choice(
            "BACKEND_TYPE", "redis", _BACKENDS, accepted="redis, memcache, memory"
        ), False
    configured = any(value and key.startswith(_BACKEND_PREFIXES) for key, value in env.env.items())
    return ("redis", False) if configured else ("memory", True)


def _node_metadata(value: str) -> Pairs:
    # As the xDS provider: "k1=v1,k2=v2", items without "=" are skipped silently.
    result: dict[str, str] = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if sep:
            result[key] = val
    return tuple(result.items())
