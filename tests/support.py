"""Helpers every server-starting fixture shares (on sys.path via pytest's `pythonpath`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.protocodec import decode_response, encode_request

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll until `predicate()` is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def daemon_environment(runtime_root: Path) -> dict[str, str]:
    """Environment for a daemon on free ports serving `runtime_root`/config/*.yaml."""
    (runtime_root / "config").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "MEMCACHE_"))}
    env.update(
        PORT=str(free_port()),
        GRPC_PORT=str(free_port()),
        DEBUG_PORT=str(free_port()),
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
    return env


class DaemonProcess:
    """A `ratelimitd serve` subprocess and clients for its three listeners."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.http_port = int(env["PORT"])
        self.grpc_port = int(env["GRPC_PORT"])
        self.debug_port = int(env["DEBUG_PORT"])
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ratelimitd", "serve"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._channel: grpc.Channel | None = None

    def log(self) -> str:
        """Everything the daemon printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def http(
        self, path: str, body: bytes | None = None, port: int | None = None
    ) -> tuple[int, bytes]:
        """One HTTP request; (status, body)."""
        url = f"http://127.0.0.1:{port or self.http_port}{path}"
        req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def debug(self, path: str) -> tuple[int, bytes]:
        """One request to the debug server."""
        return self.http(path, port=self.debug_port)

    def stats(self) -> dict[str, float]:
        """The debug `/stats` page parsed."""
        _, body = self.debug("/stats")
        out = {}
        for line in body.decode().splitlines():
            name, _, value = line.rpartition(": ")
            out[name] = float(value)
        return out

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
        """A plaintext gRPC channel to the daemon."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        return self._channel

    def decide(self, domain: str, *descriptors: list[tuple[str, str]], hits_addend: int = 0):  # type: ignore[no-untyped-def]
        """ShouldRateLimit over gRPC; the decoded messages.Response."""
        call = self.channel().unary_unary(METHOD_PATH)
        raw = call(encode_request(domain, descriptors, hits_addend), timeout=10)
        return decode_response(raw)

    def ready(self) -> bool:
        """True once /healthcheck answers 200."""
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return self.http("/healthcheck")[0] == 200
        except OSError:
            return False

    def wait_ready(self) -> DaemonProcess:
        """Block until the daemon serves."""
        wait_for(self.ready, what="daemon readiness")
        return self

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Kill whatever is left."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()
