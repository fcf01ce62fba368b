"""wrk runs for the HTTP load benchmarks, summarised by a Lua `done` hook as one JSON line.

Latencies are wrk's own histogram (send to reply), in milliseconds; `errors` counts socket
errors and timeouts, `non2xx` the answers with another status.
"""

from __future__ import annotations

import json
import subprocess
import tempfile

from .process import binary

REPORT = """
done = function(summary, latency, requests)
  io.write(string.format(
    '{"requests": %d, "seconds": %.6f, "errors": %d, "non2xx": %d, "mean_ms": %.4f, '
    .. '"p50_ms": %.4f, "p99_ms": %.4f, "p999_ms": %.4f}\\n',
    summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout,
    summary.errors.status,
    latency.mean / 1000, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000))
end
"""


def script(headers: dict[str, str] | None = None, body: bytes | None = None) -> str:
    """The Lua script: GET (or POST `body`) with `headers`, and the JSON summary at the end."""
    lines = []
    if body is not None:
        lines += ['wrk.method = "POST"', f"wrk.body = {json.dumps(body.decode())}"]
    for name, value in (headers or {}).items():
        lines.append(f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}")
    return "\n".join(lines) + REPORT


def run_wrk(
    url: str,
    seconds: float,
    connections: int = 32,
    threads: int = 1,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> dict[str, float]:
    """`wrk -t<threads> -c<connections> -d<seconds>s` against `url`: the summary, plus rps."""
    wrk = binary("wrk", "apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script(headers, body))
        lua.flush()
        argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s"]
        out = subprocess.run(
            [*argv, "-s", lua.name, url], capture_output=True, text=True, check=True, timeout=600
        )
    summary: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    summary["rps"] = summary["requests"] / summary["seconds"]
    return summary
