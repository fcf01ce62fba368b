"""MEMCACHE_TLS against a memcached (-Z) with a CA and client certificates made here (openssl)."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ratelimitd.backends.memcache import create_memcache_backend
from ratelimitd.health import Health
from ratelimitd.settings import Settings

# P-256 keys: generated in milliseconds where RSA-2048 takes seconds on a loaded machine.
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt; server.crt for IP 127.0.0.1, other.crt for DNS memcache.test only; client.crt."""
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", *EC_KEY, "-nodes", "-days", "2", "-subj", "/CN=test ca",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    for name, san in (
        ("server", "IP:127.0.0.1"),
        ("other", "DNS:memcache.test"),
        ("client", "DNS:client"),
    ):
        openssl("req", *EC_KEY, "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}.crt", cwd=d)  # fmt: skip
    return d


def start_tls(memcached: Callable[..., Any], certs: Path, name: str) -> Any:
    """A memcached that requires a client certificate signed by the test CA."""
    client = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    client.check_hostname = False
    client.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    options = (
        f"ssl_chain_cert={certs / f'{name}.crt'},ssl_key={certs / f'{name}.key'},"
        f"ssl_ca_cert={certs / 'ca.crt'},ssl_verify_mode=2"
    )
    return memcached("-Z", "-o", options, tls=client)


async def backend_for(certs: Path, address: str, **extra: str) -> Any:
    settings = Settings.from_env(
        {
            "BACKEND_TYPE": "memcache",
            "MEMCACHE_HOST_PORT": address,
            "MEMCACHE_TLS": "true",
            "MEMCACHE_TLS_CACERT": str(certs / "ca.crt"),
            "MEMCACHE_TLS_CLIENT_CERT": str(certs / "client.crt"),
            "MEMCACHE_TLS_CLIENT_KEY": str(certs / "client.key"),
            **extra,
        }
    )
    health = Health()
    backend = create_memcache_backend(settings, health)
    await backend.connect()
    return backend


async def test_tls_with_ca_and_client_certificate(memcached, certs: Path) -> None:
    mc = start_tls(memcached, certs, "server")
    backend = await backend_for(certs, mc.address)
    try:
        assert await backend.increment([("k", 2, 60)]) == [2]
        await backend.flush()
        assert await backend.increment([("k", 1, 60)]) == [3]
        await backend.flush()
        assert mc.value("k") == 3
        assert backend.stats.counts["multiget.__code=success"] == 2
    finally:
        await backend.close()


async def test_tls_hostname_verification(memcached, certs: Path) -> None:
    mc = start_tls(memcached, certs, "other")  # the certificate names memcache.test only
    strict = await backend_for(certs, mc.address)
    try:
        assert await strict.increment([("k", 1, 60)]) == [1]  # fails open
        await strict.flush()
        assert mc.value("k") is None
        assert strict.stats.counts["multiget.__code=error"] == 1
    finally:
        await strict.close()
    lax = await backend_for(certs, mc.address, MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION="true")
    try:
        await lax.increment([("k", 1, 60)])
        await lax.flush()
        assert mc.value("k") == 1
    finally:
        await lax.close()
