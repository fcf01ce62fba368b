"""STATS_RATE_LIMIT_GAUGES (extension): `<stats key>.rate_limit`, a gauge of each configured
rule's limit (asked upstream in #1138, #160, #429, #453, #986), off by default."""

from __future__ import annotations

from pathlib import Path

from support.daemon import write_config
from support.settings_env import on_memory

from ratelimitd.config import ConfigFile
from ratelimitd.core import build_core
from ratelimitd.stats import StatsStore
from ratelimitd.stats.sinks import create_sink
from ratelimitd.transport.http import HttpServer

from .conftest import CONFIG
from .test_prometheus import RULE, http_get, prom_settings, samples

SEVERAL = """\
domain: more
descriptors:
  - key: free
    rate_limit: {unlimited: true}
  - key: two
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 1000}
"""
PREFIX = "ratelimit.service.rate_limit."


def core_with_gauges(enabled: bool = True):
    settings = on_memory(STATS_RATE_LIMIT_GAUGES="true" if enabled else "false")
    stats = StatsStore(rate_limit_gauges=settings.stats.rate_limit_gauges)
    return build_core(settings, stats=stats)


def test_each_rule_with_a_limit_has_a_gauge_replaced_at_each_load() -> None:
    core = core_with_gauges()
    core.load([ConfigFile("obs.yaml", CONFIG), ConfigFile("more.yaml", SEVERAL)])
    snap = core.stats.snapshot()
    gauges = {k: v for k, v in snap.items() if k.endswith(".rate_limit")}
    assert gauges == {
        PREFIX + "obs.user.rate_limit": 2,
        PREFIX + "obs.path_/a.rate_limit": 100,
        PREFIX + "obs.path_/a.method_GET.rate_limit": 100,
        PREFIX + "more.two.rate_limit": 5,  # a rule of several limits: its first
    }  # an unlimited rule has none
    assert set(gauges) <= core.stats.gauge_names()
    # A reload replaces them all: a removed rule's gauge goes, a changed limit follows.
    core.load(
        [ConfigFile("obs.yaml", CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 7"))]
    )
    gauges = {k: v for k, v in core.stats.snapshot().items() if k.endswith(".rate_limit")}
    assert gauges[PREFIX + "obs.user.rate_limit"] == 7
    assert PREFIX + "more.two.rate_limit" not in gauges


def test_off_by_default() -> None:
    assert on_memory().stats.rate_limit_gauges is False
    core = core_with_gauges(enabled=False)
    core.load([ConfigFile("obs.yaml", CONFIG)])
    assert not [k for k in core.stats.snapshot() if k.endswith(".rate_limit")]


async def test_prometheus_gauge_is_not_summed_over_workers(tmp_path: Path) -> None:
    cores = [core_with_gauges(), core_with_gauges()]
    sinks = [
        create_sink(
            prom_settings(), c.stats, worker_index=i, share_dir=str(tmp_path), serve=HttpServer
        )
        for i, c in enumerate(cores)
    ]
    for c in cores:
        c.load([ConfigFile("obs.yaml", CONFIG)])
    for sink in sinks:
        await sink.start()
    try:
        await sinks[1].flush()
        _, _, text = await http_get(sinks[0].port, "/metrics")  # type: ignore[attr-defined]
        assert f"# TYPE {RULE}rate_limit gauge\n" in text
        got = samples(text)
        # Every worker has the same config: the limit, not twice it.
        assert got[(f"{RULE}rate_limit", (("domain", "obs"), ("key1", "user")))] == 2
    finally:
        for sink in sinks:
            await sink.stop()


def test_daemon_shows_the_gauges_in_stats(daemon_env, start_daemon) -> None:
    write_config(daemon_env, "obs.yaml", CONFIG)
    d = start_daemon(dict(daemon_env, STATS_RATE_LIMIT_GAUGES="true"))
    stats = d.stats()
    assert stats[PREFIX + "obs.user.rate_limit"] == 2
    assert stats[PREFIX + "obs.path_/a.method_GET.rate_limit"] == 100
