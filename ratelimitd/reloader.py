"""Loading the config at start and on every change, off the request path.

Each reload reads and compiles every file (or every xDS resource) in a worker thread, then
swaps the service's RuleSet (and the settings the reference re-reads on reload) in one
assignment. A failed load counts `config_load_error`, logs the exact error and keeps the
previous config. `ConfigReloader` polls files (CONFIG_TYPE=FILE); `XdsReloader` is fed by
the ADS stream (CONFIG_TYPE=GRPC_XDS_SOTW). The daemon drives both the same way: `load()`
until the first config is in force, `start()` once serving, `stop()` at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from .config import ConfigError, ConfigSource, RuleSet, build_ruleset
from .config.loader import parse_files
from .config.provider import FileLayout, Signature
from .config.xds_client import XdsConfigClient
from .health import Health
from .service import RateLimitService
from .settings import ReloadOptions, XdsSettings
from .stats import StatsStore

log = logging.getLogger("ratelimitd.config")


class ConfigApplier:
    """Builds a RuleSet from config sources and puts it in force (stats, logs, health)."""

    def __init__(
        self,
        service: RateLimitService,
        stats: StatsStore,
        health: Health,
        reload_options: Callable[[], ReloadOptions],
        *,
        track_config_health: bool = False,
        poll_interval: float = 0.5,
    ) -> None:
        self.service = service
        self.stats = stats
        self.health = health
        # The options the reference re-reads from the environment on every load.
        self.reload_options = reload_options
        self.track_config_health = track_config_health
        self.poll_interval = poll_interval
        self.loaded = asyncio.Event()

    async def apply(self, read: Callable[[], Sequence[ConfigSource]]) -> str | None:
        """Read, validate and compile in a thread; None once in force, else the error text."""
        options = self.reload_options()
        try:
            ruleset = await asyncio.to_thread(self._build, read, options.merge_domain_config)
        except ConfigError as exc:
            self.stats.service.config_load_error += 1
            log.error("Error loading new configuration: %s", exc)
            return str(exc)
        except Exception as exc:  # never let a config take the daemon down
            self.stats.service.config_load_error += 1
            log.exception("Error loading new configuration")
            return f"{type(exc).__name__}: {exc}"
        self.service.set_ruleset(ruleset, options)
        self.stats.service.config_load_success += 1
        if self.track_config_health:
            self.health.set("config", len(ruleset) > 0)
        self.loaded.set()
        log.info("loaded rate limit configuration: %d domains", len(ruleset))
        return None

    def _build(self, read: Callable[[], Sequence[ConfigSource]], merge: bool) -> RuleSet:
        return build_ruleset(read(), merge_domains=merge, stats=self.stats)


class ConfigReloader(ConfigApplier):
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
        super().__init__(
            service,
            stats,
            health,
            reload_options,
            track_config_health=track_config_health,
            poll_interval=poll_interval,
        )
        self.layout = layout
        self._signature: Signature | None = None
        self._task: asyncio.Task[None] | None = None

    async def load(self) -> bool:
        """Load the current files now; True when the new config is in force."""
        self._signature = await asyncio.to_thread(self.layout.signature)
        return await self.apply(lambda: parse_files(self.layout.read())) is None

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


class XdsReloader(ConfigApplier):
    """Puts every DiscoveryResponse of the ADS stream in force (or rejects it)."""

    def __init__(
        self,
        settings: XdsSettings,
        service: RateLimitService,
        stats: StatsStore,
        health: Health,
        reload_options: Callable[[], ReloadOptions],
        *,
        track_config_health: bool = False,
        poll_interval: float = 0.5,
    ) -> None:
        super().__init__(
            service,
            stats,
            health,
            reload_options,
            track_config_health=track_config_health,
            poll_interval=poll_interval,
        )
        self.client = XdsConfigClient(settings, self.apply)
        self._started = False

    async def load(self) -> bool:
        """Subscribe (once) and wait briefly for the first config; True once one is in force."""
        if not self._started:
            self.client.start()
            self._started = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.loaded.wait(), self.poll_interval * 2)
        return self.loaded.is_set()

    def start(self) -> None:
        """Nothing to do: the stream has been open since the first `load`."""

    async def stop(self) -> None:
        """Close the ADS stream."""
        await self.client.stop()
