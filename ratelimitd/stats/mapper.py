"""statsd names -> Prometheus names and labels, with statsd_exporter's mapping semantics.

The reference serves its Prometheus metrics through statsd_exporter's mapper; this is the
subset of it the reference's default mapping and user mappings (PROMETHEUS_MAPPER_YAML) use.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..settings import StatsSettings
from .base import SinkError, expand
from .store import BUDGET_STATS

log = logging.getLogger("ratelimitd.stats")

# prometheus client_golang's DefBuckets (seconds), statsd_exporter's default histogram.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# The reference's src/stats/prom/default_mapper.yaml, with the response time scaled from
# milliseconds to seconds unless PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS.
# `rate_limit` is the STATS_RATE_LIMIT_GAUGES extension's gauge, absent from the reference's,
# and the budget_* series the token budgets' (stats/store.py BUDGET_STATS).
_RULE_STATS = (
    "near_limit",
    "over_limit",
    "total_hits",
    "within_limit",
    "shadow_mode",
    "rate_limit",
    *BUDGET_STATS,
    "budget_full",
)


def default_mapping_config(response_time_as_milliseconds: bool = False) -> dict[str, Any]:
    """The default mapper as a statsd_exporter mapping config (a YAML-shaped dict)."""
    mappings: list[dict[str, Any]] = []
    for stat in _RULE_STATS:
        mappings.append(
            {
                "match": f"ratelimit.service.rate_limit.*.*.{stat}",
                "name": f"ratelimit_service_rate_limit_{stat}",
                "timer_type": "histogram",
                "labels": {"domain": "$1", "key1": "$2"},
            }
        )
    for stat in _RULE_STATS:
        mappings.append(
            {
                "match": (
                    r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\." + stat
                ),
                "match_type": "regex",
                "name": f"ratelimit_service_rate_limit_{stat}",
                "timer_type": "histogram",
                "labels": {"domain": "$1", "key1": "$2", "key2": "$3"},
            }
        )
    mappings += [
        {
            "match": "ratelimit.service.call.should_rate_limit.*",
            "name": "ratelimit_service_should_rate_limit_error",
            "match_metric_type": "counter",
            "labels": {"err_type": "$1"},
        },
        {
            "match": "ratelimit_server.*.total_requests",
            "name": "ratelimit_service_total_requests",
            "match_metric_type": "counter",
            "labels": {"grpc_method": "$1"},
        },
        {
            "match": "ratelimit_server.*.response_time",
            "name": "ratelimit_service_response_time_seconds",
            "timer_type": "histogram",
            "scale": 1.0 if response_time_as_milliseconds else 0.001,
            "labels": {"grpc_method": "$1"},
        },
        {
            "match": "ratelimit.service.config_load_success",
            "name": "ratelimit_service_config_load_success",
            "match_metric_type": "counter",
        },
        {
            "match": "ratelimit.service.config_load_error",
            "name": "ratelimit_service_config_load_error",
            "match_metric_type": "counter",
        },
        # Extension: the quota service's buckets and streams as labels, not one metric name
        # each (docs/rlqs.md); the bucket key holds dots, so a regex.
        {
            "match": r"^ratelimit\.rlqs\.bucket\.([^\.]*)\.(.*)\.([a-z_]+)$",
            "match_type": "regex",
            "name": "ratelimit_rlqs_bucket_$3",
            "labels": {"domain": "$1", "bucket": "$2"},
        },
        {
            "match": "ratelimit.rlqs.stream.*.*",
            "name": "ratelimit_rlqs_stream_$2",
            "labels": {"stream": "$1"},
        },
    ]
    return {"mappings": mappings}


_NOT_NAME_CHAR = re.compile(r"[^a-zA-Z0-9_]")

# statsd_exporter reads a mapping file with yaml.UnmarshalStrict into these fields (its
# MapperConfigDefaults and MetricMapping): any other key makes the whole file invalid.
_DEFAULTS_KEYS = frozenset(
    {
        "observer_type", "timer_type", "buckets", "quantiles", "match_type",
        "glob_disable_ordering", "ttl", "summary_options", "histogram_options",
    }
)  # fmt: skip
_MAPPING_KEYS = frozenset(
    {
        "match", "name", "labels", "honor_labels", "observer_type", "timer_type", "buckets",
        "quantiles", "match_type", "help", "action", "match_metric_type", "ttl",
        "summary_options", "histogram_options", "scale",
    }
)  # fmt: skip
# statsd_exporter's labelNameRE and metricNameRE (a name may hold ${N} / $N templates).
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]+$")
_TEMPLATE = r"\$\{?\d+\}?"
_METRIC_NAME = re.compile(rf"^([a-zA-Z_]|{_TEMPLATE})([a-zA-Z0-9_]|{_TEMPLATE})*$")


def _unknown(keys: Any, known: frozenset[str], where: str) -> None:
    extra = sorted(str(k) for k in keys if k not in known)
    if extra:
        raise SinkError(f"prometheus mapper: unknown field {extra[0]!r} in {where}")


def escape_metric_name(name: str) -> str:
    """statsd_exporter's name for an unmapped statistic: non-[a-zA-Z0-9_] -> `_`."""
    name = _NOT_NAME_CHAR.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


@dataclass(frozen=True)
class Mapping:
    """One statsd_exporter mapping rule (the subset the reference's mapper uses)."""

    regex: re.Pattern[str]
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    metric_type: str = ""  # "", counter, gauge, observer
    drop: bool = False
    observer: str = "histogram"  # histogram | summary
    buckets: tuple[float, ...] = DEFAULT_BUCKETS
    scale: float = 1.0


@dataclass(frozen=True)
class Mapped:
    """Where one statistic goes in the exposition."""

    name: str
    labels: tuple[tuple[str, str], ...]
    mapping: Mapping | None


class MetricMapper:
    """statsd names -> Prometheus names and labels, statsd_exporter's mapping semantics.

    Supported: `mappings` with `match` (glob, `*` = one dot-free component, or
    `match_type: regex`, searched unanchored as Go does), `name`, `labels` with `$N`
    references, `match_metric_type` (counter | gauge | observer/timer), `action: drop`,
    `timer_type`/`observer_type` (histogram | summary), `buckets` or
    `histogram_options.buckets`, `scale`, and `defaults` for the last four. The first
    matching rule wins; an unmatched statistic is exported under its escaped name.
    """

    def __init__(self, mappings: Sequence[Mapping]) -> None:
        self.mappings = tuple(mappings)
        self._cache: dict[tuple[str, str], Mapped | None] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MetricMapper:
        """Build from a parsed mapping YAML."""
        if not isinstance(config, dict):
            raise SinkError("prometheus mapper: expected a mapping with a 'mappings' list")
        _unknown(config, frozenset(("defaults", "mappings")), "the file")
        defaults = config.get("defaults") or {}
        _unknown(defaults, _DEFAULTS_KEYS, "defaults")
        mappings = []
        for raw in config.get("mappings") or []:
            if not isinstance(raw, dict) or "match" not in raw:
                raise SinkError(f"prometheus mapper: a mapping needs 'match': {raw!r}")
            _unknown(raw, _MAPPING_KEYS, f"mapping {raw['match']!r}")
            match = str(raw["match"])
            match_type = raw.get("match_type", defaults.get("match_type", "glob"))
            try:
                if match_type == "regex":
                    regex = re.compile(match)
                else:
                    regex = re.compile("^" + re.escape(match).replace(r"\*", "([^.]*)") + "$")
            except re.error as err:
                raise SinkError(f"prometheus mapper: bad match {match!r}: {err}") from None
            action = raw.get("action", "map")
            name = str(raw.get("name", ""))
            if action != "drop" and not name:
                raise SinkError(f"prometheus mapper: mapping {match!r} has no name")
            if name and not _METRIC_NAME.match(name):
                raise SinkError(f"prometheus mapper: bad metric name {name!r}")
            for label in raw.get("labels") or {}:
                if not _LABEL_NAME.match(str(label)):
                    raise SinkError(f"prometheus mapper: invalid label key: {label}")
            options = raw.get("histogram_options") or {}
            buckets = (
                raw.get("buckets")
                or options.get("buckets")
                or defaults.get("buckets")
                or (defaults.get("histogram_options") or {}).get("buckets")
                or DEFAULT_BUCKETS
            )
            kind = str(raw.get("match_metric_type", "")).replace("timer", "observer")
            observer = raw.get("observer_type") or raw.get("timer_type")
            observer = observer or defaults.get("observer_type") or defaults.get("timer_type")
            mappings.append(
                Mapping(
                    regex=regex,
                    name=name,
                    labels=tuple((str(k), str(v)) for k, v in (raw.get("labels") or {}).items()),
                    metric_type=kind,
                    drop=action == "drop",
                    observer="summary" if observer == "summary" else "histogram",
                    buckets=tuple(sorted(float(b) for b in buckets)),
                    scale=float(raw.get("scale", 1.0)),
                )
            )
        return cls(mappings)

    @classmethod
    def from_settings(cls, settings: StatsSettings) -> MetricMapper:
        """PROMETHEUS_MAPPER_YAML when set and usable, else the reference's default mapping.

        The file is read once, at start-up, as the reference reads it. A file that cannot
        be read or is not a valid mapping never stops the daemon: the reference ignores
        the error (`_ = sink.mapper.InitFromFile(...)`) and serves, and Envoy Gateway mounts
        this file from an optional ConfigMap. Where the reference then maps nothing
        (every name escaped, no labels), ratelimitd logs why and serves the default
        mapping, which is the content Envoy Gateway's ConfigMap holds.
        """
        default = default_mapping_config(settings.prometheus_response_time_as_milliseconds)
        path = settings.prometheus_mapper_yaml
        if not path:
            return cls.from_config(default)
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_config(yaml.safe_load(f))
        except OSError as err:
            problem = f"cannot read {path}: {err.strerror or err}"
        except (UnicodeDecodeError, yaml.YAMLError, SinkError, ValueError, TypeError) as err:
            problem = f"{path} is not a valid mapping: {' '.join(str(err).split())}"
        log.warning(
            "PROMETHEUS_MAPPER_YAML: %s; serving the default mapping (the file is read "
            "only at start-up)",
            problem,
        )
        return cls.from_config(default)

    def map(self, name: str, kind: str) -> Mapped | None:
        """The exposition name and labels of a statistic (kind: counter | gauge |
        observer), or None when a rule drops it."""
        key = (name, kind)
        if key in self._cache:
            return self._cache[key]
        result: Mapped | None = Mapped(escape_metric_name(name), (), None)
        for m in self.mappings:
            if m.metric_type and m.metric_type != kind:
                continue
            match = m.regex.search(name)
            if match is None:
                continue
            if m.drop:
                result = None
                break
            groups = (match.group(0), *match.groups())
            labels = tuple((k, expand(v, groups)) for k, v in m.labels)
            result = Mapped(escape_metric_name(expand(m.name, groups)), labels, m)
            break
        self._cache[key] = result
        return result
