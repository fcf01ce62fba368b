"""Statistics cannot grow from request content, and reading them never holds the loop.

Before: limit overrides and unknown domains each created a series that was never freed:
100,000 override descriptors made /stats 127 MB and 1.5 s to render, added 60 MB, and the
10 s stats flush stalled requests for 1.2 s (the reference's open #275).
"""

from __future__ import annotations

import asyncio

from support.core import memory_decider, suite_config

from ratelimitd.messages import Descriptor
from ratelimitd.stats import StatsStore
from ratelimitd.stats.store import OVERFLOW_KEY

# d: k 10/hour, detailed 10/hour with detailed_metric (a series per value).
CONFIG = suite_config("core_stats_bounds")
PREFIX = "ratelimit.service.rate_limit."
FOLDED = "ratelimit.service.stats_series_folded"


def series(stats: StatsStore) -> set[str]:
    """The stats keys in the snapshot (one per series of six counters, or domain)."""
    return {
        name[len(PREFIX) :].rpartition(".")[0]
        for name in stats.snapshot()
        if name.startswith(PREFIX)
    }


async def test_overrides_detailed_values_and_unknown_domains_are_capped() -> None:
    d = memory_decider(CONFIG)
    d.stats.max_request_series = 100
    overrides = [Descriptor((("o", f"v{i}"),), (5, 1), None) for i in range(300)]
    for i in range(0, 300, 50):
        await d.decide("d", *overrides[i : i + 50])
    await d.decide("d", *[[("detailed", f"x{i}")] for i in range(50)])
    await d.decide("unknown", [("k", "v")])
    keys = series(d.stats)
    assert len(keys) == 2 + 100 + 1  # the config's two rules, 100 made by requests, overflow
    assert OVERFLOW_KEY in keys
    assert d.stat(FOLDED) == 200 + 50 + 1
    assert d.stat(f"{PREFIX}{OVERFLOW_KEY}.total_hits") == 250  # folded, still counted
    assert d.stat(f"{PREFIX}{OVERFLOW_KEY}.domain_not_found") == 1


async def test_nothing_changes_below_the_cap() -> None:
    d = memory_decider(CONFIG)
    await d.decide("d", Descriptor((("o", "v"),), (5, 1), None), [("detailed", "x")])
    await d.decide("unknown", [("k", "v")])
    assert FOLDED not in d.stats.snapshot()
    assert {"d.o_v", "d.detailed_x", "unknown"} <= series(d.stats)


async def test_a_snapshot_of_a_large_store_lets_the_loop_run() -> None:
    stats = StatsStore()
    for i in range(20_000):
        stats.rule_stats(f"d.k_{i}").total_hits = i
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    before = ticks
    snapshot = await stats.snapshot_sliced()
    stop = True
    await task
    assert ticks - before >= 3  # the loop ran between the slices
    assert snapshot == stats.snapshot()
