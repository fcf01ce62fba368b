"""Meters: what is aggregated from the metered events (or from the counted requests), per
account, in hour or day windows, from YAML (`meters.yaml`, or USAGE_METERS_FILE).

    meters:
      - slug: tokens                  # [a-z0-9_]{1,64}, the query's path segment
        eventType: llm.tokens         # the CloudEvents `type` it aggregates
        valueProperty: $.total_tokens # JSONPath into `data` (a `$.a.b` path); not for count
        aggregation: sum              # sum | count | max | unique_count
        groupBy: {model: $.model}     # dimension name -> JSONPath into `data`
        limits: {pro: 1000000}        # optional quota per plan: threshold webhooks

`requests` is built in: the requests the middleware counts (the quota), read from the daily
rollup, so it has day windows only and no dimensions. A meter with `limits` notifies the
account's thresholds (its plan's or its own) of the limit in the account's usage window, as
the request quota does. Aggregation is pure arithmetic over decoded events; the data access
is `db.metered`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from .plans import PLAN_NAMES, read_file

AGGREGATIONS = ("sum", "count", "max", "unique_count")
WindowSize = Literal["hour", "day"]
WINDOW_SIZES: dict[str | None, int] = {"hour": 3600, "day": 86400}
REQUESTS = "requests"  # the built-in meter of counted requests
DEFAULT_METERS_FILE = Path(__file__).resolve().parent / "meters.yaml"
_SLUG = re.compile(r"[a-z0-9_]{1,64}")
_PATH = re.compile(r"\$(\.[A-Za-z_][A-Za-z0-9_-]*)+")
MAX_GROUP_BY = 5


class MeterError(ValueError):
    """A meters file that cannot be used."""


class Meter(msgspec.Struct, frozen=True):
    """One declared meter (see the module docstring)."""

    slug: str
    event_type: str
    aggregation: Literal["sum", "count", "max", "unique_count"]
    value_property: str | None = None
    group_by: tuple[tuple[str, str], ...] = ()
    limits: tuple[tuple[str, int], ...] = ()
    description: str = ""

    @property
    def builtin(self) -> bool:
        """The meter of counted requests (day windows, no dimensions, no events)."""
        return self.slug == REQUESTS

    def limit(self, plan: str) -> int | None:
        """The plan's quota of this meter, if it has one."""
        return dict(self.limits).get(plan)

    def window_sizes(self) -> tuple[WindowSize, ...]:
        """The window sizes a query may ask for."""
        return ("day",) if self.builtin else ("hour", "day")


REQUESTS_METER = Meter(
    REQUESTS, "", "count", description="Requests counted against the plan's quota."
)


def path_value(data: Any, path: str) -> Any:
    """The value at `$.a.b` in decoded `data`, or None when absent."""
    for name in path[2:].split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data


def number(value: Any) -> float | None:
    """An event's value as a number (a JSON number or a numeric string, as OpenMeter takes
    it), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return None
    return None


def plain(value: float) -> float | int:
    """A meter's value as JSON shows it: a whole number without its `.0`."""
    return int(value) if float(value).is_integer() else value


def check_event(meter: Meter, data: Any) -> str | None:
    """Why `meter` could not aggregate an event with `data` (None: it can)."""
    if meter.value_property is None:
        return None
    value = path_value(data, meter.value_property)
    if meter.aggregation == "unique_count":
        if not isinstance(value, str | int) or isinstance(value, bool):
            return f"meter {meter.slug!r}: data {meter.value_property} must be a string or integer"
        return None
    if number(value) is None:
        return f"meter {meter.slug!r}: data {meter.value_property} must be a number"
    return None


class Bucket(msgspec.Struct):
    """One window of one group while aggregating."""

    value: float = 0
    count: int = 0
    seen: set[Any] | None = None


def aggregate(
    meter: Meter,
    events: Iterable[tuple[int, Any]],
    start_ms: int,
    window_ms: int,
    group_by: tuple[str, ...],
) -> list[tuple[int, tuple[Any, ...], float]]:
    """(window index, group values, value) for `(time_ms, data)` events, by window then
    group; windows start at `start_ms` and last `window_ms`."""
    paths = dict(meter.group_by)
    group_paths = [paths[name] for name in group_by]
    buckets: dict[tuple[int, tuple[Any, ...]], Bucket] = {}
    kind = meter.aggregation
    prop = meter.value_property
    for time_ms, data in events:
        group = tuple(_dimension(path_value(data, p)) for p in group_paths)
        key = ((time_ms - start_ms) // window_ms, group)
        b = buckets.get(key)
        if b is None:
            b = buckets[key] = Bucket(seen=set() if kind == "unique_count" else None)
        b.count += 1
        if kind == "count" or prop is None:
            continue
        value = path_value(data, prop)
        if kind == "unique_count":
            assert b.seen is not None
            b.seen.add(value)
            continue
        n = number(value) or 0
        if kind == "max":
            b.value = n if b.count == 1 else max(b.value, n)
        else:
            b.value += n
    out = []
    for (index, group), b in sorted(buckets.items(), key=lambda kv: (kv[0][0], _order(kv[0][1]))):
        if kind == "count":
            total: float = b.count
        elif kind == "unique_count":
            total = len(b.seen or ())
        else:
            total = b.value
        out.append((index, group, total))
    return out


def _dimension(value: Any) -> Any:
    """A group's value: strings and numbers as they are, anything else (absent: None) as
    None, so one missing property does not make a group per shape."""
    return value if isinstance(value, str | int | float) and not isinstance(value, bool) else None


def _order(group: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple("" if v is None else str(v) for v in group)


def _path(value: Any, where: str) -> str:
    if not isinstance(value, str) or _PATH.fullmatch(value) is None:
        raise MeterError(f"{where}: {value!r} is not a JSONPath like $.total_tokens")
    return value


def _meter(spec: Any, where: str) -> Meter:
    allowed = {"slug", "eventType", "valueProperty", "aggregation", "groupBy", "limits",
               "description"}  # fmt: skip
    if not isinstance(spec, dict) or set(spec) - allowed:
        raise MeterError(f"{where}: a meter takes only {', '.join(sorted(allowed))}")
    slug = spec.get("slug")
    if not isinstance(slug, str) or _SLUG.fullmatch(slug) is None:
        raise MeterError(f"{where}: slug {slug!r} must be 1-64 of a-z 0-9 _")
    where = f"{where} ({slug})"
    if slug == REQUESTS:
        raise MeterError(f"{where}: {REQUESTS!r} is the built-in meter of counted requests")
    event_type = spec.get("eventType")
    if not isinstance(event_type, str) or not event_type:
        raise MeterError(f"{where}: eventType must be a non-empty string")
    aggregation = spec.get("aggregation")
    if aggregation not in AGGREGATIONS:
        raise MeterError(f"{where}: aggregation must be one of {', '.join(AGGREGATIONS)}")
    prop = spec.get("valueProperty")
    if aggregation == "count":
        if prop is not None:
            raise MeterError(f"{where}: a count meter has no valueProperty (it counts events)")
    else:
        prop = _path(prop, f"{where}: valueProperty")
    groups = spec.get("groupBy", {})
    if not isinstance(groups, dict) or len(groups) > MAX_GROUP_BY:
        raise MeterError(f"{where}: groupBy must map at most {MAX_GROUP_BY} names to JSONPaths")
    group_by = tuple(sorted((str(k), _path(v, f"{where}: groupBy {k}")) for k, v in groups.items()))
    limits = spec.get("limits", {})
    if not isinstance(limits, dict):
        raise MeterError(f"{where}: limits must map plans to quotas")
    for plan, limit in limits.items():
        if plan not in PLAN_NAMES:
            raise MeterError(f"{where}: limits: unknown plan {plan!r}")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise MeterError(f"{where}: limits: {plan}: a positive integer")
    description = spec.get("description", "")
    return Meter(
        slug, event_type, aggregation, prop, group_by, tuple(sorted(limits.items())),
        str(description),
    )  # fmt: skip


def parse_meters(text: str, source: str = "<meters>") -> dict[str, Meter]:
    """The meters of YAML text `meters: [...]`, the built-in `requests` first."""
    try:
        doc: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise MeterError(f"{source}: not YAML: {exc}") from None
    raw = doc.get("meters", []) if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise MeterError(f"{source}: expected 'meters: [{{slug, eventType, aggregation}}, ...]'")
    meters = {REQUESTS: REQUESTS_METER}
    for i, spec in enumerate(raw):
        meter = _meter(spec, f"{source}: meters[{i}]")
        if meter.slug in meters:
            raise MeterError(f"{source}: meters[{i}]: slug {meter.slug!r} is declared twice")
        meters[meter.slug] = meter
    return meters


def load_meters(path: str | Path | None = None) -> dict[str, Meter]:
    """The meters of `path` (default: the shipped meters.yaml)."""
    return parse_meters(*read_file(path, DEFAULT_METERS_FILE, MeterError))


def by_event_type(meters: Mapping[str, Meter]) -> dict[str, list[Meter]]:
    """The event meters of each event type."""
    out: dict[str, list[Meter]] = {}
    for meter in meters.values():
        if not meter.builtin:
            out.setdefault(meter.event_type, []).append(meter)
    return out
