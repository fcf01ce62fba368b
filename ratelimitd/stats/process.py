"""The process metrics every Prometheus client library exports (`process_*`), from /proc.

The Go service's Prometheus endpoint carries them through client_golang's process collector,
and dashboards built for it (Envoy Gateway's "Global Ratelimit" among them) chart its memory
with `process_resident_memory_bytes`. The names, types and help texts are client_golang's.
With RATELIMITD_WORKERS > 1 the scrape shows the daemon as a whole: sizes, CPU and
descriptors add up over the workers, the start time is the oldest worker's, and the
descriptor limit is the largest.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable

from .base import number

# name -> (type, help, how two processes' values combine)
METRICS: dict[str, tuple[str, str, str]] = {
    "process_cpu_seconds_total": (
        "counter",
        "Total user and system CPU time spent in seconds.",
        "sum",
    ),
    "process_open_fds": ("gauge", "Number of open file descriptors.", "sum"),
    "process_max_fds": ("gauge", "Maximum number of open file descriptors.", "max"),
    "process_virtual_memory_bytes": ("gauge", "Virtual memory size in bytes.", "sum"),
    "process_resident_memory_bytes": ("gauge", "Resident memory size in bytes.", "sum"),
    "process_start_time_seconds": (
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        "min",
    ),
}
_COMBINE: dict[str, Callable[[float, float], float]] = {
    "sum": lambda a, b: a + b,
    "max": max,
    "min": min,
}
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _boot_time() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return time.time() - time.monotonic()


def read() -> dict[str, float]:
    """This process's values now (empty where /proc cannot be read)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            # Fields after the command name, which is in parentheses and may hold spaces.
            fields = f.read().rsplit(b")", 1)[1].split()
        open_fds = len(os.listdir("/proc/self/fd"))
        boot = _boot_time()
    except (OSError, IndexError, ValueError):
        return {}
    # fields[0] is field 3 of proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    return {
        "process_cpu_seconds_total": (int(fields[11]) + int(fields[12])) / _TICKS,
        "process_open_fds": float(open_fds),
        "process_max_fds": float(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
        "process_virtual_memory_bytes": float(int(fields[20])),
        "process_resident_memory_bytes": float(int(fields[21]) * _PAGE),
        "process_start_time_seconds": boot + int(fields[19]) / _TICKS,
    }


def combine(mine: dict[str, float], other: dict[str, float]) -> None:
    """Fold another process's values into `mine`, metric by metric."""
    for name, value in other.items():
        spec = METRICS.get(name)
        if spec is None:
            continue
        mine[name] = value if name not in mine else _COMBINE[spec[2]](mine[name], value)


def render(values: dict[str, float]) -> list[str]:
    """The exposition lines of these values."""
    out: list[str] = []
    for name, value in sorted(values.items()):
        kind, help_text, _ = METRICS[name]
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name} {number(value)}\n")
    return out
