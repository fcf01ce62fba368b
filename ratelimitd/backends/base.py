"""The small async protocol every counter backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class BackendError(Exception):
    """Any failure of the counter store; the service fails the request with it."""


class Backend(Protocol):
    """Fixed-window counters with the semantics of Redis INCRBY + EXPIRE.

    An op is (key, hits, unit_seconds). The backend adds its own expiry jitter
    (EXPIRATION_JITTER_MAX_SECONDS) and routes SECOND-unit keys where it must.
    """

    name: str

    async def increment(self, ops: Sequence[tuple[str, int, int]]) -> list[int]:
        """INCRBY key hits + EXPIRE key unit+jitter for each op; the counters after."""
        ...

    async def get(self, keys: Sequence[tuple[str, int]]) -> list[int]:
        """Current counter values (0 when absent) of (key, unit_seconds) pairs."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
