"""Fixtures of the daemon tests (the suite-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

Exited = subprocess.CompletedProcess[str]


@pytest.fixture
def serve_until_exit() -> Callable[[dict[str, str], float], Exited]:
    """serve_until_exit(env, timeout): `python -m ratelimitd serve` with `env`, for a daemon
    that must exit on its own within `timeout` seconds; its return code and output (text)."""

    def run(env: dict[str, str], timeout: float) -> Exited:
        argv = [sys.executable, "-m", "ratelimitd", "serve"]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)

    return run
