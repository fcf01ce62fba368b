"""MEMCACHE_TLS against a memcached (-Z) with the test PKI's CA and client certificates."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.pki import Pki

from ratelimitd.backends import load_settings
from ratelimitd.backends.base import Op
from ratelimitd.backends.memcache import create_memcache_backend
from ratelimitd.health import Health


def start_tls(memcached: Callable[..., Any], certs: Pki, leaf: tuple[Path, Path]) -> Any:
    """A memcached presenting `leaf` that requires a client certificate from the test CA."""
    client = ssl.create_default_context(cafile=str(certs.ca))
    client.check_hostname = False
    client.load_cert_chain(str(certs.client[0]), str(certs.client[1]))
    options = f"ssl_chain_cert={leaf[0]},ssl_key={leaf[1]},ssl_ca_cert={certs.ca},ssl_verify_mode=2"
    return memcached("-Z", "-o", options, tls=client)


async def backend_for(certs: Pki, address: str, **extra: str) -> Any:
    settings = load_settings(
        {
            "BACKEND_TYPE": "memcache",
            "MEMCACHE_HOST_PORT": address,
            "MEMCACHE_TLS": "true",
            "MEMCACHE_TLS_CACERT": str(certs.ca),
            "MEMCACHE_TLS_CLIENT_CERT": str(certs.client[0]),
            "MEMCACHE_TLS_CLIENT_KEY": str(certs.client[1]),
            **extra,
        }
    )
    health = Health()
    backend = create_memcache_backend(settings, health)
    await backend.connect()
    return backend


async def test_tls_with_ca_and_client_certificate(memcached, certs: Pki) -> None:
    mc = start_tls(memcached, certs, certs.server)
    backend = await backend_for(certs, mc.address)
    try:
        assert await backend.increment([Op("k", 2, 60)]) == [2]
        await backend.flush()
        assert await backend.increment([Op("k", 1, 60)]) == [3]
        await backend.flush()
        assert mc.value("k") == 3
        assert backend.stats.counts["multiget.__code=success"] == 2
    finally:
        await backend.close()


async def test_tls_hostname_verification(memcached, certs: Pki) -> None:
    mc = start_tls(memcached, certs, certs.elsewhere)  # names elsewhere.test only
    strict = await backend_for(certs, mc.address)
    try:
        assert await strict.increment([Op("k", 1, 60)]) == [1]  # fails open
        await strict.flush()
        assert mc.value("k") is None
        assert strict.stats.counts["multiget.__code=error"] == 1
    finally:
        await strict.close()
    lax = await backend_for(certs, mc.address, MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION="true")
    try:
        await lax.increment([Op("k", 1, 60)])
        await lax.flush()
        assert mc.value("k") == 1
    finally:
        await lax.close()
