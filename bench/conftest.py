"""Benchmark fixtures: rule sets of a given size, and the machine description in the JSON."""

from __future__ import annotations

import platform
import subprocess

from ratelimitd import keys, match


def pytest_benchmark_update_machine_info(config, machine_info):  # type: ignore[no-untyped-def]
    """Describe the run: extension mode and Redis version travel with the numbers."""
    machine_info["ratelimitd_keys"] = keys.IMPLEMENTATION
    machine_info["ratelimitd_match"] = match.IMPLEMENTATION
    machine_info["python"] = platform.python_version()
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        )
        machine_info["redis_server"] = out.stdout.strip()
    except OSError:
        machine_info["redis_server"] = "not installed"
