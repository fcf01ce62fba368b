"""The pytest-asyncio hook that runs every async test on uvloop, the daemon's loop.

tests/conftest.py imports the hook, so it applies to the whole suite.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], object]]:
    """Async tests and async fixtures run on uvloop."""
    return {"uvloop": uvloop.new_event_loop}
