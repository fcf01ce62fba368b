"""Real servers for the usage API tests: redis-server, ratelimitd, the app under gunicorn.

Each is started on free ports and polled for readiness; a missing redis-server fails the run.
The pieces copied from tests/daemon/conftest.py are deliberately small (no cross-conftest
imports).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from support import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
RATELIMIT_CONFIG = REPO / "sidecars" / "usage" / "ratelimit-config.yaml"
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")

# The test ratelimitd config: the shipped rules with rates high enough that only the tests
# that mean to hit a limit do (`tight` accounts: 3 per minute).
TEST_CONFIG = """
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100000}
  - key: account
    meter: true
    rate_limit: {unit: second, requests_per_unit: 100000}
  - key: plan
    value: free
    descriptors:
      - key: account
        value: tight
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: account
        rate_limit: {unit: second, requests_per_unit: 100000}
"""


class RedisServer:
    """A redis-server subprocess on a free port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            wait_for(self._ping, what="redis-server")
        except BaseException:
            self.stop()  # never leave a server behind a failed start
            raise

    @property
    def url(self) -> str:
        """The URL the sidecar uses."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _ping(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited")
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        """Kill it."""
        self.client.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Process:
    """A subprocess in its own session whose output is drained into a list of lines."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        """Everything printed so far."""
        return "".join(self.lines)

    def alive(self) -> bool:
        """Raise with the output if the process exited."""
        if self.proc.poll() is not None:
            raise AssertionError(f"exited with {self.proc.returncode}:\n{self.output()}")
        return True

    def stop(self) -> None:
        """SIGTERM the session, SIGKILL what is left."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._reader.join(5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class Daemon(Process):
    """`python -m ratelimitd serve` on Redis with TEST_CONFIG."""

    def __init__(self, root: Path, redis_port: int) -> None:
        (root / "config").mkdir(parents=True, exist_ok=True)
        (root / "config" / "api.yaml").write_text(TEST_CONFIG)
        self.http_port, self.grpc_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "MEMCACHE_"))}
        env.update(
            PORT=str(self.http_port),
            GRPC_PORT=str(self.grpc_port),
            DEBUG_PORT=str(free_port()),
            HOST="127.0.0.1",
            GRPC_HOST="127.0.0.1",
            DEBUG_HOST="127.0.0.1",
            RUNTIME_ROOT=str(root),
            RUNTIME_SUBDIRECTORY="",
            RUNTIME_APPDIRECTORY="config",
            RUNTIME_WATCH_ROOT="false",
            USE_STATSD="false",
            LOG_LEVEL="warning",
            BACKEND_TYPE="redis",
            REDIS_SOCKET_TYPE="tcp",
            REDIS_URL=f"127.0.0.1:{redis_port}",
            PYTHONPATH=str(REPO),
        )
        super().__init__([sys.executable, "-m", "ratelimitd", "serve"], env)
        try:
            wait_for(self.ready, what="ratelimitd readiness")
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        """host:port of the gRPC listener."""
        return f"127.0.0.1:{self.grpc_port}"

    def ready(self) -> bool:
        """True once /healthcheck answers 200."""
        self.alive()
        try:
            url = f"http://127.0.0.1:{self.http_port}/healthcheck"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False


class Sidecar(Process):
    """`python -m sidecars.usage serve` on port 0 (gunicorn reports the port it bound)."""

    def __init__(self, env: dict[str, str], workers: int = 2) -> None:
        full = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "USAGE_HOST": "127.0.0.1",
            "USAGE_PORT": "0",
            "USAGE_WORKERS": str(workers),
            # gunicorn reports the bound port ("Listening at") at info level.
            "USAGE_LOG_LEVEL": "info",
            **env,
        }
        super().__init__([sys.executable, "-m", "sidecars.usage", "serve"], full)
        try:
            wait_for(self._port, timeout=60, what="gunicorn to listen")
            self.base = f"http://127.0.0.1:{self.port}"
            wait_for(self.ready, timeout=60, what="the usage API")
        except BaseException as exc:
            self.stop()
            raise AssertionError(f"{exc}:\n{self.output()}") from exc

    def _port(self) -> bool:
        self.alive()
        for line in self.lines:
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
                return True
        return False

    def ready(self) -> bool:
        """True once /health answers (any status: it reports Redis, not the server)."""
        self.alive()
        try:
            return httpx.get(self.base + "/health", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session; tests use distinct account ids."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def daemon(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """ratelimitd on the session's Redis, metering the account rule."""
    d = Daemon(tmp_path_factory.mktemp("runtime"), redis_server.port)
    yield d
    d.stop()


@pytest.fixture(scope="session")
def sidecar_env(redis_server: RedisServer, daemon: Daemon) -> dict[str, str]:
    """USAGE_* settings pointing at the session's Redis and ratelimitd."""
    return {
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_RATELIMIT_ADDRESS": daemon.address,
        # Generous: on a loaded machine a slow answer must not become a 503 or an unmetered
        # fail-open decision.
        "USAGE_RATELIMIT_TIMEOUT_SECONDS": "2",
        "USAGE_REDIS_TIMEOUT_SECONDS": "2",
    }


@pytest.fixture(scope="session")
def sidecar(sidecar_env: dict[str, str]) -> Iterator[Sidecar]:
    """The usage API under gunicorn, 2 uvicorn workers, default quota settings."""
    s = Sidecar(sidecar_env)
    yield s
    s.stop()
