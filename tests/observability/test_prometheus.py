"""The Prometheus sink: the endpoint scraped over HTTP, parsed, and checked against the store."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support import wait_until
from support.http_transport import paused, read_reply, request_bytes, unread_answer
from support.settings_env import on_memory

from ratelimitd.settings import Settings
from ratelimitd.stats import StatsStore, process
from ratelimitd.stats.base import RESPONSE_TIME
from ratelimitd.stats.mapper import MetricMapper, default_mapping_config, escape_metric_name
from ratelimitd.stats.prometheus import PrometheusSink
from ratelimitd.stats.sinks import create_sink
from ratelimitd.stats.workershare import WorkerShare
from ratelimitd.transport.http import HttpServer
from ratelimitd.transport.limits import ClientBuffers, ConnectionBudget

from .conftest import CONFIG, running

RULE = "ratelimit_service_rate_limit_"


def prom_settings(**env: str) -> Settings:
    return on_memory(
        USE_STATSD="false", USE_PROMETHEUS="true", PROMETHEUS_ADDR="127.0.0.1:0", **env
    )


async def http_get(port: int, path: str) -> tuple[int, dict[str, str], str]:
    """One HTTP/1.1 GET over a real socket; header names in lower case."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(path, method="GET", headers=("Connection: close",)))
    reply = await read_reply(reader)
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return reply.status, reply.headers, reply.body.decode()


async def scrape(
    sink: Any, path: str = "/metrics"
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples a GET of `path` on the sink's endpoint serves."""
    _, _, text = await http_get(sink.port, path)
    return samples(text)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, via prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_scrape_matches_the_store(harness: Any) -> None:
    h = harness(CONFIG)
    sink = create_sink(prom_settings(PROMETHEUS_PATH="/prom"), h.stats, serve=HttpServer)
    assert isinstance(sink, PrometheusSink)
    async with running(sink):
        for _ in range(3):
            await h.decide("obs", [("user", "alice")])
        await h.decide("obs", [("path", "/a"), ("method", "GET")])
        await h.decide("nope", [("user", "bob")])
        h.stats.service.total_requests += 5
        h.stats.service.config_load_success += 1
        h.stats.service.redis_error += 2
        h.stats.add_gauge("ratelimit.localcache.entryCount", lambda: 11)
        for ms in (2.0, 30.0, 30.0, 700.0):
            sink.timer.observe(ms)  # type: ignore[union-attr]

        status, headers, text = await http_get(sink.port, "/prom")
        assert status == 200
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert headers["transfer-encoding"] == "chunked"  # streamed, a chunk as it is read
        got = samples(text)
        snap = h.stats.snapshot()

        def rule(stat: str, **labels: str) -> float:
            return got[(f"{RULE}{stat}_total", tuple(sorted(labels.items())))]

        user = "ratelimit.service.rate_limit.obs.user."
        for stat in ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"):
            assert rule(stat, domain="obs", key1="user") == snap[user + stat], stat
        assert rule("total_hits", domain="obs", key1="user") == 3
        assert rule("over_limit", domain="obs", key1="user") == 1
        # Three levels map to key1/key2 (the reference's regex mapping).
        assert rule("total_hits", domain="obs", key1="path_/a", key2="method_GET") == 1
        # Not in the default mapping: exported under the escaped statsd name.
        assert got[("ratelimit_service_rate_limit_nope_domain_not_found_total", ())] == 1
        assert got[("ratelimit_localcache_entryCount", ())] == 11
        assert (
            got[("ratelimit_service_total_requests_total", (("grpc_method", "ShouldRateLimit"),))]
            == 5
        )
        assert got[("ratelimit_service_config_load_success_total", ())] == 1
        assert got[("ratelimit_service_config_load_error_total", ())] == 0
        err = "ratelimit_service_should_rate_limit_error_total"
        assert got[(err, (("err_type", "redis_error"),))] == 2
        assert got[(err, (("err_type", "service_error"),))] == 0
        # The response time as a seconds histogram with the default buckets.
        method = (("grpc_method", "ShouldRateLimit"),)
        hist = "ratelimit_service_response_time_seconds"
        assert got[(f"{hist}_count", method)] == 4
        assert abs(got[(f"{hist}_sum", method)] - 0.762) < 1e-9
        assert got[(f"{hist}_bucket", (*method, ("le", "0.005")))] == 1
        assert got[(f"{hist}_bucket", (*method, ("le", "0.05")))] == 3
        assert got[(f"{hist}_bucket", (*method, ("le", "1")))] == 4
        assert got[(f"{hist}_bucket", (*method, ("le", "+Inf")))] == 4
        # The raw text keeps the reference's names (counters without a _total suffix).
        assert f"# TYPE {RULE}total_hits counter\n" in text
        assert f'{RULE}total_hits{{domain="obs",key1="user"}} 3\n' in text

        # Live: a new decision shows up in the next scrape.
        await h.decide("obs", [("user", "alice")])
        assert (await scrape(sink, "/prom"))[
            (f"{RULE}total_hits_total", (("domain", "obs"), ("key1", "user")))
        ] == 4

        status, _, _ = await http_get(sink.port, "/other")
        assert status == 404


async def test_response_time_as_milliseconds_and_extra_tags(harness: Any) -> None:
    h = harness(CONFIG)
    env = prom_settings(PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS="true", EXTRA_TAGS="zone:eu")
    sink = create_sink(env, h.stats, serve=HttpServer)
    async with running(sink):
        await h.decide("obs", [("user", "alice")])
        sink.timer.observe(1000.0)  # type: ignore[union-attr]
        got = await scrape(sink)
        labels = (("grpc_method", "ShouldRateLimit"), ("zone", "eu"))
        assert got[("ratelimit_service_response_time_seconds_sum", labels)] == 1000.0
        assert got[("ratelimit_service_response_time_seconds_count", labels)] == 1
        assert (
            got[(f"{RULE}total_hits_total", (("domain", "obs"), ("key1", "user"), ("zone", "eu")))]
            == 1
        )


def test_default_mapper_matches_the_reference_examples() -> None:
    mapper = MetricMapper.from_config(default_mapping_config())
    m = mapper.map("ratelimit.service.rate_limit.domain1.key1_val1.over_limit", "counter")
    assert m is not None and (m.name, m.labels) == (
        f"{RULE}over_limit",
        (("domain", "domain1"), ("key1", "key1_val1")),
    )
    m = mapper.map(
        "ratelimit.service.rate_limit.domain1.key3_val3.key4_val4.key5_val5.over_limit", "counter"
    )
    assert m is not None and (m.name, m.labels) == (
        f"{RULE}over_limit",
        (("domain", "domain1"), ("key1", "key3_val3"), ("key2", "key4_val4")),
    )
    # over_limit_with_local_cache has no mapping: escaped name.
    m = mapper.map("ratelimit.service.rate_limit.d.k.over_limit_with_local_cache", "counter")
    assert (
        m is not None and m.name == "ratelimit_service_rate_limit_d_k_over_limit_with_local_cache"
    )
    # A gauge under the rule prefix does not take a rule's name (reference test).
    m = mapper.map("ratelimit.service.rate_limit.domain1.key1.test_gauge", "gauge")
    assert m is not None and m.name == "ratelimit_service_rate_limit_domain1_key1_test_gauge"
    assert escape_metric_name("9a.b-c") == "_9a_b_c"


async def test_custom_mapper_yaml(harness: Any, tmp_path: Path) -> None:
    mapper = tmp_path / "mapper.yaml"
    mapper.write_text(
        """\
defaults:
  buckets: [0.001, 0.1]
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "hits"
    labels:
      rule: "$1/$2"
  - match: "^ratelimit\\\\.service\\\\.rate_limit\\\\."
    match_type: regex
    action: drop
  - match: "ratelimit_server\\\\.(\\\\w+)\\\\.response_time"
    match_type: regex
    name: "rt_seconds"
    scale: 0.001
    labels:
      method: "$1"
"""
    )
    h = harness(CONFIG)
    sink = create_sink(prom_settings(PROMETHEUS_MAPPER_YAML=str(mapper)), h.stats, serve=HttpServer)
    async with running(sink):
        await h.decide("obs", [("user", "alice")])
        sink.timer.observe(50.0)  # type: ignore[union-attr]
        got = await scrape(sink)
        assert got[("hits_total", (("rule", "obs/user"),))] == 1
        assert not any(name.startswith(RULE) for name, _ in got)  # dropped
        assert got[("rt_seconds_bucket", (("le", "0.001"), ("method", "ShouldRateLimit")))] == 0
        assert got[("rt_seconds_bucket", (("le", "0.1"), ("method", "ShouldRateLimit")))] == 1


async def test_workers_scrape_serves_the_sum(tmp_path: Path) -> None:
    """Two worker processes (two stores here) share a directory; either endpoint serves the
    sum, and a restarted worker continues from its predecessor's counters."""
    share_dir = str(tmp_path)
    stores = [StatsStore(), StatsStore()]
    sinks = [
        create_sink(
            prom_settings(), stores[i], worker_index=i, share_dir=share_dir, serve=HttpServer
        )
        for i in range(2)
    ]
    for sink in sinks:
        await sink.start()
    try:
        stores[0].rule_stats("d.k").total_hits += 3
        stores[1].rule_stats("d.k").total_hits += 4
        stores[1].rule_stats("d.k2").over_limit += 1
        stores[0].add_gauge("ratelimit.localcache.entryCount", lambda: 2)
        stores[1].add_gauge("ratelimit.localcache.entryCount", lambda: 5)
        sinks[0].timer.observe(3.0)  # type: ignore[union-attr]
        sinks[1].timer.observe(30.0)  # type: ignore[union-attr]
        await sinks[1].flush()  # worker 1 publishes on its flush interval
        for sink in sinks:
            got = await scrape(sink)
            assert got[(f"{RULE}total_hits_total", (("domain", "d"), ("key1", "k")))] == 7
            assert got[(f"{RULE}over_limit_total", (("domain", "d"), ("key1", "k2")))] == 1
            assert got[("ratelimit_localcache_entryCount", ())] == 7
            method = (("grpc_method", "ShouldRateLimit"),)
            assert got[("ratelimit_service_response_time_seconds_count", method)] == 2
            # Both "workers" are this process: sizes add up, the start time is the oldest.
            own = process.read()
            rss = got[("process_resident_memory_bytes", ())]
            assert 1.5 * own["process_resident_memory_bytes"] < rss
            assert got[("process_start_time_seconds", ())] == own["process_start_time_seconds"]
        assert sorted(os.listdir(share_dir)) == ["worker-0.json", "worker-1.json"]

        # Worker 0 dies and is restarted: its counters continue from the file.
        await sinks[0].stop()
        stores[0] = StatsStore()
        sinks[0] = create_sink(
            prom_settings(), stores[0], worker_index=0, share_dir=share_dir, serve=HttpServer
        )
        await sinks[0].start()
        stores[0].rule_stats("d.k").total_hits += 1
        assert (await scrape(sinks[0]))[
            (f"{RULE}total_hits_total", (("domain", "d"), ("key1", "k")))
        ] == 8
    finally:
        for sink in sinks:
            await sink.stop()
    assert isinstance(WorkerShare(share_dir, 5).read_all().counters, dict)


async def test_process_metrics_as_client_golang_exports_them() -> None:
    """process_* as the Go service's endpoint serves them (client_golang's process
    collector): dashboards built for it chart memory with process_resident_memory_bytes."""
    sink = create_sink(prom_settings(), StatsStore(), serve=HttpServer)
    async with running(sink):
        _, _, text = await http_get(sink.port, "/metrics")
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    got = samples(text)
    own = process.read()
    assert kinds["process_cpu_seconds"] == "counter"
    for name in process.METRICS:
        if name != "process_cpu_seconds_total":
            assert kinds[name] == "gauge", name
    assert (
        0.5 < got[("process_resident_memory_bytes", ())] / own["process_resident_memory_bytes"] < 2
    )
    assert got[("process_virtual_memory_bytes", ())] >= got[("process_resident_memory_bytes", ())]
    assert 0 < got[("process_open_fds", ())] <= got[("process_max_fds", ())]
    assert got[("process_start_time_seconds", ())] == own["process_start_time_seconds"]
    assert 0 < got[("process_cpu_seconds_total", ())] <= own["process_cpu_seconds_total"]


def test_render_without_a_server_has_every_family_once() -> None:
    stats = StatsStore()
    stats.rule_stats("d.k").total_hits += 1
    stats.timer(RESPONSE_TIME)
    sink = PrometheusSink(stats, MetricMapper.from_config(default_mapping_config()), addr=":0")
    text = sink.render().decode()
    types = [line for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    # No observation yet: no response-time series.
    assert "response_time" not in text


async def test_an_unread_scrape_holds_one_chunk_then_is_closed() -> None:
    """The exposition is streamed: a scraper that does not read holds the high-water mark and
    one chunk, not the exposition (an unread 326 MB scrape once kept the RSS at 954 MB), and
    is closed after the write timeout. While it is sent, the rendered exposition counts in the
    process's room for such answers (half of MAX_BUFFERED_BYTES, apart from the requests'
    buffers): a scrape that does not fit is 503, so unread scrapes cannot keep any number of
    renders, and they never take the buffers a decision needs."""
    stats = StatsStore()
    for i in range(5_000):
        stats.rule_stats(f"d.k_{i:05d}_" + "v" * 200).total_hits = i
    sink = PrometheusSink(stats, MetricMapper.from_config(default_mapping_config()), addr=":0")
    exposition = len(sink.render())
    assert exposition > 6_000_000
    buffers = ClientBuffers(exposition * 3)  # the answers' room: half of it
    servers: list[HttpServer] = []

    def serve(routes: Any) -> HttpServer:
        budget = ConnectionBudget(100, buffers)
        servers.append(HttpServer(routes, write_timeout=1.0, budget=budget))
        return servers[0]

    sink = PrometheusSink(
        stats, MetricMapper.from_config(default_mapping_config()), addr="127.0.0.1:0", serve=serve
    )
    async with running(sink):
        held = asyncio.ensure_future(unread_answer(servers[0], "/metrics"))
        await wait_until(lambda: paused(servers[0]), what="the unread one paused")
        answers = servers[0].budget.answers
        assert answers.held > exposition // 2  # charged while it is sent
        assert buffers.held == 0  # never in the requests' buffers
        status, headers, _ = await http_get(sink.port, "/metrics")
        assert (status, headers["retry-after"]) == (503, "1")  # two would not fit
        assert await held < 600 * 1024 < exposition // 10
        assert answers.held == 0  # given back once it was closed
        assert len(await scrape(sink)) > 30_000  # a scraper that reads gets all of it


async def test_scrapes_at_once_share_renders_and_see_what_came_before_them() -> None:
    """Renders do not overlap (four at once, each in its own thread, once raised the
    decisions' p99 from 2.4 to 153 ms); a scrape takes a render started after it arrived."""
    stats = StatsStore()
    for i in range(2_000):
        stats.rule_stats(f"d.k_{i}").total_hits = i
    sink = PrometheusSink(stats, MetricMapper.from_config(default_mapping_config()), addr=":0")
    render, renders = sink.render_lines, []

    def counted(snapshot: Any = None) -> list[str]:
        renders.append(snapshot)
        return render(snapshot)

    sink.render_lines = counted  # type: ignore[method-assign]
    first = await asyncio.gather(*[sink._exposition() for _ in range(4)])
    assert len(renders) <= 2 and len({id(lines) for lines in first}) == len(renders)
    stats.rule_stats("d.k_1").total_hits = 12345
    later = "".join(await sink._exposition())
    assert RULE + 'total_hits{domain="d",key1="k_1"} 12345\n' in later
