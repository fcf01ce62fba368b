"""Statistics cannot grow from request content, and reading them never holds the loop.

Before: limit overrides and unknown domains each created a series that was never freed:
100,000 override descriptors made /stats 127 MB and 1.5 s to render, added 60 MB, and the
10 s stats flush stalled requests for 1.2 s (the reference keeps such series for ever).
Then the series were bounded in number but not in bytes: 11 requests of 1,000 overrides
with distinct 4,000-byte values made each /stats 244 MB.
"""

from __future__ import annotations

import asyncio
import hashlib

from support.core import memory_decider, suite_config

from ratelimitd.messages import Descriptor
from ratelimitd.stats import StatsStore
from ratelimitd.stats.mapper import MetricMapper, default_mapping_config
from ratelimitd.stats.prometheus import PrometheusSink
from ratelimitd.stats.statsd import StatsdSink
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


def cut(key: str, bound: int = 256) -> str:
    """The documented rule (README, STATS_MAX_REQUEST_KEY_BYTES), written out independently:
    the first bound - 17 bytes of the key, `_`, 16 hex digits of BLAKE2b-64 of the key."""
    raw = key.encode()
    return (
        raw[: bound - 17].decode(errors="ignore")
        + "_"
        + hashlib.blake2b(raw, digest_size=8).hexdigest()
    )


async def test_long_request_made_keys_are_cut_to_the_byte_bound() -> None:
    d = memory_decider(CONFIG)
    long_values = [f"{i:04d}" + "x" * 3996 for i in range(20)]
    await d.decide("d", *[Descriptor((("o", v),), (5, 1), None) for v in long_values])
    await d.decide("d", [("detailed", "y" * 4000)])
    await d.decide("u" * 1000, [("k", "v")])
    keys = series(d.stats)
    expected = {cut(f"d.o_{v}") for v in long_values} | {cut("d.detailed_" + "y" * 4000)}
    assert expected <= keys  # distinct values stay distinct series
    assert cut("u" * 1000) in keys  # an unknown domain's domain_not_found
    assert max(len(k.encode()) for k in keys) == 256
    assert d.stat(f"{PREFIX}{cut('d.o_' + long_values[3])}.total_hits") == 1
    # The same long value again is counted in the same cut series.
    await d.decide("d", Descriptor((("o", long_values[3]),), (5, 1), None))
    assert d.stat(f"{PREFIX}{cut('d.o_' + long_values[3])}.total_hits") == 2
    assert FOLDED not in d.stats.snapshot()


async def test_keys_within_the_bound_keep_the_reference_name() -> None:
    d = memory_decider(CONFIG)
    exact = "v" * (256 - len("d.o_"))  # the key is exactly 256 bytes
    wide = "é" * 126  # 2 bytes each: d.o_ + 252 bytes, within the bound
    over = "é" * 127  # 258 bytes: cut, and never inside a character
    await d.decide("d", *[Descriptor((("o", v),), (5, 1), None) for v in (exact, wide, over)])
    keys = series(d.stats)
    assert {f"d.o_{exact}", f"d.o_{wide}", cut(f"d.o_{over}")} <= keys
    assert cut(f"d.o_{over}").startswith("d.o_" + "é" * 117 + "_")  # 238 bytes, not 239


async def test_sinks_see_the_cut_name() -> None:
    d = memory_decider(CONFIG)
    value = "z" * 4000
    await d.decide("d", Descriptor((("o", value),), (5, 1), None))
    name = cut(f"d.o_{value}")
    statsd = StatsdSink(d.stats, "127.0.0.1", 9)  # not started: only its lines are formatted
    counters, _ = await statsd.collect()
    lines = [statsd.counter_line(n, v) for n, v in counters]
    assert f"{PREFIX}{name}.total_hits:1|c\n" in lines
    assert not any(value in line for line in lines)
    mapper = MetricMapper.from_config(default_mapping_config())
    text = PrometheusSink(d.stats, mapper, addr=":0").render().decode()
    key1 = name.removeprefix("d.")
    assert f'ratelimit_service_rate_limit_total_hits{{domain="d",key1="{key1}"}} 1' in text
    assert value not in text


async def test_the_bound_is_a_setting() -> None:
    d = memory_decider(CONFIG)
    d.stats.max_request_key_bytes = 64
    await d.decide("d", Descriptor((("o", "w" * 100),), (5, 1), None))
    assert cut("d.o_" + "w" * 100, 64) in series(d.stats)


def test_the_page_is_the_snapshot_by_name_read_as_it_goes() -> None:
    """`page()` (/stats) gives what `snapshot()` gives, by name, without naming every series
    first: its values are read as it reaches them."""
    stats = StatsStore()
    for i in range(300):
        stats.rule_stats(f"d.k_{i}").total_hits = i
    stats.rule_stats("d.k_7").total_negative_hits = 2
    budget = stats.rule_stats("llm.user")
    budget.budget, budget.budget_reserved, budget.budget_full = True, 5, 1
    stats.domain_not_found("nowhere")
    stats.add_gauge("ratelimit.test.gauge", lambda: 2.5)
    page = stats.page()
    first = next(page)
    stats.rule_stats("d.k_99").total_hits = 1000  # read when reached, not before
    assert [first, *page] == sorted(stats.snapshot().items())
