"""gRPC load with h2load (nghttp2-client), a C HTTP/2 generator, pinned to its own core.

The Python generator of `grpc_load.py` costs more CPU per call than the native transport
does, so past a few thousand calls/s it, not the server, sets the pace. h2load does not: it
sends one-descriptor ShouldRateLimit calls (the framed request body, `content-type:
application/grpc`, `te: trailers`) over `clients` connections x `streams` concurrent streams,
pinned with `taskset` to `load_cpu` while the server is pinned to `server_cpu`.

Per-request latencies come from h2load's --log-file; decisions/s from the requests answered
in the timed window; server CPU from /proc (the `cpu` probe) around the timed run; Redis
round trips from a probe of `ratelimit.redis_pool.pipeline_writes` (the daemon's debug
/stats).

The warm-up is a run of its own, discarded, before the timed one: h2load's own
`--warm-up-time` (nghttp2 1.52) stalls at the switch to the timed window when requests carry
a body (`--data`) and a connection has more than one stream in flight (`-m` > 1): the
connection goes quiet and the timed window counts 0 requests, which the ratios then divide
by. It does not happen with `-m 1`, with body-less GETs, or when h2load runs slowed down
(under strace): a race at the phase switch, not something the server does. h2load also
takes durations in whole units only ("0.5" is refused): they are passed in milliseconds.
gRPC errors travel in trailers, which h2load does not read: the runner checks one call with
a real gRPC client before measuring (`grpc_load.measure`).

    .venv/bin/python bench/load/h2load_load.py --port 8081 --pid 1234 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from grpc_load import LoadResult, request_bytes

from ratelimitd.transport.protocodec import METHOD_PATH


def framed(message: bytes) -> bytes:
    """A gRPC length-prefixed, uncompressed message."""
    return b"\x00" + struct.pack(">I", len(message)) + message


def pin(pid: int, cpu: int, tree: Callable[[int], list[int]] | None = None) -> None:
    """Pin every thread of `pid` (and its descendants, via `tree`) to one CPU."""
    for p in tree(pid) if tree is not None else [pid]:
        subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(p)], capture_output=True)


def run_h2load(
    port: int,
    payload: bytes | None,
    *,
    seconds: float,
    warmup: float = 1.0,
    clients: int = 4,
    streams: int = 32,
    rate: float | None = None,
    load_cpu: int | None = 1,
    cpu: Callable[[], float] | None = None,
    probe: Callable[[], float] | None = None,
    host: str = "127.0.0.1",
    requests: int | None = None,
    path: str = METHOD_PATH,
    h1: bool = False,
) -> LoadResult:
    """One timed h2load run after a discarded one of `warmup` seconds (or one run of exactly
    `requests` calls, no warm-up); `probe` counts
    something (Redis round trips) per decision. A `payload` of None sends plain GETs of
    `path` (over HTTP/1.1 with `h1`, e.g. to Envoy's listener); `load_cpu` None: unpinned."""
    binary = shutil.which("h2load")
    if binary is None:
        raise FileNotFoundError("h2load (apt-get install nghttp2-client)")
    with tempfile.TemporaryDirectory(prefix="h2load-") as tmp:
        log = Path(tmp) / "requests.log"
        argv = [] if load_cpu is None else ["taskset", "-c", str(load_cpu)]
        argv += [binary, "-c", str(clients), "-m", str(streams), "-t", "1"]
        if h1:
            argv.append("--h1")
        if payload is not None:
            body = Path(tmp) / "request.bin"
            body.write_bytes(framed(payload))
            argv += [f"--data={body}", "-H", "content-type: application/grpc"]
            argv += ["-H", "te: trailers"]
        if rate is not None:
            argv.append(f"--rps={max(1.0, rate / clients):g}")
        url = f"http://{host}:{port}{path}"
        if requests is None and warmup > 0:
            # Not --warm-up-time: see the module docstring.
            _h2load([*argv, f"--duration={_ms(warmup)}", url], warmup)
        length = [f"--duration={_ms(seconds)}"] if requests is None else ["-n", str(requests)]
        argv += [*length, "--log-file", str(log), url]
        cpu0 = cpu() if cpu is not None else 0.0
        probe0 = probe() if probe is not None else 0.0
        started = time.monotonic()
        out = _h2load(argv, seconds)
        if requests is not None:
            seconds = time.monotonic() - started
        cpu1 = cpu() if cpu is not None else 0.0
        probe1 = probe() if probe is not None else 0.0
        latencies, failed = _read_log(log)
    result = LoadResult.of_latencies(latencies, failed, seconds, rate)
    result.error_codes = {"non-200": failed} if failed else {}
    # CPU and the probe were read around the timed run alone: per request it finished
    # (those h2load abandoned when its time was up included).
    done = _finished(out) or result.requests + failed
    if cpu is not None and done:
        result.server_cpu_s = cpu1 - cpu0
        result.cpu_per_10k = result.server_cpu_s / done * 10_000
    if probe is not None and done:
        result.redis_writes_per_decision = (probe1 - probe0) / done
    return result


def _ms(seconds: float) -> str:
    """A duration as h2load takes it (whole units only)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _h2load(argv: list[str], seconds: float) -> str:
    """Run h2load; its report (stdout)."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 900)
    if out.returncode != 0:
        raise RuntimeError(f"h2load failed: {out.stderr or out.stdout}")
    return out.stdout


def _read_log(path: Path) -> tuple[list[float], int]:
    """(sorted latencies in seconds of the 200 answers, number of other answers)."""
    latencies: list[float] = []
    failed = 0
    with open(path) as f:
        for line in f:
            fields = line.split("\t")
            if len(fields) < 3:
                continue
            if fields[1] == "200":
                latencies.append(int(fields[2]) / 1e6)
            else:
                failed += 1
    latencies.sort()
    return latencies, failed


def _finished(report: str) -> int:
    """Requests h2load finished (its `requests:` summary line)."""
    for line in report.splitlines():
        if line.startswith("requests:"):
            # "requests: 1000 total, 1000 started, 1000 done, 1000 succeeded, ..."
            parts = line.split()
            return int(parts[parts.index("done,") - 1])
    return 0


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, help="server pid: pin it to --server-cpu, count CPU")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--load-cpu", type=int, default=1)
    args = parser.parse_args()
    from harness import DESCRIPTOR, DOMAIN
    from support.process import cpu_seconds, process_tree

    cpu = None
    if args.pid:
        pin(args.pid, args.server_cpu, process_tree)
        cpu = lambda: cpu_seconds(process_tree(args.pid))  # noqa: E731
    result = run_h2load(
        args.port,
        request_bytes(DOMAIN, DESCRIPTOR),
        seconds=args.seconds,
        clients=args.clients,
        streams=args.streams,
        rate=args.rate,
        load_cpu=args.load_cpu,
        cpu=cpu,
    )
    json.dump(result.summary(), sys.stdout, indent=2)
    print(file=sys.stdout)


if __name__ == "__main__":
    main()
