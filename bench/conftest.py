"""Benchmark fixtures: the machine description (shared with every bench/ script) in the JSON."""

from __future__ import annotations

from support.machine import machine_info as describe_machine


def pytest_benchmark_update_machine_info(config, machine_info):  # type: ignore[no-untyped-def]
    """Describe the run: the implementation of each compiled module travels with the numbers."""
    machine_info["ratelimitd"] = describe_machine()
