"""The settings types: one frozen :class:`Settings` made of sections, one per concern.

Every default here is the reference's (``src/settings/settings.go``); ``environment.py`` reads
each variable into these types and nothing else does. A section is what one consumer is built
from: the listeners for the servers, ``grpc`` for the gRPC transport, one :class:`RedisSettings`
per Redis instance (main and per-second), ``memcache``, ``stats`` for the sink, ``tracing``,
``runtime`` for the file provider, and :class:`ReloadOptions`, the values the reference re-reads
on every config load, which is also the type the service decides with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .goparse import Pairs

StatsSink = Literal["null", "dogstatsd", "statsd", "prometheus", "stdout"]


__all__ = [
    "CacheSettings",
    "ConfigSettings",
    "ConnectionLimits",
    "DebugSettings",
    "DogStatsdMogrifier",
    "GrpcSettings",
    "ListenerSettings",
    "LogSettings",
    "MemcacheSettings",
    "QuotaSettings",
    "RedisSettings",
    "ReloadOptions",
    "RuntimeSettings",
    "Settings",
    "StatsSettings",
    "StatsSink",
    "TracingSettings",
    "WorkerSettings",
    "XdsSettings",
    "mask_url",
    "redis_auth",
]


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
class ListenerSettings:
    """Where the servers listen: HOST/PORT (HTTP), DEBUG_*, GRPC_HOST/GRPC_PORT/GRPC_UDS."""

    host: str = "0.0.0.0"
    port: int = 8080
    debug_host: str = "0.0.0.0"
    debug_port: int = 6070
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 8081
    grpc_uds: str = ""  # set: gRPC listens on this unix socket instead of host:port
    # Extension: `/json` off (404) or limited to these domains (403), so a deployment can
    # keep metering domains reachable only over gRPC on loopback / a unix socket.
    json_enabled: bool = True  # HTTP_JSON_ENABLED
    json_domains: tuple[str, ...] = ()  # HTTP_JSON_DOMAINS: empty = every domain


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Extension: what one client may hold (the reference bounds nothing).

    Each listener takes at most its `*_max_connections` clients, and all of them together at
    most the open-file limit (raised to its hard limit at start) less FD_RESERVE, so health,
    config reloads and backend connections always have descriptors left; a full listener
    closes its longest-idle connection with no request in progress to admit a new one. An
    HTTP request must arrive whole within `http_read_timeout` of its first byte (or of the
    connection), a keep-alive connection idle for `http_idle_timeout` is closed, and so is
    one whose answers cannot be written for `http_write_timeout`. A gRPC connection must
    finish its TLS handshake and HTTP/2 preface within `grpc_connection_timeout`, a gRPC
    request whose body is not complete within `grpc_read_timeout` is answered
    DEADLINE_EXCEEDED, and a reply not sent within `grpc_write_timeout` is reset. What is
    held for clients past the read that brought it (incomplete, queued and undecided
    requests, replies held back) is at most `max_buffered_bytes` in the whole process.
    """

    http_max_connections: int = 4096  # HTTP_MAX_CONNECTIONS (the /json listener)
    debug_max_connections: int = 64  # DEBUG_MAX_CONNECTIONS
    grpc_max_connections: int = 4096  # GRPC_MAX_CONNECTIONS
    http_read_timeout: float = 10.0  # HTTP_READ_TIMEOUT
    http_idle_timeout: float = 120.0  # HTTP_IDLE_TIMEOUT
    http_write_timeout: float = 10.0  # HTTP_WRITE_TIMEOUT
    grpc_read_timeout: float = 10.0  # GRPC_READ_TIMEOUT
    grpc_write_timeout: float = 10.0  # GRPC_WRITE_TIMEOUT
    grpc_connection_timeout: float = 20.0  # GRPC_CONNECTION_TIMEOUT
    max_buffered_bytes: int = 64 * 1024 * 1024  # MAX_BUFFERED_BYTES


@dataclass(frozen=True, slots=True)
class DebugSettings:
    """Extension: the debug listener's CPU profile (DEBUG_PROFILE_*) and ADMIN_TOKEN.

    The profile endpoint is off unless DEBUG_PROFILE_ENABLED; with ADMIN_TOKEN set it serves
    only requests bearing that token (``Authorization: Bearer <token>``), enabled or not.
    """

    profile_enabled: bool = False
    profile_max_seconds: float = 10.0  # DEBUG_PROFILE_MAX_DURATION
    admin_token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    """The gRPC server: GRPC_MAX_CONNECTION_AGE(_GRACE) (seconds) and GRPC_*TLS*."""

    max_connection_age: float = 24 * 3600.0
    max_connection_age_grace: float = 3600.0
    server_use_tls: bool = False
    server_tls_cert: str = ""
    server_tls_key: str = ""
    client_tls_cacert: str = ""  # set: mTLS, client certificates are required
    client_tls_san: str = ""
    # GRPC_TRANSPORT: "native" (libnghttp2, the default when built) or "grpcio" (grpc.aio);
    # "" when unset: native if the extension was built, else grpc.aio with a warning.
    transport: str = ""
    # GRPC_MAX_CONCURRENT_STREAMS (native transport): streams one connection may have open.
    # 256: above what Envoy keeps in flight per connection at this service's latency and
    # above a 128-stream load generator, while bounding the calls (tasks, Redis commands)
    # one connection can hold; request bodies are bounded by the connection window anyway.
    max_concurrent_streams: int = 256


@dataclass(frozen=True, slots=True)
class LogSettings:
    """LOG_LEVEL as the canonical logrus name; LOG_FORMAT as ``text`` or ``json``."""

    level: str = "warning"
    format: str = "text"


@dataclass(frozen=True, slots=True)
class ConfigSettings:
    """Where the rule set comes from and how its loading shows in health."""

    type: str = "FILE"  # CONFIG_TYPE: FILE or GRPC_XDS_SOTW
    force_start_without_initial_config: bool = False
    healthy_with_at_least_one_config_loaded: bool = False


@dataclass(frozen=True, slots=True)
class XdsSettings:
    """The xDS config provider (CONFIG_GRPC_XDS_*, XDS_CLIENT_*); durations in seconds."""

    node_id: str = "default"
    node_metadata: Pairs = ()
    server_url: str = "localhost:18000"
    server_connect_retry_interval: float = 3.0
    client_additional_headers: Pairs = field(default=(), repr=False)  # may carry tokens
    server_use_tls: bool = False
    client_tls_cert: str = ""
    client_tls_key: str = ""
    server_tls_cacert: str = ""
    server_tls_san: str = ""
    backoff_initial_interval: float = 10.0
    backoff_max_interval: float = 60.0
    backoff_random_factor: float = 0.5
    backoff_jitter: bool = True
    max_msg_size_in_bytes: int = 0  # 0: the gRPC default


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """The file provider's layout (goruntime): RUNTIME_*."""

    root: str = "/srv/runtime_data/current"
    subdirectory: str = ""
    appdirectory: str = "config"
    ignoredotfiles: bool = False
    watch_root: bool = True


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
class StatsSettings:
    """The stats sink: which one (USE_*, DISABLE_STATS), where, how often, extra tags."""

    use_statsd: bool = True
    statsd_host: str = "localhost"
    statsd_port: int = 8125
    # STATSD_PROTOCOL: gostats reads it itself (its default tcp); udp sends datagrams.
    statsd_protocol: str = "tcp"
    use_dog_statsd: bool = False
    dog_statsd_mogrifier_names: tuple[str, ...] = ()  # USE_DOG_STATSD_MOGRIFIERS
    # Read only when the DogStatsD sink is the one built, as the reference does.
    dog_statsd_mogrifiers: tuple[DogStatsdMogrifier, ...] = ()
    use_prometheus: bool = False
    prometheus_addr: str = ":9090"
    prometheus_path: str = "/metrics"
    prometheus_mapper_yaml: str = ""
    prometheus_response_time_as_milliseconds: bool = False
    extra_tags: Pairs = ()
    flush_interval: float = 10.0
    disable: bool = False  # DISABLE_STATS
    # Extension: series created from request content (limit overrides, detailed_metric
    # values, unknown domains) past this many fold into one overflow series.
    max_request_series: int = 10_000  # STATS_MAX_REQUEST_SERIES
    # Extension: such a series' stats key longer than this (UTF-8 bytes) is cut and ends
    # with a digest of the whole key (stats/store.py `bounded_key`).
    max_request_key_bytes: int = 256  # STATS_MAX_REQUEST_KEY_BYTES
    # Extension: a gauge of each configured rule's limit, `<stats key>.rate_limit`
    # (asked upstream in #1138, #160, #429, #453, #986), for utilisation alerts.
    rate_limit_gauges: bool = False  # STATS_RATE_LIMIT_GAUGES

    @property
    def sink(self) -> StatsSink:
        """The sink the reference's runner would build: null, dogstatsd, statsd, ..."""
        if self.disable:
            return "null"
        if self.use_dog_statsd:
            return "dogstatsd"
        if self.use_statsd:
            return "statsd"
        if self.use_prometheus:
            return "prometheus"
        return "stdout"


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """What every backend and the limiter share ("all cache types" in the reference)."""

    backend: str = "redis"  # BACKEND_TYPE: redis, memcache or memory
    # True when no backend was configured at all and `memory` was chosen for that reason.
    backend_defaulted: bool = False
    expiration_jitter_max_seconds: int = 300
    local_cache_size_in_bytes: int = 0
    near_limit_ratio: float = 0.8  # float32 in the reference; keys/limiter round as needed
    cache_key_prefix: str = ""
    stop_cache_key_increment_when_overlimit: bool = False
    # Extensions, off by default: what a decision does when the store
    # fails (`error` is the reference: UNKNOWN), a breaker per store instance after
    # `breaker_failures` consecutive failures (0: none), and a bound on decisions waiting
    # on the store per process (0: none).
    failure_policy: str = "error"  # BACKEND_FAILURE_POLICY: error | allow | deny | local
    breaker_failures: int = 0  # BACKEND_BREAKER_FAILURES
    breaker_probe_interval: float = 1.0  # BACKEND_BREAKER_PROBE_INTERVAL
    max_in_flight: int = 0  # MAX_INFLIGHT_DECISIONS
    # Extension: the memory store's bound (BACKEND_TYPE=memory, and the `local` failure
    # policy's store); a key longer than 256 bytes counts once per 256 bytes.
    memory_max_keys: int = 1_000_000  # MEMORY_MAX_KEYS
    # Extension: token-budget transactions (open and tombstones) one budget may hold, on
    # every store that keeps budgets, and all budgets of the memory store together
    # (`config.budget_store.FULL`).
    budget_max_transactions: int = 100_000  # BUDGET_MAX_TRANSACTIONS
    memory_max_budget_transactions: int = 500_000  # MEMORY_MAX_BUDGET_TRANSACTIONS


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """One Redis instance: REDIS_* for the main one, REDIS_PERSECOND_* for the per-second one.

    The per-second instance has no variables of its own for the TLS files, the start-up
    backoff, the health check and the request timeout: it takes the main instance's.
    """

    type: str = "single"  # single, sentinel or cluster (lower-case)
    socket_type: str = "unix"  # tcp or unix (lower-case)
    # url, auth and sentinel_auth may carry passwords: out of repr (log masked_url).
    url: str = field(default="/var/run/nutcracker/ratelimit.sock", repr=False)
    pool_size: int = 10
    auth: str = field(default="", repr=False)
    sentinel_auth: str = field(default="", repr=False)
    tls: bool = False
    tls_client_cert: str = ""
    tls_client_key: str = ""
    tls_cacert: str = ""
    tls_skip_hostname_verification: bool = False
    pipeline_window: float = 0.0
    pipeline_limit: int = 0
    # A request's per-node pipelines in flight at once on a cluster: 1 one after another
    # (the reference's default), 0 all at once, N at most N (capped at the pool size).
    cluster_pipeline_parallelism: int = 1
    dial_timeout: float = 10.0  # REDIS_TIMEOUT: the reference's is a dial timeout too
    pool_on_empty_behavior: str = "WAIT"
    startup_initial_interval: float = 1.0
    startup_max_interval: float = 30.0
    startup_max_elapsed_time: float = 0.0  # 0: retry forever
    health_check_active_connection: bool = False
    # Extension REDIS_REQUEST_TIMEOUT: the longest a request waits for its replies.
    request_timeout: float = 0.05
    # REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR (upstream #1191): a READONLY reply drops the
    # pool's connections, which re-dial (a failover by re-pointing an address).
    close_connection_on_readonly: bool = False

    @property
    def masked_url(self) -> str:
        """The URL as it may be logged."""
        return mask_url(self.url)


# The per-second instance's own default URL.
PERSECOND_URL = "/var/run/nutcracker/ratelimitpersecond.sock"


@dataclass(frozen=True, slots=True)
class MemcacheSettings:
    """The memcached backend: MEMCACHE_*."""

    host_port: tuple[str, ...] = ()
    srv: str = ""
    srv_refresh: float = 0.0  # 0: resolve once
    max_idle_conns: int = 2
    tls: bool = False
    tls_client_cert: str = ""
    tls_client_key: str = ""
    tls_cacert: str = ""
    tls_skip_hostname_verification: bool = False


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """OTLP tracing: TRACING_*; an empty instance id means a random UUID v4."""

    enabled: bool = False
    exporter_protocol: str = "http"
    service_name: str = "RateLimit"
    service_namespace: str = ""
    service_instance_id: str = ""
    sampling_rate: float = 1.0


@dataclass(frozen=True, slots=True)
class ReloadOptions:
    """What the reference re-reads from the environment on every config load.

    The service decides with these (swapped together with the rule set); the reloader uses
    `merge_domain_config` when it builds the rule set.
    """

    shadow_mode: bool = False
    quota_mode: bool = False
    response_dynamic_metadata: bool = False
    # Extension (the reference's open PR #1239, opt-in): each descriptor in the dynamic
    # metadata gets its `code` and the `limitName` of the limit that decided it.
    dynamic_metadata_limit_name: bool = False  # RESPONSE_DYNAMIC_METADATA_LIMIT_NAME
    response_headers: bool = False  # LIMIT_RESPONSE_HEADERS_ENABLED
    limit_header: str = "RateLimit-Limit"
    remaining_header: str = "RateLimit-Remaining"
    reset_header: str = "RateLimit-Reset"
    # Extension: `ietf` sends the response headers as draft-ietf-httpapi-ratelimit-headers-11's
    # RateLimit-Policy and RateLimit fields, every descriptor with a limit, plus Retry-After.
    headers_format: str = "reference"  # LIMIT_RESPONSE_HEADERS_FORMAT: reference | ietf
    # Extension (the reference's open PR #1190): ratelimit-limit-<unit>s and
    # ratelimit-remaining-<unit>s for every descriptor with a limit.
    all_descriptors_headers: bool = False  # LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED
    # LIMIT_REQUEST_*: the same three headers added to the upstream request.
    request_headers: bool = False  # LIMIT_REQUEST_HEADERS_ENABLED
    request_limit_header: str = "RateLimit-Limit"
    request_remaining_header: str = "RateLimit-Remaining"
    request_reset_header: str = "RateLimit-Reset"
    merge_domain_config: bool = False
    # Extension: a request with more descriptors, or a descriptor with more entries, is
    # refused before any work (gRPC RESOURCE_EXHAUSTED, /json 400).
    max_descriptors: int = 1024  # MAX_DESCRIPTORS_PER_REQUEST
    max_entries: int = 64  # MAX_ENTRIES_PER_DESCRIPTOR
    # Extension: an entry's key or value longer than this many bytes (UTF-8) is refused
    # the same way, on every backend (one 1 MB value made a 1 MB counter key).
    max_value_length: int = 4096  # MAX_DESCRIPTOR_VALUE_LENGTH
    # Extension: the algorithm of a limit that names none, per domain (`*`: every other
    # domain), for file and xDS configs alike: an xDS resource has no field for one, and
    # AI Gateway and Envoy Gateway promise sliding windows (DOMAIN_DEFAULT_ALGORITHMS).
    domain_algorithms: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """Extension: the Rate Limit Quota Service (RLQS_*, docs/rlqs.md)."""

    # RLQS_BUCKET_KEYS: the order a bucket's keys take as descriptor entries; keys not
    # listed follow in name order (empty: every key in name order).
    bucket_keys: tuple[str, ...] = ()
    # RLQS_ASSIGNMENT_TTL: a little over Envoy's report period (5 s, fixed in Envoy 1.40),
    # so a refreshed assignment never lapses and a dead server's lapses soon.
    assignment_ttl: float = 7.0
    # RLQS_REPORT_INTERVAL: the period Envoy reports at; a stream is granted what its
    # demand needs for two of them.
    report_interval: float = 5.0
    # RLQS_MAX_BUCKETS_PER_STREAM: buckets one stream may hold; later ones get no
    # assignment (the filter's no_assignment_behavior applies) and are counted.
    max_buckets_per_stream: int = 1000
    # RLQS_MAX_BUCKETS: buckets all streams of the process may hold together (the same),
    # a bucket counting once more per 256 bytes of its keys and values.
    max_buckets: int = 50_000
    # RLQS_MAX_STREAMS: streams the process serves at once; more are refused
    # RESOURCE_EXHAUSTED (Envoy opens one per process).
    max_streams: int = 4096
    # RLQS_IDLE_TIMEOUT: a bucket reported with no requests this long is abandoned.
    idle_timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Extension: RATELIMITD_WORKERS processes; the supervisor sets the others per worker."""

    count: int = 1
    index: int | None = None  # RATELIMITD_WORKER_INDEX, set in a worker only
    stats_dir: str = ""  # RATELIMITD_STATS_DIR: where workers publish Prometheus totals
    # RATELIMITD_SUPERVISOR_PID: a worker exits when this process is no longer its parent.
    supervisor_pid: int | None = None

    @property
    def shares_ports(self) -> bool:
        """Whether this process is one of several workers binding the same ports
        (SO_REUSEPORT); a lone daemon binds them alone, and a second instance on its ports
        fails with "address in use", as the reference does."""
        return self.index is not None


@dataclass(frozen=True, slots=True)
class Settings:
    """How the process runs: every setting of the reference plus a few extensions, one
    section per concern (`sections.py`); built by `environment.settings_from_env`."""

    listeners: ListenerSettings = ListenerSettings()
    connections: ConnectionLimits = ConnectionLimits()
    debug: DebugSettings = DebugSettings()
    grpc: GrpcSettings = GrpcSettings()
    log: LogSettings = LogSettings()
    config: ConfigSettings = ConfigSettings()
    xds: XdsSettings = XdsSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    stats: StatsSettings = StatsSettings()
    cache: CacheSettings = CacheSettings()
    redis: RedisSettings = RedisSettings()
    # None unless REDIS_PERSECOND: SECOND-unit keys then go to this instance.
    redis_persecond: RedisSettings | None = None
    memcache: MemcacheSettings = MemcacheSettings()
    tracing: TracingSettings = TracingSettings()
    reload: ReloadOptions = ReloadOptions()
    workers: WorkerSettings = WorkerSettings()
    quota: QuotaSettings = QuotaSettings()
