"""The sink the reference's runner would choose (`src/service_cmd/runner/runner.go`).

`create_sink(settings, stats)` returns one of:

* `Sink` (a null sink) when DISABLE_STATS (counting goes on in memory for `/stats`);
* `DogStatsdSink` (USE_DOG_STATSD): DogStatsD lines over UDP (`dogstatsd`);
* `StatsdSink` (USE_STATSD, the default): plain statsd lines over TCP or UDP (`statsd`);
* `PrometheusSink` (USE_PROMETHEUS): the text exposition over HTTP (`prometheus`);
* `LoggingSink` otherwise: gostats' JSON log lines on stderr (`stdout`).

A second enabled sink is an error (`SinkError`), as it is fatal in the reference.
"""

from __future__ import annotations

from typing import Any, TextIO

from ..settings import Settings
from .base import NullSink, Sink, SinkError
from .dogstatsd import DogStatsdSink
from .mapper import MetricMapper
from .prometheus import PrometheusSink, Serve
from .statsd import StatsdSink
from .stdout import LoggingSink
from .store import StatsStore
from .workershare import WorkerShare


def create_sink(
    settings: Settings,
    stats: StatsStore,
    *,
    worker_index: int | None = None,
    share_dir: str | None = None,
    stream: TextIO | None = None,
    serve: Serve | None = None,
) -> Sink:
    """The sink the reference's runner would build from these settings (not started).

    `worker_index` and `share_dir` are given to every worker process when the daemon runs
    RATELIMITD_WORKERS > 1: the Prometheus sink then serves the sum over the workers.
    `serve` makes the HTTP listener the Prometheus sink serves on (the daemon's
    `transport.http.HttpServer`).
    """
    cfg = settings.stats
    if not cfg.disable:
        enabled = [
            name
            for name, on in (
                ("USE_DOG_STATSD", cfg.use_dog_statsd),
                ("USE_STATSD", cfg.use_statsd),
                ("USE_PROMETHEUS", cfg.use_prometheus),
            )
            if on
        ]
        if len(enabled) > 1:
            raise SinkError(
                f"{', '.join(enabled)}: only one stats sink may be enabled (USE_STATSD "
                "defaults to true, so set USE_STATSD=false to use another sink)"
            )
    kind = cfg.sink
    # What every sink that sends takes: EXTRA_TAGS and the flush period.
    common: dict[str, Any] = {"extra_tags": cfg.extra_tags, "flush_interval": cfg.flush_interval}
    host, port = cfg.statsd_host, cfg.statsd_port
    if kind == "dogstatsd":
        return DogStatsdSink(stats, host, port, mogrifiers=cfg.dog_statsd_mogrifiers, **common)
    if kind == "statsd":
        return StatsdSink(stats, host, port, protocol=cfg.statsd_protocol, **common)
    if kind == "prometheus":
        share = None
        if share_dir is not None and worker_index is not None:
            share = WorkerShare(share_dir, worker_index)
        return PrometheusSink(
            stats,
            MetricMapper.from_settings(cfg),
            addr=cfg.prometheus_addr,
            path=cfg.prometheus_path,
            share=share,
            serve=serve,
            **common,
        )
    if kind == "stdout":
        return LoggingSink(stats, stream=stream, **common)
    return NullSink(stats, cfg.flush_interval)
