"""Health as a component map: healthy iff every registered component is healthy.

Components: `backend` (the counter store; set when it connects,
and followed per connection with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION), `config` (only
with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) and `sigterm` (false once draining).
Listeners (the gRPC health servicer) are told of every change of the overall state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Health:
    """The process's health state."""

    def __init__(self) -> None:
        self._components: dict[str, bool] = {}
        self._listeners: list[Callable[[bool], None]] = []
        self._details: dict[str, Callable[[], Any]] = {}

    def register(self, name: str, ok: bool) -> None:
        """Add a component with its initial state."""
        self._components[name] = ok
        self._notify()

    def set(self, name: str, ok: bool) -> None:
        """Change a registered component's state (unknown names are ignored)."""
        if name in self._components and self._components[name] != ok:
            before = self.healthy()
            self._components[name] = ok
            if self.healthy() != before:
                self._notify()

    def healthy(self) -> bool:
        """True iff every component is healthy."""
        return all(self._components.values())

    def components(self) -> dict[str, bool]:
        """A copy of the component map."""
        return dict(self._components)

    def add_detail(self, name: str, read: Callable[[], Any]) -> None:
        """Show `read()` under `name` in `detail()`; it never changes `healthy()` (the
        circuit breakers' states: an open breaker is not an unhealthy process)."""
        self._details[name] = read

    def detail(self) -> dict[str, Any]:
        """`/healthcheck?detail`: the overall state, the components and the details."""
        out: dict[str, Any] = {"healthy": self.healthy(), "components": self.components()}
        for name, read in self._details.items():
            out[name] = read()
        return out

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(healthy)` now and on every change of the overall state."""
        self._listeners.append(listener)
        listener(self.healthy())

    def _notify(self) -> None:
        state = self.healthy()
        for listener in self._listeners:
            listener(state)
