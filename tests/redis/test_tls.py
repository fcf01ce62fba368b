"""REDIS_TLS against a redis-server with a CA and client certificates made here (openssl)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ratelimitd.backends.base import BackendError

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
"""


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt; server.crt for IP 127.0.0.1, other.crt for DNS redis.test only; client.crt."""
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test ca",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    for name, san in (
        ("server", "IP:127.0.0.1"),
        ("other", "DNS:redis.test"),
        ("client", "DNS:client"),
    ):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}.crt", cwd=d)  # fmt: skip
    return d


def start_tls(servers, certs: Path, name: str):
    from_kwargs = {
        "ssl": True,
        "ssl_ca_certs": str(certs / "ca.crt"),
        "ssl_certfile": str(certs / "client.crt"),
        "ssl_keyfile": str(certs / "client.key"),
        "ssl_check_hostname": False,
    }
    return servers(
        "--tls-cert-file", str(certs / f"{name}.crt"),
        "--tls-key-file", str(certs / f"{name}.key"),
        "--tls-ca-cert-file", str(certs / "ca.crt"),
        "--tls-auth-clients", "yes",
        tls=True, tls_kwargs=from_kwargs,
    )  # fmt: skip


def tls_env(certs: Path, url: str, **extra: str) -> dict[str, str]:
    return {
        "REDIS_URL": url,
        "REDIS_TLS": "true",
        "REDIS_TLS_CACERT": str(certs / "ca.crt"),
        "REDIS_TLS_CLIENT_CERT": str(certs / "client.crt"),
        "REDIS_TLS_CLIENT_KEY": str(certs / "client.key"),
        **extra,
    }


async def test_tls_with_ca_and_client_certificate(servers, decider, certs) -> None:
    server = start_tls(servers, certs, "server")
    d = await decider(tls_env(certs, server.address), CONFIG)
    await d.decide("d", [("k", "tls")])
    assert len(server.client().keys("d_k_tls_*")) == 1


async def test_tls_hostname_is_verified_unless_skipped(servers, decider, certs) -> None:
    server = start_tls(servers, certs, "other")  # certificate for redis.test, dialled by IP
    with pytest.raises(BackendError, match=r"CERTIFICATE_VERIFY_FAILED|IP address mismatch"):
        await decider(
            tls_env(certs, server.address, REDIS_STARTUP_MAX_ELAPSED_TIME="200ms"), CONFIG
        )
    d = await decider(
        tls_env(certs, server.address, REDIS_TLS_SKIP_HOSTNAME_VERIFICATION="true"), CONFIG
    )
    await d.decide("d", [("k", "skip")])
    assert len(server.client().keys("d_k_skip_*")) == 1


async def test_rediss_url_and_client_certificate_required(servers, decider, certs) -> None:
    server = start_tls(servers, certs, "server")
    env = tls_env(certs, f"rediss://{server.address}")
    del env["REDIS_TLS"]  # rediss:// turns TLS on by itself
    d = await decider(env, CONFIG)
    await d.decide("d", [("k", "url")])
    assert len(server.client().keys("d_k_url_*")) == 1
    # Without a client certificate the server refuses the handshake.
    no_client = tls_env(certs, server.address, REDIS_STARTUP_MAX_ELAPSED_TIME="200ms")
    del no_client["REDIS_TLS_CLIENT_CERT"], no_client["REDIS_TLS_CLIENT_KEY"]
    with pytest.raises(BackendError, match="timed out waiting for Redis connection"):
        await decider(no_client, CONFIG)
