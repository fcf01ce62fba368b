"""What the load benchmarks start and measure, on top of the shared helpers in tests/support:
the one-rule bench daemon, the empty RLS server, Envoy in front of an RLS, wrk, and Redis
writes per decision.

Every server binds free ports and is polled for readiness (support.process.start_bound); every
process runs in its own session and is stopped by its pid.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from support.daemon import DaemonProcess, daemon_environment, start_daemon
from support.envoy_server import Envoy, start_envoy
from support.process import Proc, start_bound
from support.ready import free_port, port_open
from support.redis_server import RedisServer

HERE = Path(__file__).resolve().parent
DOMAIN = "bench"
# One descriptor, as Envoy's `generic_key` action sends it; a limit no run reaches. `user`
# (any value, one counter per value) is for the runs whose values differ per call.
DESCRIPTOR = (("generic_key", DOMAIN),)
RULES = f"""\
domain: {DOMAIN}
descriptors:
  - key: generic_key
    value: {DOMAIN}
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
"""
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


def start_redis(workdir: Path, store: str = "redis") -> RedisServer:
    """redis-server (or `store`'s server: support.redis_server.STORES) on a free port, no
    persistence."""
    return start_bound(lambda: RedisServer(workdir / store, store=store))


def start_bench_daemon(
    name: str, workdir: Path, wrap: Sequence[str] = (), **env_overrides: str
) -> DaemonProcess:
    """`python -m ratelimitd serve` on free ports with the one-rule bench config (under the
    command `wrap`, e.g. callgrind, if any)."""
    root = workdir / f"runtime-{name}"
    env = daemon_environment(
        root,
        # No stats sink: the decision path alone (counters are still kept). The sinks' own
        # cost is bench/observability.py's subject; --daemon-env brings one back.
        DISABLE_STATS="true",
        BACKEND_TYPE="memory",
        LOG_LEVEL="warn",
        DEBUG_PROFILE_ENABLED="true",  # run_all.py profiles a server under load
    )
    (root / "config" / "bench.yaml").write_text(RULES)
    timeout = 300.0 if wrap else 20.0  # a start under valgrind takes minutes
    return start_daemon(
        env | env_overrides, workdir, name=f"ratelimitd ({name})", wrap=wrap, timeout=timeout
    )


def start_bench_envoy(workdir: Path, rls_port: int | None) -> Envoy:
    """Envoy --concurrency 1: ingress -> (ratelimit filter when `rls_port`) -> direct_response.

    `failure_mode_deny: true` and a 1 s timeout: a failed decision is a failed request.
    """
    routes = {"/": [[f'generic_key: {{ descriptor_value: "{DOMAIN}" }}']]}
    return start_envoy(
        workdir, rls_port, domain=DOMAIN, routes=routes, failure_mode_deny=True, timeout="1s"
    )


class EmptyServer(Proc):
    """bench/load/empty_server.py: the grpc.aio transport ceiling."""

    name = "empty grpc.aio server"

    def __init__(self, workdir: Path) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        argv = [sys.executable, str(HERE / "empty_server.py"), "--port", str(self.grpc_port)]
        argv += ["--http-port", str(self.http_port)]
        super().__init__(argv, workdir / f"empty-server-{self.grpc_port}.log")

    def ready(self) -> bool:
        """True once both listeners accept connections."""
        return port_open(self.grpc_port) and port_open(self.http_port)


def start_empty_server(workdir: Path) -> EmptyServer:
    """The empty RLS server on free ports."""
    return start_bound(lambda: EmptyServer(workdir))


class EmptyNativeServer(Proc):
    """bench/load/empty_native.py: the native transport's ceiling (fixed reply)."""

    name = "empty native server"

    def __init__(self, workdir: Path, wrap: Sequence[str] = ()) -> None:
        self.grpc_port = free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        argv = [*wrap, sys.executable, str(HERE / "empty_native.py"), "--port", str(self.grpc_port)]
        super().__init__(argv, workdir / f"empty-native-{self.grpc_port}.log")

    def ready(self) -> bool:
        """True once the listener accepts connections."""
        return port_open(self.grpc_port)
