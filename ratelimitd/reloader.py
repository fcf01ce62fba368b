"""Loading the config at start and on every change, off the request path.

Each reload reads and compiles every file in a worker thread, then swaps the service's
RuleSet (and the settings the reference re-reads on reload) in one assignment. A failed
load counts `config_load_error`, logs the exact error and keeps the previous config.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from .config import ConfigError, load_ruleset
from .config.provider import FileLayout, Signature
from .health import Health
from .service import RateLimitService
from .settings import ReloadOptions
from .stats import StatsStore

log = logging.getLogger("ratelimitd.config")


class ConfigReloader:
    """Watches a FileLayout and keeps the service's RuleSet current."""

    def __init__(
        self,
        layout: FileLayout,
        service: RateLimitService,
        stats: StatsStore,
        health: Health,
        reload_options: Callable[[], ReloadOptions],
        *,
        track_config_health: bool = False,
        poll_interval: float = 0.5,
    ) -> None:
        self.layout = layout
        self.service = service
        self.stats = stats
        self.health = health
        # The options the reference re-reads from the environment on every load.
        self.reload_options = reload_options
        self.track_config_health = track_config_health
        self.poll_interval = poll_interval
        self._signature: Signature | None = None
        self._task: asyncio.Task[None] | None = None
        self.loaded = asyncio.Event()

    async def load(self) -> bool:
        """Load the current files now; True when the new config is in force."""
        signature = await asyncio.to_thread(self.layout.signature)
        self._signature = signature
        options = self.reload_options()
        try:
            ruleset = await asyncio.to_thread(self._build, options.merge_domain_config)
        except ConfigError as exc:
            self.stats.service.config_load_error += 1
            log.error("Error loading new configuration: %s", exc)
            return False
        except Exception:  # never let a config take the daemon down
            self.stats.service.config_load_error += 1
            log.exception("Error loading new configuration")
            return False
        self.service.set_ruleset(ruleset, options)
        self.stats.service.config_load_success += 1
        if self.track_config_health:
            self.health.set("config", len(ruleset) > 0)
        self.loaded.set()
        log.info("loaded rate limit configuration: %d domains", len(ruleset))
        return True

    def _build(self, merge: bool):  # type: ignore[no-untyped-def]
        return load_ruleset(self.layout.read(), merge_domains=merge, stats=self.stats)

    def start(self) -> None:
        """Poll for changes in the background."""
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                signature = await asyncio.to_thread(self.layout.signature)
            except Exception:  # a transient filesystem error: try again next tick
                log.exception("config watch failed")
                continue
            if signature != self._signature:
                await self.load()
