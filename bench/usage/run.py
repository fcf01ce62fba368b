"""Usage API load benchmark: wrk against the app under gunicorn (2 uvicorn workers) on Redis.

    .venv/bin/python bench/usage/run.py [--duration 10] [--repeats 3] [--out ...results.json]

Starts its own redis-server, ratelimitd (BACKEND_TYPE=redis, `meter: true`, limits far above
the load) and the sidecar on free ports, issues a token with the CLI, then runs /usr/bin/wrk:

- throughput: `wrk -t2 -c64 --latency` for requests/s and p99, middleware off and on;
- added latency: `wrk -t1 -c1 --latency` (one request at a time), middleware off and on; the
  difference of the mean latencies is what the middleware adds per request (token lookup
  moves from the resource into it, so it adds the gRPC decision and the cached quota check).

"off" is USAGE_RATE_LIMIT=false (no middleware: the resource authenticates); "on" is the
default middleware with USAGE_QUOTA_EXEMPT_PATHS="" so the quota check runs on every request.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WRK = "/usr/bin/wrk"
CONFIG = """
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: account
    meter: true
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: plan
    value: pro
    descriptors:
      - key: account
        rate_limit: {unit: second, requests_per_unit: 1000000000}
"""
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    """Poll until predicate() is true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def http_ok(url: str) -> bool:
    """True when url answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


class Proc:
    """A subprocess in its own session, output drained into memory."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.p = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line)

    def stop(self) -> None:
        """SIGTERM the session; SIGKILL if it lingers."""
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def sidecar(env: dict[str, str]) -> tuple[Proc, str]:
    """`python -m sidecars.usage serve` with 2 workers on port 0; (process, base URL)."""
    full = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "USAGE_HOST": "127.0.0.1",
        "USAGE_PORT": "0",
        "USAGE_WORKERS": "2",
        "USAGE_LOG_LEVEL": "info",
        **env,
    }
    proc = Proc([sys.executable, "-m", "sidecars.usage", "serve"], full)
    port: list[str] = []

    def listening() -> bool:
        if proc.p.poll() is not None:
            raise SystemExit("sidecar exited:\n" + "".join(proc.lines))
        for line in proc.lines:
            m = re.search(r"Listening at: http://127\.0\.0\.1:(\d+)", line)
            if m:
                port.append(m.group(1))
                return True
        return False

    try:
        wait_for(listening, what="gunicorn")
        base = f"http://127.0.0.1:{port[0]}"
        wait_for(lambda: http_ok(base + "/health"), what="usage API health")
    except BaseException:
        proc.stop()  # never leave a server behind a failed start
        raise
    return proc, base


def wrk(url: str, token: str, threads: int, conns: int, duration: int) -> dict[str, float]:
    """Run wrk; requests/s, mean/p50/p99 latency in ms, non-2xx count."""
    out = subprocess.run(
        [
            WRK,
            f"-t{threads}",
            f"-c{conns}",
            f"-d{duration}s",
            "--latency",
            "-H",
            f"Authorization: Bearer {token}",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def ms(text: str) -> float:
        m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
        assert m, text
        return float(m.group(1)) * UNITS[m.group(2)]

    mean = re.search(r"^\s+Latency\s+(\S+)", out, re.M)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    assert mean and p50 and p99 and rps, out
    return {
        "rps": float(rps.group(1)),
        "mean_ms": ms(mean.group(1)),
        "p50_ms": ms(p50.group(1)),
        "p99_ms": ms(p99.group(1)),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
    }


def main() -> None:
    """Run the benchmark and print/write the JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "usage" / "results.json"))
    args = ap.parse_args()
    redis_bin = shutil.which("redis-server")
    if redis_bin is None or not Path(WRK).exists():
        raise SystemExit("needs redis-server and /usr/bin/wrk")
    tmp = Path(tempfile.mkdtemp(prefix="usage-bench-"))
    procs: list[Proc] = []
    try:
        rport = free_port()
        procs.append(
            Proc(
                [
                    redis_bin,
                    "--port",
                    str(rport),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(tmp),
                ],
                dict(os.environ),
            )
        )
        (tmp / "runtime" / "config").mkdir(parents=True)
        (tmp / "runtime" / "config" / "api.yaml").write_text(CONFIG)
        http, grpc_port = free_port(), free_port()
        denv = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_")}
        denv.update(
            PORT=str(http),
            GRPC_PORT=str(grpc_port),
            DEBUG_PORT=str(free_port()),
            HOST="127.0.0.1",
            GRPC_HOST="127.0.0.1",
            DEBUG_HOST="127.0.0.1",
            RUNTIME_ROOT=str(tmp / "runtime"),
            RUNTIME_SUBDIRECTORY="",
            RUNTIME_APPDIRECTORY="config",
            RUNTIME_WATCH_ROOT="false",
            USE_STATSD="false",
            LOG_LEVEL="warning",
            BACKEND_TYPE="redis",
            REDIS_SOCKET_TYPE="tcp",
            REDIS_URL=f"127.0.0.1:{rport}",
            PYTHONPATH=str(REPO),
        )
        procs.append(Proc([sys.executable, "-m", "ratelimitd", "serve"], denv))
        wait_for(lambda: http_ok(f"http://127.0.0.1:{http}/healthcheck"), what="ratelimitd")

        redis_url = f"redis://127.0.0.1:{rport}/0"
        cenv = {**os.environ, "PYTHONPATH": str(REPO), "USAGE_REDIS_URL": redis_url}
        cli = [sys.executable, "-m", "sidecars.usage"]
        subprocess.run(
            [*cli, "accounts", "create", "bench", "--plan", "pro"],
            env=cenv,
            check=True,
            capture_output=True,
        )
        issued = subprocess.run(
            [*cli, "tokens", "issue", "bench"], env=cenv, check=True, capture_output=True, text=True
        )
        token = json.loads(issued.stdout)["token"]

        modes = {
            "off": {"USAGE_REDIS_URL": redis_url, "USAGE_RATE_LIMIT": "false"},
            "on": {
                "USAGE_REDIS_URL": redis_url,
                "USAGE_RATELIMIT_ADDRESS": f"127.0.0.1:{grpc_port}",
                "USAGE_QUOTA_EXEMPT_PATHS": "",
            },
        }
        # Both servers run side by side and the rounds alternate between them, so a change in
        # the shared machine's load hits both modes alike; medians over the rounds are quoted.
        servers: dict[str, tuple[Proc, str]] = {}
        for name, env in modes.items():
            servers[name] = sidecar(env)
            procs.append(servers[name][0])
        rounds: dict[str, dict[str, list[dict[str, float]]]] = {
            name: {"throughput_t2_c64": [], "serial_t1_c1": []} for name in modes
        }
        load_before = os.getloadavg()
        for _, base in servers.values():
            wrk(base + "/api/v2/user/usage", token, 2, 64, 2)  # warm-up: pools, caches
        for _ in range(args.repeats):
            for name, (_, base) in servers.items():
                url = base + "/api/v2/user/usage"
                rounds[name]["throughput_t2_c64"].append(wrk(url, token, 2, 64, args.duration))
                rounds[name]["serial_t1_c1"].append(wrk(url, token, 1, 1, args.duration))
        results: dict[str, Any] = {}
        for name, tests in rounds.items():
            results[name] = {
                test: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                for test, runs in tests.items()
            }
        results["rounds"] = rounds
        off, on = results["off"]["serial_t1_c1"], results["on"]["serial_t1_c1"]
        results["middleware_added_ms"] = {
            "mean": round(on["mean_ms"] - off["mean_ms"], 3),
            "p50": round(on["p50_ms"] - off["p50_ms"], 3),
            "p99": round(on["p99_ms"] - off["p99_ms"], 3),
        }
        redis_version = subprocess.run(
            [redis_bin, "--version"], capture_output=True, text=True
        ).stdout.split()[2]
        results["machine"] = {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "redis": redis_version,
            "gunicorn_workers": 2,
            "duration_s": args.duration,
            "repeats": args.repeats,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        }
        text = json.dumps(results, indent=2)
        print(text)
        Path(args.out).write_text(text + "\n")
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
