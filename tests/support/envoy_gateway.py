"""Envoy Gateway's way of running the rate-limit service, for the tests that run ratelimitd
(the daemon, or its image) exactly so.

`environment()` is the environment Envoy Gateway's rate-limit Deployment sets (its
internal/infrastructure/kubernetes/ratelimit/resource.go, with a Redis backend, Prometheus
and tracing configured): the caller changes only addresses and paths. `write_certs` lays out
its certificate Secret as EG mounts it at /certs; `management_server` is the xDS server
(AdsServer over mTLS, as EG's own serves the config on 18001, node id `envoy-ratelimit`);
`CONFIG` a rate-limit config shaped like those EG translates from an HTTPRoute.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from ratelimitd.messages import CODE_NAMES
from ratelimitd.transport.client import ClientTLS, RateLimitClient

from .ads_server import AdsServer, Unit, rl_config, rl_descriptor
from .pki import Pki
from .ready import free_port

NODE_ID = "envoy-ratelimit"
NAMESPACE = "envoy-gateway-system"
POD = "envoy-ratelimit-7d9c5f6b8-x2lqm"  # TRACING_SERVICE_INSTANCE_ID: the pod's name
# The names EG gives: domain = the Gateway's listener, key = route/rule/match.
DOMAIN = "default/eg/http"
KEY = "httproute/default/backend/rule/0/match/0/www_example_com"
# Per hour: a test's calls and its expected OVER_LIMIT must fall in one window, and a
# minute boundary between them (a slow start under load) would reset the count.
LIMIT = 2  # per hour
CONFIG = rl_config(
    "default/eg/http",
    DOMAIN,
    rl_descriptor(KEY, KEY, unit=Unit.HOUR, requests_per_unit=LIMIT),
)
# EG's container securityContext as podman flags: user and group 65534, non-root, no
# privilege escalation, every capability dropped, the default seccomp profile; and a
# read-only root with no tmpfs added (podman mounts /tmp, /run as tmpfs unless told not to;
# Kubernetes mounts nothing unless the pod asks).
SECURITY = (
    "--user", "65534:65534", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--read-only", "--read-only-tmpfs=false",
)  # fmt: skip
# The stats key of that descriptor (`<key>_<value>`), the `key1` label in Prometheus.
KEY1 = f"{KEY}_{KEY}"


def environment(
    *,
    redis_url: str,
    otlp_endpoint: str,
    certs: str = "/certs",
    xds_url: str = "envoy-gateway:18001",
    prometheus_addr: str = ":19001",
    mapper: str = "/etc/statsd-exporter/conf.yaml",
    redis_certs: str = "",
) -> dict[str, str]:
    """Exactly the variables EG sets, in its order; `redis_certs` adds its Redis TLS ones
    (it mounts the client certificate Secret at /redis-certs)."""
    env = {
        "RUNTIME_ROOT": "/data",
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_IGNOREDOTFILES": "true",
        "RUNTIME_WATCH_ROOT": "false",
        "LOG_LEVEL": "info",
        "USE_STATSD": "false",
        "CONFIG_TYPE": "GRPC_XDS_SOTW",
        "CONFIG_GRPC_XDS_SERVER_URL": xds_url,
        "CONFIG_GRPC_XDS_NODE_ID": NODE_ID,
        "GRPC_SERVER_USE_TLS": "true",
        "GRPC_SERVER_TLS_CERT": f"{certs}/tls.crt",
        "GRPC_SERVER_TLS_KEY": f"{certs}/tls.key",
        # Not a variable of the Go service (it reads GRPC_CLIENT_TLS_CACERT): ignored by
        # both, so client certificates are not required.
        "GRPC_SERVER_TLS_CA_CERT": f"{certs}/ca.crt",
        "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": f"{certs}/tls.crt",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": f"{certs}/tls.key",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": f"{certs}/ca.crt",
        "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": redis_url,
    }
    if redis_certs:
        env |= {
            "REDIS_TLS": "true",
            "REDIS_TLS_CLIENT_CERT": f"{redis_certs}/tls.crt",
            "REDIS_TLS_CLIENT_KEY": f"{redis_certs}/tls.key",
        }
    return env | {
        "USE_PROMETHEUS": "true",
        "PROMETHEUS_ADDR": prometheus_addr,
        "PROMETHEUS_MAPPER_YAML": mapper,
        "TRACING_ENABLED": "true",
        "TRACING_SERVICE_NAME": NODE_ID,
        "TRACING_SERVICE_NAMESPACE": NAMESPACE,
        "TRACING_SERVICE_INSTANCE_ID": POD,
        "TRACING_SAMPLING_RATE": "1.0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
    }


def write_certs(pki: Pki, directory: Path, leaf: tuple[Path, Path] | None = None) -> Path:
    """The Secret's three files (tls.crt, tls.key, ca.crt) in `directory`, world-readable as
    a Secret volume is to the pod's user; `leaf` defaults to the rate-limit pod's."""
    cert, key = leaf or pki.ratelimit
    directory.mkdir(parents=True, exist_ok=True)
    for source, name in ((cert, "tls.crt"), (key, "tls.key"), (pki.ca, "ca.crt")):
        shutil.copyfile(source, directory / name)
        (directory / name).chmod(0o644)
    directory.chmod(0o755)
    return directory


def management_server(pki: Pki) -> AdsServer:
    """EG's xDS server: its certificate, client certificates from the CA required, only the
    `envoy-ratelimit` node served; started on a free port, with no config yet."""
    credentials = grpc.ssl_server_credentials(
        [(pki.gateway[1].read_bytes(), pki.gateway[0].read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    return AdsServer(free_port(), credentials=credentials, node_id=NODE_ID).start()


def decide_over_mtls(target: str, certs: Path, times: int) -> list[str]:
    """ShouldRateLimit on CONFIG's descriptor `times` times, as Envoy calls it: TLS trusting
    the CA, presenting the pod certificate; the overall codes' names."""

    async def run() -> list[str]:
        tls = ClientTLS(
            ca_file=str(certs / "ca.crt"),
            cert_file=str(certs / "tls.crt"),
            key_file=str(certs / "tls.key"),
        )
        async with RateLimitClient(target, tls=tls) as client:
            codes = []
            for _ in range(times):
                reply = await client.should_rate_limit(DOMAIN, [[(KEY, KEY)]], timeout=10)
                codes.append(CODE_NAMES[reply.overall_code])
            return codes

    return asyncio.run(run())


def total_hits(metrics: str) -> dict[tuple[str, str], float]:
    """`ratelimit_service_rate_limit_total_hits` samples by (domain, key1)."""
    out = {}
    for family in text_string_to_metric_families(metrics):
        if family.name == "ratelimit_service_rate_limit_total_hits":
            for sample in family.samples:  # named `..._total` by the parser: a counter
                out[(sample.labels.get("domain", ""), sample.labels.get("key1", ""))] = sample.value
    return out
