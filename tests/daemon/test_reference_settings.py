"""Every environment variable of the reference either works or is refused at start-up.

`REFERENCE` is the reference's full settings list: ``src/settings/settings.go`` at f2fb157,
the DogStatsD mogrifier variables (``src/godogstats``), the settings merged upstream after
f2fb157 (listed with the PRs that merged them in docs/configuration.md) and the two its
README still documents. For each, a value other than its default and what that value must do:

* ``Read(value, path, expected)``: the value lands in ``Settings`` at `path`, where a consumer
  reads it, and gives something the default does not;
* ``Refused(value, accepted)``: start-up stops with one line naming the variable and why,
  while the values in `accepted` (the default, or what ratelimitd does anyway) are taken;

This table is the one list to extend: a new setting gets a row, and implementing a refused
one turns its row into ``Read`` and deletes its entry in ``ratelimitd/settings/unsupported.py``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.settings_env import Recorder

from ratelimitd.backends import load_settings
from ratelimitd.settings import (
    DogStatsdMogrifier,
    Settings,
    SettingsError,
    extensions_disabled,
    sections,
    unsupported,
)

PERSECOND_URL = "/var/run/nutcracker/ratelimitpersecond.sock"
PERSECOND = {"REDIS_PERSECOND": "true"}
DOGSTATSD = {"USE_STATSD": "false", "USE_DOG_STATSD": "true"}
MOGRIFIER_A = {
    **DOGSTATSD,
    "DOG_STATSD_MOGRIFIER_A_PATTERN": "^x$",
    "DOG_STATSD_MOGRIFIER_A_NAME": "n",
}
MOGRIFIER = {**MOGRIFIER_A, "USE_DOG_STATSD_MOGRIFIERS": "a"}
BASE = {"BACKEND_TYPE": "redis"}


@dataclass(frozen=True)
class Read:
    """The value is read into `path` and differs from what the default gives."""

    value: str
    path: str
    expected: Any
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    """The value stops start-up; the `accepted` ones do not."""

    value: str
    accepted: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


Row = Read | Refused

REFERENCE: dict[str, Row] = {
    # Listeners.
    "HOST": Read("127.0.0.1", "listeners.host", "127.0.0.1"),
    "PORT": Read("9", "listeners.port", 9),
    "DEBUG_HOST": Read("127.0.0.1", "listeners.debug_host", "127.0.0.1"),
    "DEBUG_PORT": Read("9", "listeners.debug_port", 9),
    "GRPC_UDS": Read("/tmp/rl.sock", "listeners.grpc_uds", "/tmp/rl.sock"),
    "GRPC_HOST": Read("127.0.0.1", "listeners.grpc_host", "127.0.0.1"),
    "GRPC_PORT": Read("9", "listeners.grpc_port", 9),
    # gRPC server.
    "GRPC_MAX_CONNECTION_AGE": Read("1h", "grpc.max_connection_age", 3600.0),
    "GRPC_MAX_CONNECTION_AGE_GRACE": Read("5m", "grpc.max_connection_age_grace", 300.0),
    "GRPC_SERVER_USE_TLS": Read("true", "grpc.server_use_tls", True),
    "GRPC_SERVER_TLS_CERT": Read("/s.pem", "grpc.server_tls_cert", "/s.pem"),
    "GRPC_SERVER_TLS_KEY": Read("/s.key", "grpc.server_tls_key", "/s.key"),
    "GRPC_CLIENT_TLS_CACERT": Read("/ca.pem", "grpc.client_tls_cacert", "/ca.pem"),
    "GRPC_CLIENT_TLS_SAN": Read("client.example", "grpc.client_tls_san", "client.example"),
    # Logging.
    "LOG_LEVEL": Read("debug", "log.level", "debug"),
    "LOG_FORMAT": Read("json", "log.format", "json"),
    # Config source: files or an xDS management server.
    "CONFIG_TYPE": Read("GRPC_XDS_SOTW", "config.type", "GRPC_XDS_SOTW"),
    "FORCE_START_WITHOUT_INITIAL_CONFIG": Read(
        "true", "config.force_start_without_initial_config", True
    ),
    "CONFIG_GRPC_XDS_NODE_ID": Read("node-1", "xds.node_id", "node-1"),
    "CONFIG_GRPC_XDS_NODE_METADATA": Read("k=v", "xds.node_metadata", (("k", "v"),)),
    "CONFIG_GRPC_XDS_SERVER_URL": Read("xds:18000", "xds.server_url", "xds:18000"),
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": Read(
        "1s", "xds.server_connect_retry_interval", 1.0
    ),
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": Read(
        "authorization:Bearer s3cret",
        "xds.client_additional_headers",
        (("authorization", "Bearer s3cret"),),
    ),
    "CONFIG_GRPC_XDS_SERVER_USE_TLS": Read("true", "xds.server_use_tls", True),
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": Read("/c.pem", "xds.client_tls_cert", "/c.pem"),
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": Read("/c.key", "xds.client_tls_key", "/c.key"),
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": Read("/ca.pem", "xds.server_tls_cacert", "/ca.pem"),
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN": Read("xds.example", "xds.server_tls_san", "xds.example"),
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": Read("1s", "xds.backoff_initial_interval", 1.0),
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL": Read("2m", "xds.backoff_max_interval", 120.0),
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": Read("2", "xds.backoff_random_factor", 2.0),
    "XDS_CLIENT_BACKOFF_JITTER": Read("false", "xds.backoff_jitter", False),
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": Read("1048576", "xds.max_msg_size_in_bytes", 1048576),
    # Stats.
    "USE_DOG_STATSD": Read("true", "stats.sink", "dogstatsd", {"USE_STATSD": "false"}),
    "USE_DOG_STATSD_MOGRIFIERS": Read(
        "a", "stats.dog_statsd_mogrifiers", (DogStatsdMogrifier("A", "^x$", "n"),), MOGRIFIER_A
    ),
    "DOG_STATSD_MOGRIFIER_A_PATTERN": Read(
        "^y$", "stats.dog_statsd_mogrifiers", (DogStatsdMogrifier("A", "^y$", "n"),), MOGRIFIER
    ),
    "DOG_STATSD_MOGRIFIER_A_NAME": Read(
        "m", "stats.dog_statsd_mogrifiers", (DogStatsdMogrifier("A", "^x$", "m"),), MOGRIFIER
    ),
    "DOG_STATSD_MOGRIFIER_A_TAGS": Read(
        "d:$1",
        "stats.dog_statsd_mogrifiers",
        (DogStatsdMogrifier("A", "^x$", "n", (("d", "$1"),)),),
        MOGRIFIER,
    ),
    "USE_STATSD": Read("false", "stats.sink", "stdout"),
    "STATSD_HOST": Read("statsd.local", "stats.statsd_host", "statsd.local"),
    "STATSD_PORT": Read("9125", "stats.statsd_port", 9125),
    # gostats reads it itself in the reference process (NewTCPStatsdSink is its net sink).
    "STATSD_PROTOCOL": Read("udp", "stats.statsd_protocol", "udp"),
    "EXTRA_TAGS": Read("a:b", "stats.extra_tags", (("a", "b"),)),
    "STATS_FLUSH_INTERVAL": Read("1s", "stats.flush_interval", 1.0),
    "DISABLE_STATS": Read("true", "stats.sink", "null"),
    "USE_PROMETHEUS": Read("true", "stats.sink", "prometheus", {"USE_STATSD": "false"}),
    "PROMETHEUS_ADDR": Read(":9191", "stats.prometheus_addr", ":9191"),
    "PROMETHEUS_PATH": Read("/m", "stats.prometheus_path", "/m"),
    "PROMETHEUS_MAPPER_YAML": Read("/m.yaml", "stats.prometheus_mapper_yaml", "/m.yaml"),
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": Read(
        "true", "stats.prometheus_response_time_as_milliseconds", True
    ),
    # Runtime layout (file provider).
    "RUNTIME_ROOT": Read("/r", "runtime.root", "/r"),
    "RUNTIME_SUBDIRECTORY": Read("sub", "runtime.subdirectory", "sub"),
    "RUNTIME_APPDIRECTORY": Read("app", "runtime.appdirectory", "app"),
    "RUNTIME_IGNOREDOTFILES": Read("true", "runtime.ignoredotfiles", True),
    "RUNTIME_WATCH_ROOT": Read("false", "runtime.watch_root", False),
    # All cache types.
    "EXPIRATION_JITTER_MAX_SECONDS": Read("0", "cache.expiration_jitter_max_seconds", 0),
    "LOCAL_CACHE_SIZE_IN_BYTES": Read("1048576", "cache.local_cache_size_in_bytes", 1048576),
    "NEAR_LIMIT_RATIO": Read("0.5", "cache.near_limit_ratio", 0.5),
    "CACHE_KEY_PREFIX": Read("p_", "cache.cache_key_prefix", "p_"),
    "BACKEND_TYPE": Read("memcache", "cache.backend", "memcache"),
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": Read(
        "true", "cache.stop_cache_key_increment_when_overlimit", True
    ),
    # Response headers (re-read on every config load) and health.
    "LIMIT_RESPONSE_HEADERS_ENABLED": Read("true", "reload.response_headers", True),
    "LIMIT_LIMIT_HEADER": Read("X-Limit", "reload.limit_header", "X-Limit"),
    "LIMIT_REMAINING_HEADER": Read("X-Remaining", "reload.remaining_header", "X-Remaining"),
    "LIMIT_RESET_HEADER": Read("X-Reset", "reload.reset_header", "X-Reset"),
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": Read(
        "true", "config.healthy_with_at_least_one_config_loaded", True
    ),
    # Redis, main instance.
    "REDIS_SOCKET_TYPE": Read("tcp", "redis.socket_type", "tcp"),
    "REDIS_TYPE": Read("cluster", "redis.type", "cluster"),
    "REDIS_URL": Read("h:1", "redis.url", "h:1"),
    "REDIS_POOL_SIZE": Read("3", "redis.pool_size", 3),
    "REDIS_AUTH": Read("pw", "redis.auth", "pw"),
    "REDIS_TLS": Read("true", "redis.tls", True),
    "REDIS_TLS_CLIENT_CERT": Read("/c.pem", "redis.tls_client_cert", "/c.pem"),
    "REDIS_TLS_CLIENT_KEY": Read("/c.key", "redis.tls_client_key", "/c.key"),
    "REDIS_TLS_CACERT": Read("/ca.pem", "redis.tls_cacert", "/ca.pem"),
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": Read(
        "true", "redis.tls_skip_hostname_verification", True
    ),
    "REDIS_PIPELINE_WINDOW": Read("150us", "redis.pipeline_window", 150e-6),
    # Ignored by the reference since radix v4; ratelimitd flushes at this many commands.
    "REDIS_PIPELINE_LIMIT": Read("8", "redis.pipeline_limit", 8),
    "REDIS_CLUSTER_PIPELINE_PARALLELISM": Read("4", "redis.cluster_pipeline_parallelism", 4),
    "REDIS_SENTINEL_AUTH": Read("spw", "redis.sentinel_auth", "spw"),
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": Read(
        "true", "redis.health_check_active_connection", True
    ),
    "REDIS_TIMEOUT": Read("2s", "redis.dial_timeout", 2.0),
    "REDIS_POOL_ON_EMPTY_BEHAVIOR": Refused("CREATE", ("WAIT", "wait")),
    "REDIS_STARTUP_INITIAL_INTERVAL": Read("2s", "redis.startup_initial_interval", 2.0),
    "REDIS_STARTUP_MAX_INTERVAL": Read("1m", "redis.startup_max_interval", 60.0),
    "REDIS_STARTUP_MAX_ELAPSED_TIME": Read("5m", "redis.startup_max_elapsed_time", 300.0),
    # Redis, per-second instance.
    "REDIS_PERSECOND": Read("true", "redis_persecond.url", PERSECOND_URL),
    "REDIS_PERSECOND_SOCKET_TYPE": Read("tcp", "redis_persecond.socket_type", "tcp", PERSECOND),
    "REDIS_PERSECOND_TYPE": Read("cluster", "redis_persecond.type", "cluster", PERSECOND),
    "REDIS_PERSECOND_URL": Read("h:2", "redis_persecond.url", "h:2", PERSECOND),
    "REDIS_PERSECOND_POOL_SIZE": Read("3", "redis_persecond.pool_size", 3, PERSECOND),
    "REDIS_PERSECOND_AUTH": Read("pw", "redis_persecond.auth", "pw", PERSECOND),
    "REDIS_PERSECOND_TLS": Read("true", "redis_persecond.tls", True, PERSECOND),
    "REDIS_PERSECOND_SENTINEL_AUTH": Read("s", "redis_persecond.sentinel_auth", "s", PERSECOND),
    "REDIS_PERSECOND_PIPELINE_WINDOW": Read(
        "1ms", "redis_persecond.pipeline_window", 0.001, PERSECOND
    ),
    "REDIS_PERSECOND_PIPELINE_LIMIT": Read("8", "redis_persecond.pipeline_limit", 8, PERSECOND),
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": Read(
        "0", "redis_persecond.cluster_pipeline_parallelism", 0, PERSECOND
    ),
    "REDIS_PERSECOND_TIMEOUT": Read("2s", "redis_persecond.dial_timeout", 2.0, PERSECOND),
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": Refused("ERROR", ("WAIT",), PERSECOND),
    # Memcached.
    "MEMCACHE_HOST_PORT": Read("m:11211", "memcache.host_port", ("m:11211",)),
    "MEMCACHE_MAX_IDLE_CONNS": Read("8", "memcache.max_idle_conns", 8),
    "MEMCACHE_SRV": Read("_m._tcp.example", "memcache.srv", "_m._tcp.example"),
    "MEMCACHE_SRV_REFRESH": Read("30s", "memcache.srv_refresh", 30.0),
    "MEMCACHE_TLS": Read("true", "memcache.tls", True),
    "MEMCACHE_TLS_CLIENT_CERT": Read("/c.pem", "memcache.tls_client_cert", "/c.pem"),
    "MEMCACHE_TLS_CLIENT_KEY": Read("/c.key", "memcache.tls_client_key", "/c.key"),
    "MEMCACHE_TLS_CACERT": Read("/ca.pem", "memcache.tls_cacert", "/ca.pem"),
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": Read(
        "true", "memcache.tls_skip_hostname_verification", True
    ),
    # Global modes (re-read on every config load).
    "SHADOW_MODE": Read("true", "reload.shadow_mode", True),
    "QUOTA_MODE": Read("true", "reload.quota_mode", True),
    "RESPONSE_DYNAMIC_METADATA": Read("true", "reload.response_dynamic_metadata", True),
    "MERGE_DOMAIN_CONFIG": Read("true", "reload.merge_domain_config", True),
    # Tracing.
    "TRACING_ENABLED": Read("true", "tracing.enabled", True),
    "TRACING_SERVICE_NAME": Read("rl", "tracing.service_name", "rl"),
    "TRACING_SERVICE_NAMESPACE": Read("ns", "tracing.service_namespace", "ns"),
    "TRACING_SERVICE_INSTANCE_ID": Read("i-1", "tracing.service_instance_id", "i-1"),
    "TRACING_EXPORTER_PROTOCOL": Read("grpc", "tracing.exporter_protocol", "grpc"),
    "TRACING_SAMPLING_RATE": Read("0.5", "tracing.sampling_rate", 0.5),
    # Merged upstream after f2fb157.
    "LIMIT_REQUEST_HEADERS_ENABLED": Read("true", "reload.request_headers", True),
    "LIMIT_REQUEST_LIMIT_HEADER": Read("X-Limit", "reload.request_limit_header", "X-Limit"),
    "LIMIT_REQUEST_REMAINING_HEADER": Read(
        "X-Remaining", "reload.request_remaining_header", "X-Remaining"
    ),
    "LIMIT_REQUEST_RESET_HEADER": Read("X-Reset", "reload.request_reset_header", "X-Reset"),
    "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR": Read(
        "true", "redis_persecond.close_connection_on_readonly", True, PERSECOND
    ),
    # Documented by the reference's README (radix v3), read by no version of its code.
    "REDIS_POOL_ON_EMPTY_WAIT_DURATION": Refused("1s"),
    "REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION": Refused("1s"),
}

# ratelimitd's own variables (docs/configuration.md); the KVCACHE_/ALTCACHE_ aliases of the
# REDIS_/MEMCACHE_ ones are tested in test_settings.py.
EXTENSIONS: dict[str, Row] = {
    "RATELIMITD_WORKERS": Read("4", "workers.count", 4),
    "GRPC_TRANSPORT": Read("grpcio", "grpc.transport", "grpcio"),
    "GRPC_MAX_CONCURRENT_STREAMS": Read("16", "grpc.max_concurrent_streams", 16),
    "RATELIMITD_WORKER_INDEX": Read("2", "workers.index", 2),
    "RATELIMITD_STATS_DIR": Read("/d", "workers.stats_dir", "/d"),
    "RATELIMITD_SUPERVISOR_PID": Read("42", "workers.supervisor_pid", 42),
    "DEBUG_PROFILE_ENABLED": Read("true", "debug.profile_enabled", True),
    "DEBUG_PROFILE_MAX_DURATION": Read("1m", "debug.profile_max_seconds", 60.0),
    "ADMIN_TOKEN": Read("t0k3n", "debug.admin_token", "t0k3n"),
    "REDIS_REQUEST_TIMEOUT": Read("20ms", "redis.request_timeout", 0.02),
    "MAX_DESCRIPTORS_PER_REQUEST": Read("10", "reload.max_descriptors", 10),
    "HTTP_MAX_CONNECTIONS": Read("10", "connections.http_max_connections", 10),
    "LIMIT_RESPONSE_HEADERS_FORMAT": Read(
        "ietf", "reload.headers_format", "ietf", {"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}
    ),
    "LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED": Read("true", "reload.all_descriptors_headers", True),
    "STATS_RATE_LIMIT_GAUGES": Read("true", "stats.rate_limit_gauges", True),
    "STATS_MAX_REQUEST_SERIES": Read("50", "stats.max_request_series", 50),
    "STATS_MAX_REQUEST_KEY_BYTES": Read("64", "stats.max_request_key_bytes", 64),
    "DEBUG_MAX_CONNECTIONS": Read("5", "connections.debug_max_connections", 5),
    "GRPC_MAX_CONNECTIONS": Read("7", "connections.grpc_max_connections", 7),
    "HTTP_READ_TIMEOUT": Read("2s", "connections.http_read_timeout", 2.0),
    "HTTP_IDLE_TIMEOUT": Read("1m", "connections.http_idle_timeout", 60.0),
    "GRPC_READ_TIMEOUT": Read("500ms", "connections.grpc_read_timeout", 0.5),
    "MAX_ENTRIES_PER_DESCRIPTOR": Read("3", "reload.max_entries", 3),
    "HTTP_JSON_ENABLED": Read("false", "listeners.json_enabled", False),
    "HTTP_JSON_DOMAINS": Read("a,b", "listeners.json_domains", ("a", "b")),
    "BACKEND_FAILURE_POLICY": Read("local", "cache.failure_policy", "local"),
    "BACKEND_BREAKER_FAILURES": Read("5", "cache.breaker_failures", 5),
    "BACKEND_BREAKER_PROBE_INTERVAL": Read(
        "250ms", "cache.breaker_probe_interval", 0.25, {"BACKEND_BREAKER_FAILURES": "5"}
    ),
    "MAX_INFLIGHT_DECISIONS": Read("100", "cache.max_in_flight", 100),
    "DOMAIN_DEFAULT_ALGORITHMS": Read(
        "a=sliding_window", "reload.domain_algorithms", (("a", "sliding_window"),)
    ),
    "RESPONSE_DYNAMIC_METADATA_LIMIT_NAME": Read(
        "true", "reload.dynamic_metadata_limit_name", True, {"RESPONSE_DYNAMIC_METADATA": "true"}
    ),
    "HTTP_WRITE_TIMEOUT": Read("3s", "connections.http_write_timeout", 3.0),
    "GRPC_WRITE_TIMEOUT": Read("4s", "connections.grpc_write_timeout", 4.0),
    "GRPC_CONNECTION_TIMEOUT": Read("5s", "connections.grpc_connection_timeout", 5.0),
    "MAX_BUFFERED_BYTES": Read("16777216", "connections.max_buffered_bytes", 16777216),
    "MAX_DESCRIPTOR_VALUE_LENGTH": Read("512", "reload.max_value_length", 512),
    "MEMORY_MAX_KEYS": Read("5000", "cache.memory_max_keys", 5000, {"BACKEND_TYPE": "memory"}),
    "MEMORY_MAX_BUDGET_TRANSACTIONS": Read(
        "700", "cache.memory_max_budget_transactions", 700, {"BACKEND_TYPE": "memory"}
    ),
    "BUDGET_MAX_TRANSACTIONS": Read("70", "cache.budget_max_transactions", 70),
    "RLQS_BUCKET_KEYS": Read("name,user", "quota.bucket_keys", ("name", "user")),
    "RLQS_ASSIGNMENT_TTL": Read("10s", "quota.assignment_ttl", 10.0),
    "RLQS_REPORT_INTERVAL": Read("1s", "quota.report_interval", 1.0),
    "RLQS_IDLE_TIMEOUT": Read("5m", "quota.idle_timeout", 300.0),
    "RLQS_MAX_BUCKETS_PER_STREAM": Read("10", "quota.max_buckets_per_stream", 10),
    "RLQS_MAX_BUCKETS": Read("100", "quota.max_buckets", 100),
    "RLQS_MAX_STREAMS": Read("8", "quota.max_streams", 8),
}

ROWS = {**REFERENCE, **EXTENSIONS}


def resolve(settings: Settings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = None if value is None else getattr(value, part)
    return value


def load(env: Mapping[str, str]) -> Settings:
    return load_settings({**BASE, **env})


@pytest.mark.parametrize("name", list(ROWS))
def test_each_variable_is_implemented_or_refused(name: str) -> None:
    row = ROWS[name]
    if isinstance(row, Read):
        got = resolve(load({**row.env, name: row.value}), row.path)
        assert got == pytest.approx(row.expected) if isinstance(got, float) else got == row.expected
        try:
            default = resolve(load(row.env), row.path)
        except SettingsError:
            return  # needed for the setting to work at all (a mogrifier's pattern)
        assert default != row.expected, f"{name}={row.value} changes nothing"
    else:
        with pytest.raises(SettingsError) as info:
            load({**row.env, name: row.value})
        message = str(info.value)
        assert message.startswith(f"{name}: unsupported value")
        assert "not implemented" in message or "not a setting" in message
        assert "\n" not in message
        for value in ("", *row.accepted):
            load({**row.env, name: value})  # the default, or what we do anyway


def test_the_table_names_every_variable_settings_reads() -> None:
    # With the DogStatsD sink and one mogrifier on, every variable is looked up once.
    env = Recorder(MOGRIFIER)
    load_settings(env)
    asked = {n for n in env.asked if not n.startswith(("KVCACHE_", "ALTCACHE_"))}
    assert asked == set(ROWS)


def test_the_refusal_table_and_this_table_agree() -> None:
    refused = {name for name, row in ROWS.items() if isinstance(row, Refused)}
    assert {entry.variable for entry in unsupported.UNSUPPORTED} == refused


def test_aliases_are_refused_under_the_canonical_name() -> None:
    with pytest.raises(SettingsError, match=r"^REDIS_POOL_ON_EMPTY_BEHAVIOR: unsupported value"):
        load({"KVCACHE_POOL_ON_EMPTY_BEHAVIOR": "create"})


def test_invalid_values_are_reported_before_refusals() -> None:
    # The usual syntax errors come first, so a typo is not mistaken for an unsupported value.
    with pytest.raises(SettingsError, match=r"^CONFIG_TYPE: invalid value 'file'"):
        load({"CONFIG_TYPE": "file"})
    with pytest.raises(SettingsError, match=r"^REDIS_CLUSTER_PIPELINE_PARALLELISM: invalid value"):
        load({"REDIS_CLUSTER_PIPELINE_PARALLELISM": "many"})


@pytest.mark.parametrize(
    ("name", "value"),
    [("REDIS_POOL_ON_EMPTY_BEHAVIOR", "CREATE"), ("REDIS_POOL_ON_EMPTY_WAIT_DURATION", "2s")],
)
def test_the_daemon_refuses_to_start_with_one_line(name: str, value: str) -> None:
    env = {**os.environ, "BACKEND_TYPE": "memory", name: value}
    done = subprocess.run(
        [sys.executable, "-m", "ratelimitd"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"ratelimitd: {name}: unsupported value {value!r}")


def test_no_extensions_switch_is_read_through_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RATELIMITD_NO_EXTENSIONS", raising=False)
    assert extensions_disabled() is False
    monkeypatch.setenv("RATELIMITD_NO_EXTENSIONS", "1")
    assert extensions_disabled() is True


def test_only_the_settings_package_reads_the_environment() -> None:
    package = Path(sections.__file__).resolve().parents[1]
    readers = [
        str(path.relative_to(package.parent))
        for path in sorted(package.rglob("*.py"))
        if re.search(r"os\.environ|os\.getenv|environ\.get", path.read_text())
        and path.parent.name != "settings"
    ]
    assert readers == []


# Fields no consumer reads because every value but the default is refused (see
# unsupported.py); the mogrifier names, which settings itself reads the mogrifiers with; a
# mogrifier's pattern, which consumers use compiled (its `regex`).
UNCONSUMED = {
    "DogStatsdMogrifier.pattern",
    "RedisSettings.cluster_pipeline_parallelism",
    "RedisSettings.pool_on_empty_behavior",
    "StatsSettings.dog_statsd_mogrifier_names",
}


def test_every_section_field_has_a_consumer() -> None:
    # A name match outside the settings package, not a proof: it catches a new field that
    # nothing reads (a setting accepted and ignored), the defect this file guards against.
    package = Path(sections.__file__).resolve().parents[1]
    source = "\n".join(
        path.read_text() for path in package.rglob("*.py") if path.parent.name != "settings"
    )
    unread = []
    for section in vars(sections).values():
        if not (dataclasses.is_dataclass(section) and isinstance(section, type)):
            continue
        for f in dataclasses.fields(section):
            name = f"{section.__name__}.{f.name}"
            if name not in UNCONSUMED and not re.search(rf"\.{f.name}\b", source):
                unread.append(name)
    assert unread == []


def readme_classification() -> tuple[list[str], list[str], list[str], str]:
    """From docs/configuration.md: the variables in the first column of the table of
    differences and extensions, in the "Same as the reference" list, and in the xDS
    section's table (the reference's xDS settings), and the whole text.
    `REDIS_[PERSECOND_]X` names both instances, `<NAME>` a mogrifier."""
    section = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = re.sub(r"REDIS_\[PERSECOND_\](\w+)", r"REDIS_\1`, `REDIS_PERSECOND_\1", section)
    section = section.replace("_<NAME>_", "_A_")
    same_start = section.index("**Same as the reference**")
    xds_start = section.index("## Config from a control plane")

    def first_column(text: str) -> list[str]:
        names = []
        for line in text.splitlines():
            if line.startswith("| `"):
                names += re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1])
        return names

    differs = first_column(section[:same_start])
    same_block = section[same_start : section.index("checks that this list", same_start)]
    same = re.findall(r"`([A-Z][A-Z0-9_]+)`", same_block)
    return differs, same, first_column(section[xds_start:]), section


def test_the_readme_classifies_every_reference_variable_once() -> None:
    # Differs (or refused: a row of the table too) or the same; the xDS subsection documents
    # the reference's xDS settings in a table of its own.
    differs, same, xds, _ = readme_classification()
    assert sorted(set(REFERENCE) - set(differs + same + xds)) == []
    named = differs + same
    assert sorted(n for n in REFERENCE if named.count(n) > 1) == []
    assert sorted(n for n in same if n not in REFERENCE) == []


def test_the_readme_names_every_extension() -> None:
    *_, section = readme_classification()
    assert [n for n in EXTENSIONS if not re.search(rf"\b{n}\b", section)] == []
