"""A reload that adds rules while the loop flushes or serves `/stats`.

A reload builds the new rules' stats in a worker thread (`ConfigReloader.apply` ->
`build_ruleset` -> `StatsStore.rule_stats`) while the event loop reads the same store: a
sink flush and the debug `/stats` page call `StatsStore.snapshot()`. Iterating a dict that
another thread grows raises "dictionary changed size during iteration"; these tests make
the two overlap (a tiny GIL switch interval switches threads between almost every
bytecode) and require every snapshot to succeed and to be consistent.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
from collections.abc import Iterator

import pytest

from ratelimitd.config import ConfigSource
from ratelimitd.config.provider import FileLayout
from ratelimitd.config.yamlfile import DescriptorDoc, RateLimitDoc, RootDoc
from ratelimitd.core import build_core
from ratelimitd.health import Health
from ratelimitd.process.reloader import ConfigReloader
from ratelimitd.settings import ReloadOptions
from ratelimitd.stats import RULE_STATS, StatsStore
from ratelimitd.stats.stdout import LoggingSink

RULES = 20_000


def config(domain: str, rules: int) -> list[ConfigSource]:
    """One domain of `rules` rules, as parsed documents (YAML parsing is not under test)."""
    limit = RateLimitDoc(requests_per_unit=10, unit="minute")
    descriptors = [DescriptorDoc(key="k", value=f"v{i}", rate_limit=limit) for i in range(rules)]
    return [ConfigSource(f"{domain}.yaml", RootDoc(domain=domain, descriptors=descriptors))]


@pytest.fixture
def busy_gil() -> Iterator[None]:
    """Switch threads as often as the interpreter allows, so the reload and the loop interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def reloader_for(stats: StatsStore, tmp_path: object) -> ConfigReloader:
    core = build_core(stats=stats)
    layout = FileLayout(root=str(tmp_path), subdirectory="", appdirectory="config")
    return ConfigReloader(layout, core.service, stats, Health(), ReloadOptions)


async def test_a_reload_adding_rules_during_flushes_breaks_no_flush(
    busy_gil: None, tmp_path: object
) -> None:
    stats = StatsStore()
    reloader = reloader_for(stats, tmp_path)
    assert await reloader.apply(lambda: config("first", 2_000)) is None
    sink = LoggingSink(stats, stream=io.StringIO())
    reloading = asyncio.ensure_future(reloader.apply(lambda: config("second", RULES)))
    flushes = 0
    while not reloading.done():
        await sink.flush()  # StatsStore.snapshot() on the loop, as every flush does
        flushes += 1
        await asyncio.sleep(0)
    assert await reloading is None
    assert flushes > 1
    await sink.flush()
    snapshot = stats.snapshot()
    for domain, rules in (("first", 2_000), ("second", RULES)):
        for i in (0, rules // 2, rules - 1):
            for name in RULE_STATS:
                assert f"ratelimit.service.rate_limit.{domain}.k_v{i}.{name}" in snapshot


def test_snapshots_while_another_thread_creates_rule_stats(busy_gil: None) -> None:
    """The store itself, without a reloader: one thread creates keys, this one snapshots."""
    stats = StatsStore()
    for i in range(1_000):
        stats.rule_stats(f"d.old_{i}")
    done = threading.Event()

    def create() -> None:
        for i in range(RULES):
            stats.rule_stats(f"d.new_{i}")
        done.set()

    worker = threading.Thread(target=create)
    worker.start()
    sizes = []
    try:
        while not done.is_set():
            sizes.append(len(stats.snapshot()))
    finally:
        worker.join()
    assert sizes == sorted(sizes)  # a snapshot never loses what an earlier one had
    assert len(stats.snapshot()) >= 6 * (1_000 + RULES)
