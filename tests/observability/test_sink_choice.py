"""Which sink the settings build, as the reference's runner chooses, and the stdout sink."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from ratelimitd.backends import load_settings
from ratelimitd.settings import Settings, SettingsError, StatsSettings
from ratelimitd.stats import StatsStore
from ratelimitd.stats.base import NullSink, SinkError
from ratelimitd.stats.dogstatsd import DogStatsdSink
from ratelimitd.stats.prometheus import PrometheusSink, parse_listen_address
from ratelimitd.stats.sinks import create_sink
from ratelimitd.stats.statsd import StatsdSink
from ratelimitd.stats.stdout import LoggingSink

BASE = {"BACKEND_TYPE": "memory", "PROMETHEUS_ADDR": "127.0.0.1:0"}
RULES = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}"


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, StatsdSink),  # USE_STATSD defaults to true
        ({"USE_STATSD": "false"}, LoggingSink),
        ({"USE_STATSD": "false", "USE_DOG_STATSD": "true"}, DogStatsdSink),
        ({"USE_STATSD": "false", "USE_PROMETHEUS": "true"}, PrometheusSink),
        ({"DISABLE_STATS": "true"}, NullSink),
        # DISABLE_STATS wins over anything enabled, even two sinks.
        ({"DISABLE_STATS": "true", "USE_PROMETHEUS": "true"}, NullSink),
    ],
)
def test_sink_choice(env: dict[str, str], kind: type) -> None:
    sink = create_sink(load_settings({**BASE, **env}), StatsStore())
    assert type(sink) is kind


@pytest.mark.parametrize(
    "env",
    [
        {"USE_PROMETHEUS": "true"},  # with the default USE_STATSD=true
        {"USE_DOG_STATSD": "true"},
        {"USE_STATSD": "false", "USE_DOG_STATSD": "true", "USE_PROMETHEUS": "true"},
    ],
)
def test_a_second_sink_is_an_error(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        load_settings({**BASE, **env})
    # Settings built without from_env are checked again when the sink is built.
    fields = {
        "use_statsd": env.get("USE_STATSD", "true") == "true",
        "use_dog_statsd": env.get("USE_DOG_STATSD") == "true",
        "use_prometheus": env.get("USE_PROMETHEUS") == "true",
    }
    with pytest.raises(SinkError, match="only one stats sink"):
        settings = Settings(
            stats=StatsSettings(
                use_statsd=fields["use_statsd"],
                use_dog_statsd=fields["use_dog_statsd"],
                use_prometheus=fields["use_prometheus"],
            )
        )
        create_sink(settings, StatsStore())


async def test_disable_stats_sends_nothing_and_needs_no_interceptor(harness: Any) -> None:
    h = harness(RULES)
    sink = create_sink(load_settings({**BASE, "DISABLE_STATS": "true"}), h.stats)
    await sink.start()
    await h.decide("d", [("k", "v")])
    await sink.flush()
    await sink.stop()
    assert sink.timer is None  # the gRPC handler then times nothing
    # Counting goes on in memory (the debug /stats page still shows it).
    assert h.stat("ratelimit.service.rate_limit.d.k.total_hits") == 1


async def test_stdout_sink_logs_gostats_json_lines(harness: Any) -> None:
    h = harness(RULES)
    out = io.StringIO()
    env = load_settings({**BASE, "USE_STATSD": "false", "EXTRA_TAGS": "a:b"})
    sink = create_sink(env, h.stats, stream=out)
    await sink.start()
    await h.decide("d", [("k", "v")])
    sink.timer.observe(2.5)  # type: ignore[union-attr]
    await sink.stop()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    by_name = {r["json"]["name"]: r for r in records}
    hits = by_name["ratelimit.service.rate_limit.d.k.total_hits.__a=b"]
    assert hits["logger"] == "gostats.loggingsink"
    assert hits["msg"] == "flushing counter"
    assert hits["json"] == {
        "name": "ratelimit.service.rate_limit.d.k.total_hits.__a=b",
        "type": "counter",
        "value": "1.000000",
    }
    timer = by_name["ratelimit_server.ShouldRateLimit.response_time.__a=b"]
    assert timer["json"]["type"] == "timer" and timer["json"]["value"] == "2.500000"


def test_listen_address_parsing() -> None:
    assert parse_listen_address(":9090") == (None, 9090)
    assert parse_listen_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen_address("[::1]:9091") == ("::1", 9091)
    with pytest.raises(SinkError):
        parse_listen_address("9090")
