"""Settings from the environment: reference defaults, Go parsers, aliases, errors."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from ratelimitd.settings import (
    CacheSettings,
    DogStatsdMogrifier,
    RedisSettings,
    ReloadOptions,
    Settings,
    SettingsError,
    mask_url,
    parse_go_bool,
    parse_go_duration,
    parse_go_int,
    redis_auth,
    reload_options_from_env,
    unsupported,
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
    assert Settings.from_env().listeners.grpc_port == 18081


def test_import_is_cheap_and_side_effect_free() -> None:
    code = (
        "import sys, ratelimitd.settings, ratelimitd.logs;"
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
    assert s.cache.backend == "memcache"
    assert load(MEMCACHE_HOST_PORT="a:1", MEMCACHE_SRV="x").cache.backend == "redis"
    # Sentinel with a master and one sentinel is fine; per-second is checked only when on.
    assert load(REDIS_TYPE="sentinel", REDIS_URL="m,h:26379").redis.type == "sentinel"
    assert load(REDIS_PERSECOND_TYPE="sentinel", REDIS_PERSECOND_URL="m").redis_persecond is None


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
    s = Settings.from_env(env)
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
    assert Settings.from_env(env).stats.sink == sink


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
    assert s.stats.dog_statsd_mogrifier_names == ("tag", "second")
    first, second = s.stats.dog_statsd_mogrifiers
    assert first == DogStatsdMogrifier(
        name="TAG",
        pattern=r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
        metric_name="ratelimit.service.rate_limit.$3",
        tags=(("domain", "$1"), ("descriptor", "$2")),
    )
    assert first.regex.match("ratelimit.service.rate_limit.d.k.total_hits") is not None
    assert second == DogStatsdMogrifier("SECOND", "^x$", "y", ())


def test_mogrifiers_ignored_without_the_dogstatsd_sink() -> None:
    assert load(USE_DOG_STATSD_MOGRIFIERS="A").stats.dog_statsd_mogrifiers == ()


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


def test_reload_options_from_env() -> None:
    options = reload_options_from_env(
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
    assert options == ReloadOptions(
        shadow_mode=True,
        quota_mode=True,
        response_dynamic_metadata=True,
        response_headers=True,
        limit_header="X-Limit",
        remaining_header="X-Remaining",
        reset_header="X-Reset",
        merge_domain_config=True,
    )
    assert reload_options_from_env({}) == ReloadOptions()


def test_reload_options_default_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOW_MODE", "true")
    assert reload_options_from_env().shadow_mode is True


def test_reload_options_reject_bad_values() -> None:
    with pytest.raises(SettingsError, match=r"^QUOTA_MODE: invalid value 'maybe'"):
        reload_options_from_env({"QUOTA_MODE": "maybe"})


def test_start_up_reload_options_are_the_ones_re_read_on_reload() -> None:
    # One type: the settings built at start-up hold exactly what a reload re-reads.
    env = {"PORT": "9999", "SHADOW_MODE": "true", "LIMIT_RESET_HEADER": "X-Reset"}
    base = Settings.from_env(env)
    assert base.reload == reload_options_from_env(env)
    assert (base.reload.shadow_mode, base.reload.reset_header) == (True, "X-Reset")
    assert base.listeners.port == 9999


def test_ietf_headers_need_the_response_headers_on() -> None:
    with pytest.raises(SettingsError) as info:
        load(LIMIT_RESPONSE_HEADERS_FORMAT="ietf")
    assert str(info.value) == (
        "LIMIT_RESPONSE_HEADERS_FORMAT: 'ietf' formats the response headers, which are off: "
        "set LIMIT_RESPONSE_HEADERS_ENABLED=true too"
    )
    assert (
        load(
            LIMIT_RESPONSE_HEADERS_FORMAT="IETF", LIMIT_RESPONSE_HEADERS_ENABLED="true"
        ).reload.headers_format
        == "ietf"
    )
    with pytest.raises(SettingsError, match=r"^LIMIT_RESPONSE_HEADERS_FORMAT: invalid value 'rfc'"):
        load(LIMIT_RESPONSE_HEADERS_FORMAT="rfc", LIMIT_RESPONSE_HEADERS_ENABLED="true")


def test_limit_names_need_dynamic_metadata() -> None:
    with pytest.raises(
        SettingsError, match=r"^RESPONSE_DYNAMIC_METADATA_LIMIT_NAME: has no effect"
    ):
        Settings.from_env({"RESPONSE_DYNAMIC_METADATA_LIMIT_NAME": "true"})
    env = {"RESPONSE_DYNAMIC_METADATA_LIMIT_NAME": "true", "RESPONSE_DYNAMIC_METADATA": "true"}
    assert Settings.from_env(env).reload.dynamic_metadata_limit_name
