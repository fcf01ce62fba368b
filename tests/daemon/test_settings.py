"""Settings from the environment: reference defaults, Go parsers, aliases, errors."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from ratelimitd.settings import (
    DogStatsdMogrifier,
    ReloadOverrides,
    Settings,
    SettingsError,
    env_overrides_on_reload,
    mask_url,
    parse_go_bool,
    parse_go_duration,
    parse_go_int,
    redis_auth,
)

# One REDIS_* variable so the backend is not defaulted to memory.
REDIS = {"REDIS_SOCKET_TYPE": "tcp"}


def load(**env: str) -> Settings:
    return Settings.from_env(env)


def error(**env: str) -> str:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults -------------------------------------------------------------------------------


def test_defaults_equal_the_reference() -> None:
    s = load(**REDIS)
    assert (s.host, s.port, s.debug_host, s.debug_port) == ("0.0.0.0", 8080, "0.0.0.0", 6070)
    assert (s.grpc_host, s.grpc_port, s.grpc_uds) == ("0.0.0.0", 8081, "")
    assert s.grpc_max_connection_age == 24 * 3600
    assert s.grpc_max_connection_age_grace == 3600
    assert not s.grpc_server_use_tls
    assert (s.grpc_server_tls_cert, s.grpc_server_tls_key) == ("", "")
    assert (s.grpc_client_tls_cacert, s.grpc_client_tls_san) == ("", "")
    assert (s.log_level, s.log_format) == ("warning", "text")
    assert s.config_type == "FILE"
    assert not s.force_start_without_initial_config
    assert s.config_grpc_xds_node_id == "default"
    assert s.config_grpc_xds_node_metadata == ()
    assert s.config_grpc_xds_server_url == "localhost:18000"
    assert s.config_grpc_xds_server_connect_retry_interval == 3.0
    assert s.config_grpc_xds_client_additional_headers == ()
    assert not s.config_grpc_xds_server_use_tls
    assert s.xds_client_backoff_initial_interval == 10.0
    assert s.xds_client_backoff_max_interval == 60.0
    assert s.xds_client_backoff_random_factor == 0.5
    assert s.xds_client_backoff_jitter is True
    assert s.xds_client_max_msg_size_in_bytes == 0
    assert s.use_statsd is True
    assert (s.statsd_host, s.statsd_port) == ("localhost", 8125)
    assert not s.use_dog_statsd and s.use_dog_statsd_mogrifiers == ()
    assert s.dog_statsd_mogrifiers == ()
    assert not s.use_prometheus
    assert (s.prometheus_addr, s.prometheus_path, s.prometheus_mapper_yaml) == (
        ":9090",
        "/metrics",
        "",
    )
    assert not s.prometheus_response_time_as_milliseconds
    assert s.extra_tags == ()
    assert s.stats_flush_interval == 10.0
    assert not s.disable_stats
    assert s.runtime_root == "/srv/runtime_data/current"
    assert (s.runtime_subdirectory, s.runtime_appdirectory) == ("", "config")
    assert not s.runtime_ignoredotfiles and s.runtime_watch_root
    assert s.expiration_jitter_max_seconds == 300
    assert s.local_cache_size_in_bytes == 0
    assert s.near_limit_ratio == pytest.approx(0.8)
    assert s.cache_key_prefix == ""
    assert (s.backend_type, s.backend_defaulted) == ("redis", False)
    assert not s.stop_cache_key_increment_when_overlimit
    assert not s.limit_response_headers_enabled
    assert (s.limit_limit_header, s.limit_remaining_header, s.limit_reset_header) == (
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
    )
    assert not s.healthy_with_at_least_one_config_loaded
    assert s.redis_type == "single"
    assert s.redis_url == "/var/run/nutcracker/ratelimit.sock"
    assert s.redis_pool_size == 10
    assert (s.redis_auth, s.redis_sentinel_auth) == ("", "")
    assert not s.redis_tls and not s.redis_tls_skip_hostname_verification
    assert (s.redis_tls_client_cert, s.redis_tls_client_key, s.redis_tls_cacert) == ("", "", "")
    assert (s.redis_pipeline_window, s.redis_pipeline_limit) == (0.0, 0)
    assert s.redis_cluster_pipeline_parallelism == 1
    assert s.redis_timeout == 10.0
    assert s.redis_pool_on_empty_behavior == "WAIT"
    assert (
        s.redis_startup_initial_interval,
        s.redis_startup_max_interval,
        s.redis_startup_max_elapsed_time,
    ) == (1.0, 30.0, 0.0)
    assert not s.redis_health_check_active_connection
    assert s.redis_request_timeout == pytest.approx(0.05)
    assert not s.redis_persecond
    assert s.redis_persecond_socket_type == "unix"
    assert s.redis_persecond_type == "single"
    assert s.redis_persecond_url == "/var/run/nutcracker/ratelimitpersecond.sock"
    assert s.redis_persecond_pool_size == 10
    assert (s.redis_persecond_auth, s.redis_persecond_sentinel_auth) == ("", "")
    assert not s.redis_persecond_tls
    assert (s.redis_persecond_pipeline_window, s.redis_persecond_pipeline_limit) == (0.0, 0)
    assert s.redis_persecond_cluster_pipeline_parallelism == 1
    assert s.redis_persecond_timeout == 10.0
    assert s.redis_persecond_pool_on_empty_behavior == "WAIT"
    assert (s.memcache_host_port, s.memcache_srv, s.memcache_srv_refresh) == ((), "", 0.0)
    assert s.memcache_max_idle_conns == 2
    assert not s.memcache_tls and not s.memcache_tls_skip_hostname_verification
    assert not (s.shadow_mode or s.quota_mode or s.response_dynamic_metadata)
    assert not s.merge_domain_config
    assert not s.tracing_enabled
    assert s.tracing_exporter_protocol == "http"
    assert s.tracing_service_name == "RateLimit"
    assert (s.tracing_service_namespace, s.tracing_service_instance_id) == ("", "")
    assert s.tracing_sampling_rate == 1.0
    assert s.ratelimitd_workers == 1
    assert s.stats_sink == "statsd"


def test_dataclass_defaults_match_from_env() -> None:
    # Settings() and from_env() must not drift apart: only the backend choice differs.
    assert load(**REDIS) == dataclasses.replace(Settings(), redis_socket_type="tcp")
    assert load() == dataclasses.replace(Settings(), backend_type="memory", backend_defaulted=True)


def test_settings_are_frozen_and_slotted() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]
    assert not hasattr(s, "__dict__")
    hash(s)  # tuples everywhere, so hashable


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPC_PORT", "18081")
    assert Settings.from_env().grpc_port == 18081


def test_import_is_cheap_and_side_effect_free() -> None:
    code = (
        "import sys, ratelimitd.settings, ratelimitd.logs;"
        "bad = {'asyncio', 'grpc', 'redis', 'yaml'} & set(sys.modules);"
        "assert not bad, bad"
    )
    env = {**os.environ, "PORT": "not-a-port"}  # importing must not read the environment
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- values read from the environment -------------------------------------------------------


def test_every_kind_of_value_is_read() -> None:
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
    assert (s.host, s.port, s.grpc_uds, s.grpc_server_use_tls) == (
        "127.0.0.1",
        0,
        "/tmp/rl.sock",
        True,
    )
    assert (s.log_level, s.log_format, s.config_type) == ("debug", "json", "GRPC_XDS_SOTW")
    assert s.config_grpc_xds_node_metadata == (("k1", "v1"), ("k2", "a=b"))
    assert s.config_grpc_xds_client_additional_headers == (("x-a", "1"), ("x-b", "two"))
    assert s.extra_tags == (("env", "prod"), ("team", "edge"))
    assert s.near_limit_ratio == pytest.approx(0.9)
    assert s.tracing_sampling_rate == 0.25
    assert s.tracing_exporter_protocol == "grpc"
    assert (s.redis_type, s.redis_socket_type, s.redis_url) == ("cluster", "tcp", "a:1,b:2")
    assert s.redis_pool_on_empty_behavior == "WAIT"
    assert s.memcache_host_port == ("m1:11211", "m2:11211")
    assert s.ratelimitd_workers == 4
    assert s.redis_request_timeout == pytest.approx(0.02)


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
    assert load(LOG_LEVEL=level).log_level == canonical


def test_unknown_log_format_is_text_as_in_the_reference() -> None:
    assert load(LOG_FORMAT="logfmt").log_format == "text"


def test_empty_typed_value_takes_the_default_but_empty_string_stays_empty() -> None:
    s = load(PORT="", USE_STATSD="", STATS_FLUSH_INTERVAL="", LOG_LEVEL="", RUNTIME_APPDIRECTORY="")
    assert (s.port, s.use_statsd, s.stats_flush_interval, s.log_level) == (
        8080,
        True,
        10.0,
        "warning",
    )
    assert s.runtime_appdirectory == ""


# --- Go parsers -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_bool_true(text: str) -> None:
    assert parse_go_bool(text) is True
    assert load(SHADOW_MODE=text).shadow_mode is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_go_bool_false(text: str) -> None:
    assert parse_go_bool(text) is False
    assert load(RUNTIME_WATCH_ROOT=text).runtime_watch_root is False


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
    assert s.grpc_max_connection_age == 5400.0
    assert s.redis_pipeline_window == pytest.approx(150e-6)
    assert s.memcache_srv_refresh == 0.0
    assert s.redis_startup_max_elapsed_time == 120.0


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
    assert s.extra_tags == (("a", "3"), ("b", "2"))  # Go map semantics: the last value wins
    assert s.use_dog_statsd_mogrifiers == ()
    assert s.memcache_host_port == ()
    # A value may contain ":" (split at the first one).
    assert load(EXTRA_TAGS="url:http://x").extra_tags == (("url", "http://x"),)


# --- invalid values: one line naming the variable, the value and what is accepted -----------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PORT": "abc"}, "PORT: invalid value 'abc' (expected an integer 0-65535)"),
        ({"GRPC_PORT": "70000"}, "GRPC_PORT: invalid value '70000' (expected an integer 0-65535)"),
        ({"DEBUG_PORT": "-1"}, "DEBUG_PORT: invalid value '-1' (expected an integer 0-65535)"),
        ({"STATSD_PORT": "x"}, "STATSD_PORT: invalid value 'x' (expected an integer 0-65535)"),
        (
            {"LOG_LEVEL": "loud"},
            "LOG_LEVEL: invalid value 'loud' "
            "(accepted: trace, debug, info, warn, warning, error, fatal, panic)",
        ),
        (
            {"REDIS_TYPE": "x"},
            "REDIS_TYPE: invalid value 'x' (accepted: single, sentinel, cluster)",
        ),
        (
            {"REDIS_PERSECOND_TYPE": "replica"},
            "REDIS_PERSECOND_TYPE: invalid value 'replica' (accepted: single, sentinel, cluster)",
        ),
        (
            {"BACKEND_TYPE": "dynamo"},
            "BACKEND_TYPE: invalid value 'dynamo' (accepted: redis, memcache, memory)",
        ),
        (
            {"CONFIG_TYPE": "file"},
            "CONFIG_TYPE: invalid value 'file' (accepted: FILE, GRPC_XDS_SOTW)",
        ),
        (
            {"NEAR_LIMIT_RATIO": "high"},
            "NEAR_LIMIT_RATIO: invalid value 'high' (expected a number)",
        ),
        ({"NEAR_LIMIT_RATIO": "nan"}, "NEAR_LIMIT_RATIO: invalid value 'nan' (expected a number)"),
        (
            {"TRACING_SAMPLING_RATE": "1.5"},
            "TRACING_SAMPLING_RATE: invalid value '1.5' (expected a number between 0 and 1)",
        ),
        (
            {"TRACING_SAMPLING_RATE": "-0.1"},
            "TRACING_SAMPLING_RATE: invalid value '-0.1' (expected a number between 0 and 1)",
        ),
        (
            {"TRACING_EXPORTER_PROTOCOL": "udp"},
            "TRACING_EXPORTER_PROTOCOL: invalid value 'udp' (accepted: http, grpc)",
        ),
        (
            {"REDIS_SOCKET_TYPE": "udp"},
            "REDIS_SOCKET_TYPE: invalid value 'udp' (accepted: tcp, unix)",
        ),
        (
            {"REDIS_PERSECOND_SOCKET_TYPE": "pipe"},
            "REDIS_PERSECOND_SOCKET_TYPE: invalid value 'pipe' (accepted: tcp, unix)",
        ),
        (
            {"GRPC_MAX_CONNECTION_AGE": "10"},
            "GRPC_MAX_CONNECTION_AGE: invalid value '10' "
            "(expected a Go duration >= 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"REDIS_TIMEOUT": "-1s"},
            "REDIS_TIMEOUT: invalid value '-1s' "
            "(expected a Go duration >= 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"STATS_FLUSH_INTERVAL": "0"},
            "STATS_FLUSH_INTERVAL: invalid value '0' "
            "(expected a Go duration > 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"REDIS_CLUSTER_PIPELINE_PARALLELISM": "-1"},
            "REDIS_CLUSTER_PIPELINE_PARALLELISM: invalid value '-1' (expected an integer >= 0)",
        ),
        (
            {"REDIS_POOL_SIZE": "0"},
            "REDIS_POOL_SIZE: invalid value '0' (expected an integer >= 1)",
        ),
        (
            {"RATELIMITD_WORKERS": "0"},
            "RATELIMITD_WORKERS: invalid value '0' (expected an integer >= 1)",
        ),
        (
            {"EXPIRATION_JITTER_MAX_SECONDS": "1e3"},
            "EXPIRATION_JITTER_MAX_SECONDS: invalid value '1e3' (expected an integer >= 0)",
        ),
        (
            {"EXTRA_TAGS": "a:1,b"},
            "EXTRA_TAGS: invalid value 'a:1,b' (expected k1:v1,k2:v2)",
        ),
        (
            {"REDIS_URL": "mymaster", "REDIS_TYPE": "sentinel"},
            "REDIS_URL: invalid value 'mymaster' "
            "(a sentinel URL is 'master,host:port[,host:port...]')",
        ),
        (
            {
                "REDIS_PERSECOND": "true",
                "REDIS_PERSECOND_TYPE": "SENTINEL",
                "REDIS_PERSECOND_URL": "m",
            },
            "REDIS_PERSECOND_URL: invalid value 'm' "
            "(a sentinel URL is 'master,host:port[,host:port...]')",
        ),
        (
            {"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "a:1", "MEMCACHE_SRV": "_m._tcp.x"},
            "MEMCACHE_HOST_PORT, MEMCACHE_SRV: invalid combination "
            "'MEMCACHE_HOST_PORT=a:1, MEMCACHE_SRV=_m._tcp.x' "
            "(accepted: only one of MEMCACHE_HOST_PORT, MEMCACHE_SRV)",
        ),
        (
            {"BACKEND_TYPE": "memcache", "MEMCACHE_SRV": "memcached.local"},
            "MEMCACHE_SRV: invalid value 'memcached.local' (expected _service._proto.name)",
        ),
    ],
)
def test_invalid_values_give_one_clear_line(env: dict[str, str], message: str) -> None:
    assert error(**env) == message


def test_error_is_a_value_error_and_escapes_newlines() -> None:
    with pytest.raises(ValueError, match=r"^PORT: invalid value '80\\n80'"):
        load(PORT="80\n80")


def test_sentinel_url_in_error_is_masked() -> None:
    message = error(REDIS_TYPE="sentinel", REDIS_URL="redis://user:secret@m")
    assert "secret" not in message
    assert "'redis://*****@m'" in message


def test_structural_checks_only_for_the_selected_backend() -> None:
    # As the reference: those checks happen when that backend's client is built.
    s = load(REDIS_TYPE="sentinel", REDIS_URL="m", BACKEND_TYPE="memcache", MEMCACHE_SRV="_a._b.c")
    assert s.backend_type == "memcache"
    assert load(MEMCACHE_HOST_PORT="a:1", MEMCACHE_SRV="x").backend_type == "redis"
    # Sentinel with a master and one sentinel is fine; per-second is checked only when on.
    assert load(REDIS_TYPE="sentinel", REDIS_URL="m,h:26379").redis_type == "sentinel"
    assert load(REDIS_PERSECOND_TYPE="sentinel", REDIS_PERSECOND_URL="m").redis_persecond is False


# --- backend choice and aliases -------------------------------------------------------------


def test_backend_defaults_to_memory_when_nothing_is_configured() -> None:
    s = load(PORT="9000")
    assert (s.backend_type, s.backend_defaulted) == ("memory", True)
    # Empty backend variables do not count as configuration.
    assert load(BACKEND_TYPE="", REDIS_URL="").backend_type == "memory"


@pytest.mark.parametrize(
    "env",
    [{"REDIS_URL": "localhost:6379"}, {"KVCACHE_AUTH": "pw"}, {"MEMCACHE_HOST_PORT": "m:1"},
     {"ALTCACHE_SRV_REFRESH": "1s"}, {"REDIS_PERSECOND": "false"}],
)  # fmt: skip
def test_backend_defaults_to_redis_when_a_backend_variable_is_set(env: dict[str, str]) -> None:
    s = Settings.from_env(env)
    assert (s.backend_type, s.backend_defaulted) == ("redis", False)


@pytest.mark.parametrize(
    ("value", "backend"),
    [("redis", "redis"), ("REDIS", "redis"), ("memcache", "memcache"), ("Memcache", "memcache"),
     ("memory", "memory"), ("altcache", "memcache"), ("kvcache", "redis")],
)  # fmt: skip
def test_backend_type_values(value: str, backend: str) -> None:
    s = load(BACKEND_TYPE=value)
    assert (s.backend_type, s.backend_defaulted) == (backend, False)


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
    assert (s.redis_url, s.redis_socket_type, s.redis_persecond) == ("redis-a:6379", "tcp", True)
    assert s.redis_persecond_url == "redis-b:6379"
    assert s.redis_tls and s.redis_health_check_active_connection
    assert s.redis_pipeline_window == pytest.approx(150e-6)
    assert s.memcache_host_port == ("m1:11211", "m2:11211")
    assert s.memcache_max_idle_conns == 8


def test_canonical_spelling_wins_over_alias() -> None:
    s = load(
        REDIS_URL="canonical:6379", KVCACHE_URL="alias:6379", MEMCACHE_SRV="", ALTCACHE_SRV="x"
    )
    assert s.redis_url == "canonical:6379"
    assert s.memcache_srv == ""  # set (even empty) beats the alias


def test_alias_errors_name_the_canonical_variable() -> None:
    assert error(KVCACHE_TYPE="ring") == (
        "REDIS_TYPE: invalid value 'ring' (accepted: single, sentinel, cluster)"
    )


# --- stats sink -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "sink"),
    [
        ({}, "statsd"),
        ({"USE_STATSD": "false"}, "stdout"),
        ({"USE_STATSD": "false", "USE_DOG_STATSD": "true"}, "dogstatsd"),
        ({"USE_STATSD": "false", "USE_PROMETHEUS": "true"}, "prometheus"),
        ({"DISABLE_STATS": "true"}, "null"),
        ({"DISABLE_STATS": "true", "USE_DOG_STATSD": "1", "USE_PROMETHEUS": "1"}, "null"),
    ],
)
def test_stats_sink_chosen_as_the_reference_runner(env: dict[str, str], sink: str) -> None:
    assert Settings.from_env(env).stats_sink == sink


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"USE_PROMETHEUS": "true"}, "USE_STATSD, USE_PROMETHEUS"),
        ({"USE_DOG_STATSD": "true"}, "USE_DOG_STATSD, USE_STATSD"),
        (
            {"USE_STATSD": "0", "USE_DOG_STATSD": "true", "USE_PROMETHEUS": "T"},
            "USE_DOG_STATSD, USE_PROMETHEUS",
        ),
    ],
)
def test_two_stats_sinks_are_refused(env: dict[str, str], names: str) -> None:
    message = error(**env)
    assert message.startswith(f"{names}: invalid combination ")
    assert "USE_STATSD=false" in message  # tells the user how to fix the default


def test_dogstatsd_mogrifiers() -> None:
    s = load(
        USE_STATSD="false",
        USE_DOG_STATSD="true",
        USE_DOG_STATSD_MOGRIFIERS="tag, second",
        DOG_STATSD_MOGRIFIER_TAG_PATTERN=r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
        DOG_STATSD_MOGRIFIER_TAG_NAME="ratelimit.service.rate_limit.$3",
        DOG_STATSD_MOGRIFIER_TAG_TAGS="domain:$1,descriptor:$2",
        DOG_STATSD_MOGRIFIER_SECOND_PATTERN="^x$",
        DOG_STATSD_MOGRIFIER_SECOND_NAME="y",
    )
    assert s.use_dog_statsd_mogrifiers == ("tag", "second")
    first, second = s.dog_statsd_mogrifiers
    assert first == DogStatsdMogrifier(
        name="TAG",
        pattern=r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
        metric_name="ratelimit.service.rate_limit.$3",
        tags=(("domain", "$1"), ("descriptor", "$2")),
    )
    assert first.regex.match("ratelimit.service.rate_limit.d.k.total_hits") is not None
    assert second == DogStatsdMogrifier("SECOND", "^x$", "y", ())


def test_mogrifiers_ignored_without_the_dogstatsd_sink() -> None:
    assert load(USE_DOG_STATSD_MOGRIFIERS="A").dog_statsd_mogrifiers == ()


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        ({}, "DOG_STATSD_MOGRIFIER_A_PATTERN: invalid value ''"),
        ({"DOG_STATSD_MOGRIFIER_A_PATTERN": "("},
         "DOG_STATSD_MOGRIFIER_A_PATTERN: invalid value '('"),
        ({"DOG_STATSD_MOGRIFIER_A_PATTERN": "x"}, "DOG_STATSD_MOGRIFIER_A_NAME: invalid value ''"),
        (
            {"DOG_STATSD_MOGRIFIER_A_PATTERN": "x", "DOG_STATSD_MOGRIFIER_A_NAME": "n",
             "DOG_STATSD_MOGRIFIER_A_TAGS": ":5"},
            "DOG_STATSD_MOGRIFIER_A_TAGS: invalid value ':5'",
        ),
        (
            {"DOG_STATSD_MOGRIFIER_A_PATTERN": "x", "DOG_STATSD_MOGRIFIER_A_NAME": "n",
             "DOG_STATSD_MOGRIFIER_A_TAGS": "domain:$1,descriptor:"},
            "DOG_STATSD_MOGRIFIER_A_TAGS: invalid value 'domain:$1,descriptor:'",
        ),
    ],
)  # fmt: skip
def test_invalid_mogrifiers(extra: dict[str, str], start: str) -> None:
    env = {"USE_STATSD": "false", "USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "a"}
    assert error(**env, **extra).startswith(start)


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


# --- reload-time overrides ------------------------------------------------------------------


def test_reload_overrides_from_env() -> None:
    overrides = env_overrides_on_reload(
        {
            "SHADOW_MODE": "true",
            "QUOTA_MODE": "1",
            "RESPONSE_DYNAMIC_METADATA": "T",
            "LIMIT_RESPONSE_HEADERS_ENABLED": "True",
            "LIMIT_LIMIT_HEADER": "X-Limit",
            "LIMIT_REMAINING_HEADER": "X-Remaining",
            "LIMIT_RESET_HEADER": "X-Reset",
            "MERGE_DOMAIN_CONFIG": "TRUE",
            "PORT": "not-read-here",
        }
    )
    assert overrides == ReloadOverrides(
        shadow_mode=True,
        quota_mode=True,
        response_dynamic_metadata=True,
        limit_response_headers_enabled=True,
        limit_limit_header="X-Limit",
        limit_remaining_header="X-Remaining",
        limit_reset_header="X-Reset",
        merge_domain_config=True,
    )
    assert env_overrides_on_reload({}) == ReloadOverrides()


def test_reload_overrides_default_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOW_MODE", "true")
    assert env_overrides_on_reload().shadow_mode is True


def test_reload_overrides_reject_bad_values() -> None:
    with pytest.raises(SettingsError, match=r"^QUOTA_MODE: invalid value 'maybe'"):
        env_overrides_on_reload({"QUOTA_MODE": "maybe"})


def test_with_reload_overrides_returns_a_new_settings() -> None:
    base = load(PORT="9999", SHADOW_MODE="true")
    assert base.reload_overrides.shadow_mode is True
    updated = base.with_reload_overrides(
        ReloadOverrides(quota_mode=True, limit_reset_header="X-Reset")
    )
    assert updated is not base
    assert (updated.port, updated.shadow_mode, updated.quota_mode) == (9999, False, True)
    assert updated.limit_reset_header == "X-Reset"
    assert updated.reload_overrides == ReloadOverrides(
        quota_mode=True, limit_reset_header="X-Reset"
    )
    assert base.shadow_mode is True  # the original is untouched
