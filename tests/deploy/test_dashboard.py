"""deploy/grafana and deploy/prometheus against a real daemon: every metric name (and every
label) the dashboard's queries and the alert rules use is in the Prometheus exposition of a
daemon on a real Redis that has decided within, near and over its limits; the names Envoy
Gateway's "Global Ratelimit" dashboard reads are there with its labels.

The only name from elsewhere is kube-state-metrics' restart count (a restarted process cannot
count its predecessor's deaths).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support import free_port, http_get
from support.daemon import DaemonProcess, start_redis_daemon
from support.manifests import ALERTS, DASHBOARD, promql_metric_names
from support.redis_server import RedisServer

from ratelimitd.messages import OK, OVER_LIMIT

KUBERNETES_METRICS = {
    # kube-state-metrics: the restarts alert.
    "kube_pod_container_status_restarts_total": "kube-state-metrics",
}
# Labels the scrape itself adds (the Prometheus operator's target labels), not the daemon.
TARGET_LABELS = {"namespace", "pod", "container", "job", "instance", "service"}
ENVOY_GATEWAY_METRICS = (
    "ratelimit_service_rate_limit_total_hits",
    "ratelimit_service_rate_limit_near_limit",
    "ratelimit_service_rate_limit_over_limit",
)
CONFIG = """\
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: generic_key
    value: vhost
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1000}
"""

Series = dict[str, list[dict[str, str]]]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Series]:
    """Sample name -> the label sets of its series, from a daemon that has decided."""
    root = tmp_path_factory.mktemp("scrape")
    redis = RedisServer(root / "redis").wait_ready()
    metrics_port = free_port()
    address = f"127.0.0.1:{redis.port}"
    daemon: DaemonProcess | None = None
    try:
        daemon = start_redis_daemon(
            root,
            address,
            CONFIG,
            USE_PROMETHEUS="true",
            PROMETHEUS_ADDR=f"127.0.0.1:{metrics_port}",
            BACKEND_BREAKER_FAILURES="3",
            REDIS_PERSECOND="true",
            REDIS_PERSECOND_SOCKET_TYPE="tcp",
            REDIS_PERSECOND_URL=address,
        )
        codes = [daemon.decide("edge", [("user", "alice")]).overall_code for _ in range(6)]
        assert codes == [OK] * 5 + [OVER_LIMIT]  # within, near (4th, 5th), over
        nested = daemon.decide("edge", [("generic_key", "vhost"), ("path", "/a")])
        assert nested.overall_code == OK
        status, body = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200
    finally:
        if daemon is not None:
            daemon.close()
        redis.close()
    yield exposition_series(body.decode())


_SAMPLE = re.compile(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+\S+$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def exposition_series(text: str) -> Series:
    """Sample names and label sets as Prometheus stores them from the text format (a parser
    that follows OpenMetrics would rename counters to `<name>_total`)."""
    series: Series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, line
        labels = dict(_LABEL.findall(match.group(2) or ""))
        series.setdefault(match.group(1), []).append(labels)
    return series


def dashboard_queries() -> list[str]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in panels(board["panels"]) for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(<selector>, <label>): the selector is a query too.
            queries.append(
                variable["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
            )
    return queries


def alert_queries() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def check_against_scrape(queries: list[str], scraped: Series) -> set[str]:
    """Each name a query selects is scraped (or one of KUBERNETES_METRICS); each label it
    matches on is one the daemon's series carry, and each exact value one they have. The
    names from elsewhere that the queries use."""
    elsewhere = set(KUBERNETES_METRICS)
    used = set()
    for query in queries:
        names = promql_metric_names(query)
        assert names, query
        used |= names
        missing = names - set(scraped) - elsewhere
        assert not missing, f"not exported by the daemon: {sorted(missing)} in {query}"
        for name, matchers in _SELECTOR.findall(query):
            if name in elsewhere:
                continue
            labels = scraped[name]
            for label, op, value in _MATCHER.findall(matchers):
                if label in TARGET_LABELS:
                    continue
                assert any(label in s for s in labels), f"{name} has no label {label}"
                if op == "=" and "$" not in value:
                    assert any(s.get(label) == value for s in labels), f"{name}{{{label}={value}}}"
    return used & elsewhere


def test_dashboard_uses_what_the_daemon_exports(scraped: Series) -> None:
    from_kubernetes = check_against_scrape(dashboard_queries(), scraped)
    assert from_kubernetes == set()


def test_alerts_use_what_the_daemon_exports(scraped: Series) -> None:
    from_kubernetes = check_against_scrape(alert_queries(), scraped)
    assert from_kubernetes == {"kube_pod_container_status_restarts_total"}


def test_a_name_the_daemon_does_not_export_is_caught(scraped: Series) -> None:
    with pytest.raises(AssertionError, match="not exported by the daemon"):
        check_against_scrape(["rate(ratelimit_service_rate_limit_total_hit[5m])"], scraped)
    with pytest.raises(AssertionError, match="no label key3"):
        check_against_scrape(['ratelimit_service_rate_limit_total_hits{key3="x"}'], scraped)


def test_envoy_gateway_dashboard_metrics_are_exported(scraped: Series) -> None:
    # Its panels read these with domain, key1 and key2 (the second descriptor level).
    for name in ENVOY_GATEWAY_METRICS:
        labels = scraped[name]
        assert {"domain": "edge", "key1": "user"} in labels, name
        assert any(s.get("key2") == "path" and s["key1"] == "generic_key_vhost" for s in labels)
    # This dashboard shows the same three totals as Envoy Gateway's stat panels.
    board = DASHBOARD.read_text()
    for name in ENVOY_GATEWAY_METRICS:
        assert f"sum({name}{{" in board


def test_dashboard_panels() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "ratelimitd"
    titles = set()
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        titles.add(panel["title"])
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
    # decisions, over/near limit by domain and key, latency histogram, Redis round trips and
    # errors, breaker state, config loads, memory
    assert {
        "Decisions / s",
        "Over limit by domain and key",
        "Near limit by domain and key",
        "ShouldRateLimit latency",
        "Redis round trips / s",
        "Errors / s",
        "Circuit breaker",
        "Config loads",
        "Memory",
    } <= titles
    (heatmap,) = [p for p in board["panels"] if p["type"] == "heatmap"]
    assert "_bucket" in heatmap["targets"][0]["expr"]
