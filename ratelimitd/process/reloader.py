"""Loading the config at start and on every change, off the request path.

Each reload reads and compiles every file (or every xDS resource) in a worker thread, then
swaps the service's RuleSet (and the settings the reference re-reads on reload) in one
assignment. A failed load counts `config_load_error`, logs the exact error and keeps the
previous config. A file that cannot be read fails the load the same way (never an empty
config) and, being usually brief, is retried without waiting for another change, backing
off to RETRY_MAX_SECONDS. A load that finds no domain where the previous config had some
is logged at warning level. The source is a FileLayout (CONFIG_TYPE=FILE: polled for changes) or the
xDS settings (CONFIG_TYPE=GRPC_XDS_SOTW: the ADS stream pushes every change); the daemon
drives both the same way: `load()` until the first config is in force, `start()` once
serving, `stop()` at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..backends.base import counted_by
from ..config import ConfigError, ConfigSource, RuleSet, build_ruleset
from ..config.errors import ConfigReadError
from ..config.loader import parse_files
from ..config.provider import FileLayout, Signature
from ..config.xds_client import XdsConfigClient
from ..health import Health
from ..runtime.aio import cancel
from ..service import RateLimitService
from ..settings import ReloadOptions, XdsSettings
from ..stats import StatsStore

log = logging.getLogger("ratelimitd.config")

# The longest wait between two retries of a load that could not read its files.
RETRY_MAX_SECONDS = 10.0


@dataclass(eq=False)
class ConfigReloader:
    """Keeps the service's RuleSet current from config files or an xDS server."""

    source: FileLayout | XdsSettings
    service: RateLimitService
    stats: StatsStore
    health: Health
    # The options the reference re-reads from the environment on every load.
    reload_options: Callable[[], ReloadOptions]
    _: KW_ONLY
    track_config_health: bool = False
    poll_interval: float = 0.5
    loaded: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _signature: Signature | None = field(init=False, default=None)
    _retry_delay: float = field(init=False, default=0.0)  # > 0 after a read error: retry
    _retry_at: float = field(init=False, default=0.0)
    _task: asyncio.Task[None] | None = field(init=False, default=None)
    # SIGHUP: load now, changed or not.
    _reload_requested: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _xds: XdsConfigClient | None = field(init=False)

    def __post_init__(self) -> None:
        # Validates the xDS settings now, so bad ones stop the start with one line.
        source = self.source
        self._xds = XdsConfigClient(source, self.apply) if isinstance(source, XdsSettings) else None

    async def load(self) -> bool:
        """Try to put a config in force now; True once one is."""
        if isinstance(self.source, FileLayout):
            layout = self.source
            self._signature = await asyncio.to_thread(layout.signature)
            return await self.apply(lambda: parse_files(layout.read())) is None
        # xDS pushes configs: subscribe once, then wait briefly for the first one.
        if self._xds is not None and self._task is None:
            self._spawn(self._xds.run())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.loaded.wait(), self.poll_interval * 2)
        return self.loaded.is_set()

    async def apply(self, read: Callable[[], Sequence[ConfigSource]]) -> str | None:
        """Read, validate and compile in a thread; None once in force, else the error text."""
        options = self.reload_options()
        try:
            ruleset = await asyncio.to_thread(self._build, read, options)
        except ConfigError as exc:
            self.stats.service.config_load_error += 1
            log.error("Error loading new configuration: %s", exc)
            self._schedule_retry(isinstance(exc, ConfigReadError))
            return str(exc)
        except Exception as exc:  # never let a config take the daemon down
            self.stats.service.config_load_error += 1
            log.exception("Error loading new configuration")
            self._schedule_retry(False)
            return f"{type(exc).__name__}: {exc}"
        self._schedule_retry(False)
        previous = self.service.ruleset
        if not len(ruleset) and previous is not None and len(previous):
            log.warning(
                "the new configuration has no domains (the previous one had %d): "
                "every request is now answered OK without a limit",
                len(previous),
            )
        self.service.set_ruleset(ruleset, options)
        self.stats.service.config_load_success += 1
        if self.track_config_health:
            self.health.set("config", len(ruleset) > 0)
        self.loaded.set()
        log.info("loaded rate limit configuration: %d domains", len(ruleset))
        return None

    def _schedule_retry(self, retry: bool) -> None:
        """After a read error, load again soon even if nothing changes (backing off)."""
        if not retry:
            self._retry_delay = 0.0
            return
        self._retry_delay = min(RETRY_MAX_SECONDS, max(self.poll_interval, self._retry_delay * 2))
        self._retry_at = asyncio.get_running_loop().time() + self._retry_delay

    def _build(self, read: Callable[[], Sequence[ConfigSource]], options: ReloadOptions) -> RuleSet:
        # The collector is off while a config is parsed and compiled: a large one makes
        # millions of YAML nodes, and each full collection that met them held the GIL, so the
        # loop, for 0.4 s at 50,000 rules. The nodes are freed by reference counting (the
        # tree has no cycles, nor has a RuleSet); what survives is frozen, so that later
        # collections never scan the rule set either (gc.freeze: reference counting still
        # frees a replaced one).
        gc.disable()
        try:
            ruleset = build_ruleset(
                read(),
                merge_domains=options.merge_domain_config,
                algorithms=options.domain_algorithms,
                stats=self.stats,
                backend=counted_by(self.service.limiter.backend),
            )
            self.service.limiter.check(ruleset)
            return ruleset
        finally:
            gc.freeze()
            gc.enable()

    def request_reload(self) -> None:
        """Load the files again now, whether they changed or not (SIGHUP)."""
        if isinstance(self.source, FileLayout):
            log.info("reloading the configuration (SIGHUP)")
            self._reload_requested.set()
        else:
            log.info("SIGHUP: the xDS server pushes every change; nothing to reload")

    def start(self) -> None:
        """Watch for changes in the background (the xDS stream already runs since `load`)."""
        if isinstance(self.source, FileLayout):
            self._spawn(self._watch(self.source))

    async def stop(self) -> None:
        """Stop watching (and close the xDS stream)."""
        await cancel(self._task)
        self._task = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._task = asyncio.get_running_loop().create_task(coro)

    async def _watch(self, layout: FileLayout) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload_requested.wait(), self.poll_interval)
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                await self.load()
                continue
            try:
                signature = await asyncio.to_thread(layout.signature)
            except Exception:  # a transient filesystem error: try again next tick
                log.exception("config watch failed")
                continue
            retry = self._retry_delay and asyncio.get_running_loop().time() >= self._retry_at
            if signature != self._signature or retry:
                await self.load()
