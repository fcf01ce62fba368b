"""The daemon run exactly as Envoy Gateway runs the Go service: its whole environment (xDS
over mTLS, Redis over TLS with a client certificate, Prometheus, OTLP tracing), its
certificates, and no statsd mapping file (its ConfigMap is optional; a missing one made the
daemon exit at start-up, so the pod crash-looped).

Only addresses and paths differ from what EG sets: free ports instead of 8080/8081/6070
and :19001, the test directory for /certs, /redis-certs and /etc/statsd-exporter. The Redis
server's certificate is from the test CA, which the daemon trusts as a system CA
(SSL_CERT_FILE), as EG's environment has no REDIS_TLS_CACERT. tests/deploy runs the image so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from support import REPO, free_port, http_get, wait_for
from support.daemon import DaemonProcess, with_fresh_ports
from support.envoy_gateway import (
    CONFIG,
    DOMAIN,
    KEY1,
    NODE_ID,
    POD,
    decide_over_mtls,
    environment,
    management_server,
    total_hits,
    write_certs,
)
from support.otlp import otlp_http_receiver
from support.pki import Pki
from support.redis_server import RedisServers


def tls_redis(servers: RedisServers, pki: Pki):  # type: ignore[no-untyped-def]
    """A redis-server on TLS that requires a client certificate from the test CA."""
    return servers(
        "--tls-cert-file", str(pki.server[0]),
        "--tls-key-file", str(pki.server[1]),
        "--tls-ca-cert-file", str(pki.ca),
        "--tls-auth-clients", "yes",
        tls=True,
        tls_kwargs={
            "ssl": True,
            "ssl_ca_certs": str(pki.ca),
            "ssl_certfile": str(pki.client[0]),
            "ssl_keyfile": str(pki.client[1]),
        },
    )  # fmt: skip


def test_envoy_gateway_environment_without_the_mapper_file(
    tmp_path: Path,
    certs: Pki,
    redis_servers: RedisServers,
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    pod_certs = write_certs(certs, tmp_path / "certs")
    redis_certs = write_certs(certs, tmp_path / "redis-certs", certs.client)
    mapper_dir = tmp_path / "statsd-exporter"
    mapper_dir.mkdir()  # an optional ConfigMap that does not exist: an empty mount
    redis = tls_redis(redis_servers, certs)
    ads = management_server(certs)
    metrics_port = free_port()
    with otlp_http_receiver() as otlp:
        eg = environment(
            redis_url=redis.address,
            otlp_endpoint=otlp.url.removesuffix("/v1/traces"),
            certs=str(pod_certs),
            xds_url=f"localhost:{ads.port}",
            prometheus_addr=f":{metrics_port}",
            mapper=str(mapper_dir / "conf.yaml"),
            redis_certs=str(redis_certs),
        )
        # Nothing of this process's environment leaks in: EG's variables, where Python is,
        # and the CA Redis's certificate chains to, as a system CA.
        base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "SSL_CERT_FILE": str(certs.ca)}
        d = start_daemon(with_fresh_ports(base | eg))
        try:
            # Serving before any config (FORCE_START_WITHOUT_INITIAL_CONFIG), metrics included.
            assert d.http("/healthcheck")[0] == 200
            status, body = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert status == 200
            # The default mapping's names and labels (the reference would map nothing).
            assert b'ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}' in body
            warnings = [line for line in d.log().splitlines() if "PROMETHEUS_MAPPER_YAML" in line]
            assert len(warnings) == 1 and "level=warning" in warnings[0]
            assert f"cannot read {mapper_dir}/conf.yaml: No such file or directory" in warnings[0]

            ads.set_snapshot("1", [CONFIG])
            assert ads.wait_ack("1").request.node.id == NODE_ID
            assert decide_over_mtls(d.grpc_target, pod_certs, 3) == ["OK", "OK", "OVER_LIMIT"]

            # The default mapping: the labels Envoy Gateway's dashboard reads.
            _, body = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert total_hits(body.decode())[(DOMAIN, KEY1)] == 3
            assert len(redis.client().keys(f"{DOMAIN}_*")) == 1
            assert d.terminate() == 0
        finally:
            ads.stop()
        # The batch exporter flushes at shutdown: spans named as EG names the service.
        wait_for(lambda: otlp.spans(), what="spans at the OTLP endpoint")
    resource = {a.key: a.value.string_value for a in otlp.spans()[0][0].attributes}
    assert resource["service.name"] == NODE_ID
    assert resource["service.instance.id"] == POD
