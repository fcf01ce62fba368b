"""`Lifecycle`: a sidecar's background work started and stopped with the ASGI lifespan;
`stop_tasks`: how that work's asyncio tasks are stopped."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from typing import Any


class Lifecycle:
    """Falcon middleware calling `startup` on lifespan startup and `shutdown` on shutdown.

    Either may be a plain or an async callable (the transit API starts and joins threads, the
    usage API closes its Redis pool in the worker's loop).
    """

    def __init__(
        self,
        *,
        startup: Callable[[], Any] | None = None,
        shutdown: Callable[[], Any] | None = None,
    ) -> None:
        self.startup = startup
        self.shutdown = shutdown

    async def process_startup(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        """Start the work before the first request."""
        await _call(self.startup)

    async def process_shutdown(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        """Stop it once the server has stopped serving."""
        await _call(self.shutdown)


async def stop_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel background tasks and wait until each has ended (None: nothing to stop).

    Nothing is raised: shutting down must not fail because a loop had already failed.
    """
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def _call(fn: Callable[[], Any] | None) -> None:
    if fn is None:
        return
    result = fn()
    if inspect.isawaitable(result):
        await result
