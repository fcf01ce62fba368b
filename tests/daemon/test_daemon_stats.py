"""Statistics leave the daemon through the configured sink (statsd over TCP, Prometheus)."""

from __future__ import annotations

import socket
import threading
import urllib.request

from support import free_port, wait_for
from support.daemon import write_config

CONFIG = """\
domain: test
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


class TcpCollector:
    """A statsd-over-TCP server that keeps every line it receives."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while chunk := conn.recv(65536):
                buf += chunk
                *done, buf = buf.split(b"\n")
                self.lines += [line.decode() for line in done]

    def close(self) -> None:
        self.sock.close()


def test_statsd_sink_receives_the_reference_names(daemon_env, start_daemon) -> None:
    collector = TcpCollector()
    try:
        write_config(daemon_env, "test.yaml", CONFIG)
        env = dict(
            daemon_env,
            USE_STATSD="true",
            STATSD_HOST="127.0.0.1",
            STATSD_PORT=str(collector.port),
            STATS_FLUSH_INTERVAL="200ms",
            EXTRA_TAGS="region:eu",
        )
        d = start_daemon(env)
        for _ in range(3):
            d.decide("test", [("user", "alice")])
        name = "ratelimit.service.rate_limit.test.user.over_limit.__region=eu"
        wait_for(lambda: any(line.startswith(name + ":") for line in collector.lines), what=name)
        sent = {line.rsplit(":", 1)[0]: line for line in collector.lines}
        assert sent["ratelimit.service.rate_limit.test.user.total_hits.__region=eu"].endswith("|c")
        assert "ratelimit_server.ShouldRateLimit.total_requests.__region=eu" in sent
        assert d.terminate() == 0
    finally:
        collector.close()


def test_prometheus_endpoint_serves_the_default_mapping(daemon_env, start_daemon) -> None:
    write_config(daemon_env, "test.yaml", CONFIG)
    port = free_port()
    env = dict(
        daemon_env,
        USE_STATSD="false",
        USE_PROMETHEUS="true",
        PROMETHEUS_ADDR=f"127.0.0.1:{port}",
    )
    d = start_daemon(env)
    for _ in range(2):
        d.decide("test", [("user", "bob")])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    assert "ratelimit_service_rate_limit_total_hits" in body
    assert 'domain="test"' in body and 'key1="user"' in body
    assert d.terminate() == 0
