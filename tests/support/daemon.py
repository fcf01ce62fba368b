"""The daemon as users run it: `python -m ratelimitd serve` on free ports, and its clients;
`run_check_config`, its config checker.

`daemon_environment` is the environment of a daemon serving `<runtime_root>/config/*.yaml`;
RATELIMITD_WORKERS=N in it starts the supervisor and N workers (`worker_pids()` lists them).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from ratelimitd.messages import Response
from ratelimitd.transport.client import RateLimitClient

from .process import REPO, Proc, run, start_bound
from .ready import free_port, http_request
from .redis_server import RedisServer


def daemon_environment(runtime_root: Path, **overrides: str) -> dict[str, str]:
    """Environment for a daemon on free ports serving `runtime_root`/config/*.yaml.

    The caller's REDIS_* / MEMCACHE_* variables are dropped so they never leak into a test.
    """
    (runtime_root / "config").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "MEMCACHE_"))}
    env.update(
        HOST="127.0.0.1",
        GRPC_HOST="127.0.0.1",
        DEBUG_HOST="127.0.0.1",
        RUNTIME_ROOT=str(runtime_root),
        RUNTIME_SUBDIRECTORY="",
        RUNTIME_APPDIRECTORY="config",
        RUNTIME_WATCH_ROOT="false",
        USE_STATSD="false",
        LOG_LEVEL="info",
        PYTHONPATH=str(REPO),
    )
    return with_fresh_ports(env) | overrides


def prometheus_env() -> dict[str, str]:
    """The variables of a daemon serving Prometheus metrics (instead of statsd) on a free
    port: `metrics_port(env)` reads it back."""
    return {
        "USE_STATSD": "false",
        "USE_PROMETHEUS": "true",
        "PROMETHEUS_ADDR": f"127.0.0.1:{free_port()}",
    }


def metrics_port(env: dict[str, str]) -> int:
    """The port of PROMETHEUS_ADDR in `env`."""
    return int(env["PROMETHEUS_ADDR"].rpartition(":")[2])


def run_check_config(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m ratelimitd check-config *args` run from the repository root (`env`: its
    whole environment, default ours): exit status, stdout and stderr as text."""
    argv = (sys.executable, "-m", "ratelimitd", "check-config", *args)
    return run(*argv, env=env, timeout=timeout, preexec_fn=preexec_fn)


def write_config(env: dict[str, str], name: str, text: str) -> Path:
    """Write one config file where a daemon on `daemon_environment(...)` reads it."""
    path = Path(env["RUNTIME_ROOT"]) / "config" / name
    path.write_text(text)
    return path


def with_fresh_ports(env: dict[str, str]) -> dict[str, str]:
    """`env` with new free PORT, GRPC_PORT and DEBUG_PORT."""
    return env | {
        "PORT": str(free_port()),
        "GRPC_PORT": str(free_port()),
        "DEBUG_PORT": str(free_port()),
    }


class DaemonProcess(Proc):
    """A `ratelimitd serve` subprocess and clients for its three listeners."""

    name = "ratelimitd"

    def __init__(self, env: dict[str, str], log_path: Path, wrap: Sequence[str] = ()) -> None:
        self.http_port = int(env["PORT"])
        self.grpc_port = int(env["GRPC_PORT"])
        self.debug_port = int(env["DEBUG_PORT"])
        self._channel: grpc.Channel | None = None
        self._client: tuple[asyncio.AbstractEventLoop, RateLimitClient] | None = None
        # `wrap`: a command the daemon runs under (a profiler's, as bench/load/instructions.py).
        argv = [*wrap, sys.executable, "-m", "ratelimitd", "serve"]
        super().__init__(argv, log_path, env)

    @property
    def grpc_target(self) -> str:
        """host:port of the gRPC listener."""
        return f"127.0.0.1:{self.grpc_port}"

    def http(
        self, path: str, body: bytes | None = None, port: int | None = None, timeout: float = 10
    ) -> tuple[int, bytes]:
        """One HTTP request (POST with a body, else GET); (status, body)."""
        return http_request(f"http://127.0.0.1:{port or self.http_port}{path}", body, timeout)

    def debug(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        """One request to the debug server."""
        return self.http(path, port=self.debug_port, timeout=timeout)

    def stats(self) -> dict[str, float]:
        """The debug `/stats` page parsed."""
        _, body = self.debug("/stats")
        out = {}
        for line in body.decode().splitlines():
            name, _, value = line.rpartition(": ")
            out[name] = float(value)
        return out

    def profile(self, seconds: int) -> str:
        """The debug endpoint's cProfile report of the event-loop thread."""
        path = f"/debug/pprof/profile?seconds={seconds}"
        return self.debug(path, timeout=seconds + 60)[1].decode(errors="replace")

    def decide_json(self, domain: str, *descriptors: dict[str, str]) -> tuple[int, Any]:
        """POST /json with one descriptor per dict (entries in dict order)."""
        body = {
            "domain": domain,
            "descriptors": [
                {"entries": [{"key": k, "value": v} for k, v in d.items()]} for d in descriptors
            ],
        }
        status, raw = self.http("/json", json.dumps(body).encode())
        return status, json.loads(raw) if raw.startswith(b"{") else raw

    def channel(self) -> grpc.Channel:
        """A plaintext gRPC channel to the daemon (for its other services: health)."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.grpc_target)
        return self._channel

    def decide(
        self, domain: str, *descriptors: list[tuple[str, str]], hits_addend: int = 0
    ) -> Response:
        """ShouldRateLimit through the public client (ratelimitd.transport.client), from sync code;
        a failed call raises its RateLimitError."""
        if self._client is None:
            # One loop and client per daemon: the client keeps its channel between calls.
            self._client = (asyncio.new_event_loop(), RateLimitClient(self.grpc_target))
        loop, client = self._client
        call = client.should_rate_limit(domain, descriptors, hits_addend=hits_addend, timeout=10)
        return loop.run_until_complete(call)

    def ready(self) -> bool:
        """True once /healthcheck answers 200."""
        try:
            return self.http("/healthcheck", timeout=5)[0] == 200
        except OSError:
            return False

    def worker_pids(self) -> list[int]:
        """The workers of a RATELIMITD_WORKERS=N supervisor (its child processes)."""
        return self.children()

    def _release(self) -> None:
        if self._client is not None:
            loop, client = self._client
            loop.run_until_complete(client.close())
            loop.close()
            self._client = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        super()._release()


class LowNofileDaemon(DaemonProcess):
    """The daemon under a small open-file limit (soft = hard = `nofile`)."""

    def __init__(self, env: dict[str, str], log_path: Path, nofile: int) -> None:
        self.nofile = nofile
        super().__init__(env, log_path)

    def _spawn(self) -> None:
        limit = self.nofile
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
        )
        self.pid = self.proc.pid


def start_daemon(
    env: dict[str, str],
    log_dir: Path,
    name: str = "ratelimitd",
    wrap: Sequence[str] = (),
    timeout: float = 20.0,
) -> DaemonProcess:
    """A ready daemon with `env` on fresh free ports (retried if another process took one),
    run under the command `wrap` if any."""

    def spawn() -> DaemonProcess:
        fresh = with_fresh_ports(env)
        daemon = DaemonProcess(fresh, log_dir / f"daemon-{fresh['GRPC_PORT']}.log", wrap)
        daemon.name = name
        return daemon

    return start_bound(spawn, timeout=timeout)


def start_redis_daemon(
    root: Path, redis_address: str, config: str, **overrides: str
) -> DaemonProcess:
    """A ready daemon on the Redis at `redis_address` (host:port) serving `config` (YAML text,
    as api.yaml) from `root`/runtime, logging warnings; `overrides` are more variables."""
    env = daemon_environment(
        root / "runtime",
        LOG_LEVEL="warning",
        BACKEND_TYPE="redis",
        REDIS_SOCKET_TYPE="tcp",
        REDIS_URL=redis_address,
        **overrides,
    )
    write_config(env, "api.yaml", config)
    return start_daemon(env, root)


def redis_and_daemon(
    root: Path, procs: list[Proc], config: str
) -> tuple[RedisServer, DaemonProcess]:
    """A redis-server and a daemon on it serving `config`, both added to `procs` (to be
    stopped with them, as `process.scratch` does)."""
    redis = start_bound(lambda: RedisServer(root / "redis"))
    procs.append(redis)
    daemon = start_redis_daemon(root, redis.address, config)
    procs.append(daemon)
    return redis, daemon
