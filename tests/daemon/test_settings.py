"""Settings from the environment: reference defaults, values read, the Go parsers, the
backend choice and aliases, the Redis URL/auth helpers.

Invalid values are in test_settings_errors.py; the stats sink and the reload-time overrides
in test_settings_stats_reload.py; `load` and `error` are support.settings_env's.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from support.settings_env import error, load

from ratelimitd.backends import load_settings
from ratelimitd.settings import (
    CacheSettings,
    RedisSettings,
    Settings,
    mask_url,
    parse_go_bool,
    parse_go_duration,
    parse_go_int,
    redis_auth,
    unsupported,
)

# One REDIS_* variable so the backend is not defaulted to memory.
REDIS = {"REDIS_SOCKET_TYPE": "tcp"}


# --- defaults -------------------------------------------------------------------------------


def test_defaults_equal_the_reference() -> None:
    s = load(**REDIS)
    li = s.listeners
    assert (li.host, li.port, li.debug_host, li.debug_port) == ("0.0.0.0", 8080, "0.0.0.0", 6070)
    assert (li.grpc_host, li.grpc_port, li.grpc_uds) == ("0.0.0.0", 8081, "")
    assert s.grpc.max_connection_age == 24 * 3600
    assert s.grpc.max_connection_age_grace == 3600
    assert not s.grpc.server_use_tls
    assert (s.grpc.server_tls_cert, s.grpc.server_tls_key) == ("", "")
    assert (s.grpc.client_tls_cacert, s.grpc.client_tls_san) == ("", "")
    assert (s.log.level, s.log.format) == ("warning", "text")
    assert s.config.type == "FILE"
    assert not s.config.force_start_without_initial_config
    assert s.xds.node_id == "default"
    assert s.xds.node_metadata == ()
    assert s.xds.server_url == "localhost:18000"
    assert s.xds.server_connect_retry_interval == 3.0
    assert s.xds.client_additional_headers == ()
    assert not s.xds.server_use_tls
    assert s.xds.backoff_initial_interval == 10.0
    assert s.xds.backoff_max_interval == 60.0
    assert s.xds.backoff_random_factor == 0.5
    assert s.xds.backoff_jitter is True
    assert s.xds.max_msg_size_in_bytes == 0
    assert s.stats.use_statsd is True
    assert (s.stats.statsd_host, s.stats.statsd_port) == ("localhost", 8125)
    assert not s.stats.use_dog_statsd and s.stats.dog_statsd_mogrifier_names == ()
    assert s.stats.dog_statsd_mogrifiers == ()
    assert not s.stats.use_prometheus
    assert (s.stats.prometheus_addr, s.stats.prometheus_path, s.stats.prometheus_mapper_yaml) == (
        ":9090",
        "/metrics",
        "",
    )
    assert not s.stats.prometheus_response_time_as_milliseconds
    assert s.stats.extra_tags == ()
    assert s.stats.flush_interval == 10.0
    assert not s.stats.disable
    assert s.runtime.root == "/srv/runtime_data/current"
    assert (s.runtime.subdirectory, s.runtime.appdirectory) == ("", "config")
    assert not s.runtime.ignoredotfiles and s.runtime.watch_root
    assert s.cache.expiration_jitter_max_seconds == 300
    assert s.cache.local_cache_size_in_bytes == 0
    assert s.cache.near_limit_ratio == pytest.approx(0.8)
    assert s.cache.cache_key_prefix == ""
    assert (s.cache.backend, s.cache.backend_defaulted) == ("redis", False)
    assert not s.cache.stop_cache_key_increment_when_overlimit
    assert not s.reload.response_headers
    assert (s.reload.limit_header, s.reload.remaining_header, s.reload.reset_header) == (
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
    )
    assert not s.config.healthy_with_at_least_one_config_loaded
    assert s.redis.type == "single"
    assert s.redis.url == "/var/run/nutcracker/ratelimit.sock"
    assert s.redis.pool_size == 10
    assert (s.redis.auth, s.redis.sentinel_auth) == ("", "")
    assert not s.redis.tls and not s.redis.tls_skip_hostname_verification
    assert (s.redis.tls_client_cert, s.redis.tls_client_key, s.redis.tls_cacert) == ("", "", "")
    assert (s.redis.pipeline_window, s.redis.pipeline_limit) == (0.0, 0)
    assert s.redis.cluster_pipeline_parallelism == 1
    assert s.redis.dial_timeout == 10.0
    assert s.redis.pool_on_empty_behavior == "WAIT"
    assert (
        s.redis.startup_initial_interval,
        s.redis.startup_max_interval,
        s.redis.startup_max_elapsed_time,
    ) == (1.0, 30.0, 0.0)
    assert not s.redis.health_check_active_connection
    assert s.redis.request_timeout == pytest.approx(0.05)
    assert s.redis_persecond is None  # REDIS_PERSECOND defaults to false
    ps = load(**REDIS, REDIS_PERSECOND="true").redis_persecond
    assert ps is not None
    assert ps.socket_type == "unix"
    assert ps.type == "single"
    assert ps.url == "/var/run/nutcracker/ratelimitpersecond.sock"
    assert ps.pool_size == 10
    assert (ps.auth, ps.sentinel_auth) == ("", "")
    assert not ps.tls
    assert (ps.pipeline_window, ps.pipeline_limit) == (0.0, 0)
    assert ps.cluster_pipeline_parallelism == 1
    assert ps.dial_timeout == 10.0
    assert ps.pool_on_empty_behavior == "WAIT"
    assert (s.memcache.host_port, s.memcache.srv, s.memcache.srv_refresh) == ((), "", 0.0)
    assert s.memcache.max_idle_conns == 2
    assert not s.memcache.tls and not s.memcache.tls_skip_hostname_verification
    assert not (s.reload.shadow_mode or s.reload.quota_mode or s.reload.response_dynamic_metadata)
    assert not s.reload.merge_domain_config
    assert not s.tracing.enabled
    assert s.tracing.exporter_protocol == "http"
    assert s.tracing.service_name == "RateLimit"
    assert (s.tracing.service_namespace, s.tracing.service_instance_id) == ("", "")
    assert s.tracing.sampling_rate == 1.0
    assert s.workers.count == 1
    assert s.stats.sink == "statsd"


def test_dataclass_defaults_match_from_env() -> None:
    # Settings() and from_env() must not drift apart: only the backend choice differs.
    assert load(**REDIS) == Settings(redis=RedisSettings(socket_type="tcp"))
    memory = CacheSettings(backend="memory", backend_defaulted=True)
    assert load() == Settings(cache=memory)
    # One section type for both Redis instances: the per-second one differs by its URL.
    per_second = RedisSettings(url="/var/run/nutcracker/ratelimitpersecond.sock")
    assert load(REDIS_PERSECOND="1").redis_persecond == per_second


def test_per_second_instance_has_its_own_variables_and_shares_the_rest() -> None:
    s = load(
        REDIS_PERSECOND="true",
        REDIS_PERSECOND_URL="ps:6379",
        REDIS_PERSECOND_SOCKET_TYPE="tcp",
        REDIS_PERSECOND_TYPE="cluster",
        REDIS_PERSECOND_POOL_SIZE="3",
        REDIS_PERSECOND_AUTH="pw",
        REDIS_PERSECOND_SENTINEL_AUTH="spw",
        REDIS_PERSECOND_TLS="true",
        REDIS_PERSECOND_PIPELINE_WINDOW="1ms",
        REDIS_PERSECOND_PIPELINE_LIMIT="7",
        REDIS_PERSECOND_TIMEOUT="2s",
        REDIS_TLS_CACERT="/ca.pem",
        REDIS_TLS_CLIENT_CERT="/c.pem",
        REDIS_TLS_CLIENT_KEY="/k.pem",
        REDIS_TLS_SKIP_HOSTNAME_VERIFICATION="true",
        REDIS_STARTUP_INITIAL_INTERVAL="2s",
        REDIS_STARTUP_MAX_INTERVAL="4s",
        REDIS_STARTUP_MAX_ELAPSED_TIME="8s",
        REDIS_HEALTH_CHECK_ACTIVE_CONNECTION="true",
        REDIS_REQUEST_TIMEOUT="30ms",
    )
    main, ps = s.redis, s.redis_persecond
    assert ps is not None
    assert (ps.url, ps.socket_type, ps.type, ps.pool_size) == ("ps:6379", "tcp", "cluster", 3)
    assert (ps.auth, ps.sentinel_auth, ps.tls) == ("pw", "spw", True)
    assert (ps.pipeline_window, ps.pipeline_limit, ps.dial_timeout) == (0.001, 7, 2.0)
    assert (main.url, main.pool_size, main.auth, main.tls) == (RedisSettings().url, 10, "", False)
    shared = (
        "tls_client_cert",
        "tls_client_key",
        "tls_cacert",
        "tls_skip_hostname_verification",
        "startup_initial_interval",
        "startup_max_interval",
        "startup_max_elapsed_time",
        "health_check_active_connection",
        "request_timeout",
    )
    assert [getattr(ps, f) for f in shared] == [getattr(main, f) for f in shared]
    assert main.tls_cacert == "/ca.pem" and main.request_timeout == pytest.approx(0.03)


def test_settings_are_frozen_and_slotted() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.listeners.port = 1  # type: ignore[misc]
    assert not hasattr(s, "__dict__")
    hash(s)  # tuples everywhere, so hashable


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPC_PORT", "18081")
    assert load_settings().listeners.grpc_port == 18081


def test_import_is_cheap_and_side_effect_free() -> None:
    code = (
        "import sys, ratelimitd.settings, ratelimitd.process.logs;"
        "bad = {'asyncio', 'grpc', 'redis', 'yaml'} & set(sys.modules);"
        "assert not bad, bad"
    )
    env = {**os.environ, "PORT": "not-a-port"}  # importing must not read the environment
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- values read from the environment -------------------------------------------------------


def test_every_kind_of_value_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # Values are parsed before any refusal; with the refusal table empty (as once xDS is
    # implemented) the xDS ones land in their section as the reference parses them.
    monkeypatch.setattr(unsupported, "UNSUPPORTED", ())
    s = load(
        HOST="127.0.0.1",
        PORT="0",
        GRPC_UDS="/tmp/rl.sock",
        GRPC_SERVER_USE_TLS="true",
        LOG_LEVEL="DEBUG",
        LOG_FORMAT="JSON",
        CONFIG_TYPE="GRPC_XDS_SOTW",
        CONFIG_GRPC_XDS_NODE_METADATA="k1=v1,broken,k2=a=b",
        CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS="x-a:1, x-b : two",
        EXTRA_TAGS="env:prod,team:edge",
        NEAR_LIMIT_RATIO="0.9",
        TRACING_SAMPLING_RATE="0.25",
        TRACING_EXPORTER_PROTOCOL="GRPC",
        REDIS_TYPE="Cluster",
        REDIS_SOCKET_TYPE="TCP",
        REDIS_URL="a:1,b:2",
        REDIS_POOL_ON_EMPTY_BEHAVIOR="wait",
        MEMCACHE_HOST_PORT="m1:11211, m2:11211,",
        RATELIMITD_WORKERS="4",
        REDIS_REQUEST_TIMEOUT="20ms",
    )
    assert (s.listeners.host, s.listeners.port, s.listeners.grpc_uds, s.grpc.server_use_tls) == (
        "127.0.0.1",
        0,
        "/tmp/rl.sock",
        True,
    )
    assert (s.log.level, s.log.format, s.config.type) == ("debug", "json", "GRPC_XDS_SOTW")
    assert s.xds.node_metadata == (("k1", "v1"), ("k2", "a=b"))
    assert s.xds.client_additional_headers == (("x-a", "1"), ("x-b", "two"))
    assert s.stats.extra_tags == (("env", "prod"), ("team", "edge"))
    assert s.cache.near_limit_ratio == pytest.approx(0.9)
    assert s.tracing.sampling_rate == 0.25
    assert s.tracing.exporter_protocol == "grpc"
    assert (s.redis.type, s.redis.socket_type, s.redis.url) == ("cluster", "tcp", "a:1,b:2")
    assert s.redis.pool_on_empty_behavior == "WAIT"
    assert s.memcache.host_port == ("m1:11211", "m2:11211")
    assert s.workers.count == 4
    assert s.redis.request_timeout == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("level", "canonical"),
    [
        ("trace", "trace"),
        ("Debug", "debug"),
        ("info", "info"),
        ("WARN", "warning"),
        ("warning", "warning"),
        ("error", "error"),
        ("fatal", "fatal"),
        ("PANIC", "panic"),
    ],
)
def test_log_levels_are_logrus_names(level: str, canonical: str) -> None:
    assert load(LOG_LEVEL=level).log.level == canonical


def test_unknown_log_format_is_text_as_in_the_reference() -> None:
    assert load(LOG_FORMAT="logfmt").log.format == "text"


def test_empty_typed_value_takes_the_default_but_empty_string_stays_empty() -> None:
    s = load(PORT="", USE_STATSD="", STATS_FLUSH_INTERVAL="", LOG_LEVEL="", RUNTIME_APPDIRECTORY="")
    assert (s.listeners.port, s.stats.use_statsd, s.stats.flush_interval, s.log.level) == (
        8080,
        True,
        10.0,
        "warning",
    )
    assert s.runtime.appdirectory == ""


# --- Go parsers -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_bool_true(text: str) -> None:
    assert parse_go_bool(text) is True
    assert load(SHADOW_MODE=text).reload.shadow_mode is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_go_bool_false(text: str) -> None:
    assert parse_go_bool(text) is False
    assert load(RUNTIME_WATCH_ROOT=text).runtime.watch_root is False


@pytest.mark.parametrize("text", ["yes", "no", "on", "tRUE", "2", " true", "y"])
def test_go_bool_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_bool(text)
    assert error(SHADOW_MODE=text) == (
        f"SHADOW_MODE: invalid value {text!r} "
        "(accepted: 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("-0", 0.0),
        ("10s", 10.0),
        ("150us", 150e-6),
        ("150µs", 150e-6),
        ("150μs", 150e-6),
        ("1h30m", 5400.0),
        ("1h30m15.5s", 5415.5),
        ("2.5h", 9000.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("100ms", 0.1),
        ("42ns", 42e-9),
        ("24h", 86400.0),
        ("+3s", 3.0),
        ("-1s", -1.0),
    ],
)
def test_go_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "10", "1.5", "s", ".s", "1d", "1 s", "1h 30m", "1.5.5s", "--1s", "1S", "3e2s"]
)
def test_go_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(text)


def test_durations_from_env() -> None:
    s = load(
        GRPC_MAX_CONNECTION_AGE="1h30m",
        REDIS_PIPELINE_WINDOW="150us",
        MEMCACHE_SRV_REFRESH="0",
        REDIS_STARTUP_MAX_ELAPSED_TIME="2m",
    )
    assert s.grpc.max_connection_age == 5400.0
    assert s.redis.pipeline_window == pytest.approx(150e-6)
    assert s.memcache.srv_refresh == 0.0
    assert s.redis.startup_max_elapsed_time == 120.0


@pytest.mark.parametrize(
    ("text", "value"),
    [("8080", 8080), ("+5", 5), ("-5", -5), ("0x1F", 31), ("017", 15), ("0o17", 15),
     ("0b101", 5), ("1_000", 1000), ("0", 0), ("00", 0)],
)  # fmt: skip
def test_go_int(text: str, value: int) -> None:
    assert parse_go_int(text) == value


@pytest.mark.parametrize("text", ["", "abc", "08", "1.0", " 1", "1_", "_1", "1__0", "+-1", "١"])
def test_go_int_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_int(text)


def test_maps_and_lists() -> None:
    s = load(
        EXTRA_TAGS="a:1,b:2,a:3",
        USE_DOG_STATSD="true",
        USE_STATSD="false",
        USE_DOG_STATSD_MOGRIFIERS="",
        MEMCACHE_HOST_PORT="",
    )
    assert s.stats.extra_tags == (("a", "3"), ("b", "2"))  # Go map semantics: the last value wins
    assert s.stats.dog_statsd_mogrifier_names == ()
    assert s.memcache.host_port == ()
    # A value may contain ":" (split at the first one).
    assert load(EXTRA_TAGS="url:http://x").stats.extra_tags == (("url", "http://x"),)


# --- backend choice and aliases -------------------------------------------------------------


def test_backend_defaults_to_memory_when_nothing_is_configured() -> None:
    s = load(PORT="9000")
    assert (s.cache.backend, s.cache.backend_defaulted) == ("memory", True)
    # Empty backend variables do not count as configuration.
    assert load(BACKEND_TYPE="", REDIS_URL="").cache.backend == "memory"


@pytest.mark.parametrize(
    "env",
    [{"REDIS_URL": "localhost:6379"}, {"KVCACHE_AUTH": "pw"}, {"MEMCACHE_HOST_PORT": "m:1"},
     {"ALTCACHE_SRV_REFRESH": "1s"}, {"REDIS_PERSECOND": "false"}],
)  # fmt: skip
def test_backend_defaults_to_redis_when_a_backend_variable_is_set(env: dict[str, str]) -> None:
    s = load_settings(env)
    assert (s.cache.backend, s.cache.backend_defaulted) == ("redis", False)


@pytest.mark.parametrize(
    ("value", "backend"),
    [("redis", "redis"), ("REDIS", "redis"), ("memcache", "memcache"), ("Memcache", "memcache"),
     ("memory", "memory"), ("altcache", "memcache"), ("kvcache", "redis")],
)  # fmt: skip
def test_backend_type_values(value: str, backend: str) -> None:
    s = load(BACKEND_TYPE=value)
    assert (s.cache.backend, s.cache.backend_defaulted) == (backend, False)


def test_kvcache_and_altcache_aliases() -> None:
    s = load(
        KVCACHE_URL="redis-a:6379",
        KVCACHE_SOCKET_TYPE="tcp",
        KVCACHE_PERSECOND="true",
        KVCACHE_PERSECOND_URL="redis-b:6379",
        KVCACHE_TLS="true",
        KVCACHE_PIPELINE_WINDOW="150us",
        KVCACHE_HEALTH_CHECK_ACTIVE_CONNECTION="1",
        ALTCACHE_HOST_PORT="m1:11211,m2:11211",
        ALTCACHE_MAX_IDLE_CONNS="8",
    )
    assert (s.redis.url, s.redis.socket_type) == ("redis-a:6379", "tcp")
    assert s.redis_persecond is not None
    assert s.redis_persecond.url == "redis-b:6379"
    assert s.redis.tls and s.redis.health_check_active_connection
    assert s.redis.pipeline_window == pytest.approx(150e-6)
    assert s.memcache.host_port == ("m1:11211", "m2:11211")
    assert s.memcache.max_idle_conns == 8


def test_canonical_spelling_wins_over_alias() -> None:
    s = load(
        REDIS_URL="canonical:6379", KVCACHE_URL="alias:6379", MEMCACHE_SRV="", ALTCACHE_SRV="x"
    )
    assert s.redis.url == "canonical:6379"
    assert s.memcache.srv == ""  # set (even empty) beats the alias


def test_alias_errors_name_the_canonical_variable() -> None:
    assert error(KVCACHE_TYPE="ring") == (
        "REDIS_TYPE: invalid value 'ring' (accepted: single, sentinel, cluster)"
    )


# --- helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:pass@host:6379", "redis://*****@host:6379"),
        ("redis://:pass@host:6379", "redis://*****@host:6379"),
        ("rediss://user:pass@host:6379", "rediss://*****@host:6379"),
        (
            "foo,redis://user:pass@url1,redis://user:pass@url2",
            "foo,redis://*****@url1,redis://*****@url2",
        ),
        ("redis://us@er:p@ss@host", "redis://*****@host"),
        ("host:6379", "host:6379"),
        ("/var/run/nutcracker/ratelimit.sock", "/var/run/nutcracker/ratelimit.sock"),
        ("redis://host:6379", "redis://host:6379"),
        ("", ""),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    ("auth", "parts"),
    [
        ("", (None, None)),
        ("secret", (None, "secret")),
        ("user:secret", ("user", "secret")),
        ("user:se:cret", ("user", "se:cret")),
        (":secret", ("", "secret")),
    ],
)
def test_redis_auth(auth: str, parts: tuple[str | None, str | None]) -> None:
    assert redis_auth(auth) == parts


def test_a_sentinel_address_in_redis_url_without_redis_type_is_a_sentinel() -> None:
    # Envoy Gateway's single Redis `url` field, no REDIS_TYPE: a sentinel, not a host.
    url = "mymaster,sentinel-0:26379,sentinel-1:26379"
    assert load(REDIS_URL=url).redis.type == "sentinel"
    assert load(REDIS_URL="redis:6379").redis.type == "single"
    assert load(REDIS_TYPE="cluster", REDIS_URL="a:6379,b:6379").redis.type == "cluster"
    assert error(REDIS_TYPE="single", REDIS_URL=url) == (
        f"REDIS_URL: invalid value {url!r} (a sentinel address 'master,host:port[,...]' with "
        "REDIS_TYPE=single: set REDIS_TYPE=sentinel, or leave it unset)"
    )


def test_domain_default_algorithms_are_pairs() -> None:
    got = load(BACKEND_TYPE="memory", DOMAIN_DEFAULT_ALGORITHMS="a=sliding_window, *=token_bucket")
    assert got.reload.domain_algorithms == (("a", "sliding_window"), ("*", "token_bucket"))
    for bad in ("sliding_window", "a=", "=x", "a=x,a=y"):
        assert error(BACKEND_TYPE="memory", DOMAIN_DEFAULT_ALGORITHMS=bad).startswith(
            "DOMAIN_DEFAULT_ALGORITHMS: invalid value"
        ), bad
