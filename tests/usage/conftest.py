"""Real servers for the usage API tests: redis-server, ratelimitd, the app under gunicorn
(all from tests/support), on free ports and polled for readiness."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support.core import suite_config
from support.daemon import DaemonProcess, start_redis_daemon
from support.postgres_server import PostgresServer
from support.process import REPO, start_bound
from support.redis_server import RedisServer
from support.sidecar import Gunicorn, usage_database, usage_sidecar

from sidecars.usage.settings import Settings

from .usage_helpers import OPEN_STORES, session_sqlite_path, settings_for

RATELIMIT_CONFIG = REPO / "sidecars" / "usage" / "ratelimit-config.yaml"

# The test ratelimitd config: the shipped rules with rates high enough that only the tests
# that mean to hit a limit do. api: remote_address 100000/min, account 100000/s, plan free
# with account `tight` 3/min (other accounts 100000/s).
TEST_CONFIG = suite_config("usage_daemon")


def start_sidecar(env: dict[str, str], log_path: Path, workers: int = 2) -> Gunicorn:
    """The usage API under gunicorn, ready once /health answers (200 or 503: it reports
    Redis, not the server)."""
    sidecar = usage_sidecar(env, log_path, workers)
    sidecar.wait_ready(60)
    sidecar.wait_steady(
        lambda: sidecar.get("/health").status_code in (200, 503), "the usage API", times=1
    )
    return sidecar


@pytest.fixture(autouse=True)
async def close_stores() -> AsyncIterator[None]:
    """Close what a test's `client_for` stores left open (a failed assertion skips the
    test's own close, and the loop would then never finish closing)."""
    yield
    while OPEN_STORES:
        store = OPEN_STORES.pop()
        with contextlib.suppress(Exception):
            await store.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session; tests use distinct account ids."""
    server = start_bound(lambda: RedisServer(tmp_path_factory.mktemp("redis")))
    yield server
    server.close()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session; tests create their own databases."""
    server = start_bound(lambda: PostgresServer(tmp_path_factory.mktemp("postgres")))
    yield server
    server.close()


BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def db_settings(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer
) -> Settings:
    """Settings naming a fresh, empty database of each kind (and the session's Redis)."""
    base = settings_for(redis_server.url)
    db = usage_database(request.param, tmp_path, postgres_for(request))
    return dataclasses.replace(
        base,
        sqlite_path=db.get("USAGE_SQLITE_PATH", base.sqlite_path),
        postgres_dsn=db.get("USAGE_POSTGRES_DSN", ""),
    )


def postgres_for(request: pytest.FixtureRequest) -> PostgresServer | None:
    """The session's PostgreSQL server when the test is parametrised for it (started then)."""
    return request.getfixturevalue("postgres_server") if request.param == "postgres" else None


@pytest.fixture(scope="session")
def daemon(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    """ratelimitd on the session's Redis, metering the account rule (TEST_CONFIG)."""
    d = start_redis_daemon(tmp_path_factory.mktemp("ratelimitd"), redis_server.address, TEST_CONFIG)
    yield d
    d.close()


@pytest.fixture(scope="session")
def sidecar_env(redis_server: RedisServer, daemon: DaemonProcess) -> dict[str, str]:
    """USAGE_* settings pointing at the session's Redis and ratelimitd."""
    return {
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_SQLITE_PATH": session_sqlite_path(),
        "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
        # Generous: on a loaded machine a slow answer must not become a 503 or an unmetered
        # fail-open decision.
        "USAGE_RATELIMIT_TIMEOUT_SECONDS": "2",
        "USAGE_REDIS_TIMEOUT_SECONDS": "2",
        # All the session's calls come from 127.0.0.1, schemathesis's invalid tokens too: only
        # the abuse tests (with their own limit) mean to hit this one.
        "USAGE_INVALID_TOKEN_LIMIT": "1000000",
    }


@pytest.fixture(scope="session")
def sidecar(
    sidecar_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gunicorn]:
    """The usage API under gunicorn, 2 uvicorn workers, default quota settings."""
    s = start_sidecar(sidecar_env, tmp_path_factory.mktemp("usage") / "gunicorn.log")
    yield s
    s.terminate()


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts connections (kernel backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]
