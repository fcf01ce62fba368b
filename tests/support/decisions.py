"""Random configs and requests for the decision model's property tests, and the property:
what `/explain` predicts (`Admin.explain`, the service's dry run) is what the service then
decides (tests/core/test_explain.py on memory, tests/redis/test_explain.py on Redis).

The configs use every feature that changes a decision: the three algorithms, N-unit
windows, several limits, shadow and quota mode, unlimited rules, `replaces`, wildcards and
key-only entries at two levels; the requests: hits_addend (request and descriptor, 0 too),
limit overrides and refunds; the settings: global shadow and quota mode, the local
over-limit cache, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import strategies as st

from ratelimitd.admin import Admin, AdminError
from ratelimitd.messages import CODE_NAMES, Descriptor, Request, ServiceError

DOMAIN = "p"
KEYS = ("a", "b")
VALUES = ("x", "y", "")
UNITS = ("second", "minute", "hour")
ALGORITHMS = ("fixed_window", "sliding_window", "token_bucket")
NAMES = ("n0", "n1", "n2")


@st.composite
def _limit(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    limit: dict[str, Any] = {
        "unit": draw(st.sampled_from(UNITS)),
        "requests_per_unit": draw(st.integers(0, 4)),
    }
    algorithm = draw(st.sampled_from(ALGORITHMS))
    if algorithm != "fixed_window":
        limit["algorithm"] = algorithm
    if draw(st.booleans()) and draw(st.booleans()):
        limit["unit_multiplier"] = 2
    if draw(st.booleans()):
        limit["name"] = name = NAMES[len(names) % len(NAMES)] + f"_{len(names)}"
        names.append(name)
    return limit


@st.composite
def _entry(draw: st.DrawFn, names: list[str], depth: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"key": draw(st.sampled_from(KEYS))}
    value = draw(st.sampled_from(("x", "y", "x*", None)))
    if value is not None:
        entry["value"] = value
    kind = draw(st.sampled_from(("limit", "limit", "limits", "unlimited", "none")))
    if kind == "limit":
        entry["rate_limit"] = draw(_limit(names))
    elif kind == "limits":
        first = draw(_limit(names))
        second = draw(_limit(names))
        # Two limits of one list may not share an algorithm and window.
        second["unit"] = next(u for u in UNITS if u != first["unit"])
        entry["rate_limits"] = [first, second]
    elif kind == "unlimited":
        entry["rate_limit"] = {"unlimited": True}
        if draw(st.booleans()):
            entry["rate_limit"]["name"] = name = f"u{len(names)}"
            names.append(name)
    if kind != "none":
        if draw(st.booleans()) and draw(st.booleans()):
            entry["shadow_mode"] = True
        if draw(st.booleans()) and draw(st.booleans()):
            entry["quota_mode"] = True
    if depth < 2 and draw(st.booleans()):
        entry["descriptors"] = draw(_entries(names, depth + 1))
    return entry


@st.composite
def _entries(draw: st.DrawFn, names: list[str], depth: int) -> list[dict[str, Any]]:
    out = []
    seen = set()
    for entry in draw(st.lists(_entry(names, depth), min_size=1, max_size=3)):
        final = entry["key"] + ("_" + entry["value"] if "value" in entry else "")
        if final not in seen:  # composite keys are unique per level
            seen.add(final)
            out.append(entry)
    return out


@st.composite
def _config(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A valid config's descriptors (domain DOMAIN)."""
    names: list[str] = []
    descriptors = draw(_entries(names, 0))
    # `replaces` names limits of other rules (never the rule's own).
    if names:
        for entry in _walk(descriptors):
            limits = entry.get("rate_limits") or [entry.get("rate_limit")]
            for limit in limits:
                if limit is None or limit.get("unlimited") or not draw(st.booleans()):
                    continue
                own = {x.get("name") for x in limits if x}
                others = [n for n in names if n not in own]
                if others:
                    limit["replaces"] = [{"name": draw(st.sampled_from(others))}]
    return descriptors


def _walk(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        out.append(entry)
        out += _walk(entry.get("descriptors", []))
    return out


@st.composite
def _path(draw: st.DrawFn, config: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """Entries that follow the config down a branch (most of them then match a rule)."""
    entries = []
    level = config
    while level:
        entry = draw(st.sampled_from(level))
        value = entry.get("value")
        if value is None:
            value = draw(st.sampled_from(VALUES))
        elif value.endswith("*"):
            value = value[:-1] + draw(st.sampled_from(("", "z")))
        entries.append((entry["key"], value))
        level = entry.get("descriptors", [])
        if not level or draw(st.booleans()):
            break
    return tuple(entries)


@st.composite
def _descriptor(draw: st.DrawFn, config: list[dict[str, Any]]) -> Descriptor:
    if draw(st.integers(0, 3)):
        entries = draw(_path(config))
    else:
        entries = tuple(
            (draw(st.sampled_from(KEYS)), draw(st.sampled_from(VALUES)))
            for _ in range(draw(st.integers(1, 3)))
        )
    limit = None
    if draw(st.integers(0, 9)) == 0:
        limit = (draw(st.integers(0, 3)), draw(st.integers(1, 3)))
    hits = draw(st.one_of(st.none(), st.integers(0, 3)))
    refund = draw(st.integers(0, 9)) == 0
    return Descriptor(entries, limit, hits, refund)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, list[tuple[float, Request]]]:
    """A config (YAML) and requests, each after a pause of 0 to 1.75 s; the descriptors of a
    request repeat one another at times (one key counted twice in one request)."""
    config = draw(_config())
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        pool = draw(st.lists(_descriptor(config), min_size=1, max_size=3))
        ds = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
        pause = draw(st.integers(0, 7)) / 4
        steps.append((pause, Request(DOMAIN, ds, draw(st.integers(0, 3)))))
    return yaml.safe_dump({"domain": DOMAIN, "descriptors": config}), steps


# Global settings: SHADOW_MODE, QUOTA_MODE, a local cache, STOP_CACHE_KEY_INCREMENT_...
modes = st.fixed_dictionaries(
    {
        "shadow": st.booleans(),
        "quota": st.booleans(),
        "local_cache": st.booleans(),
        "stop_increment": st.booleans(),
    }
)


def decided(response: Any) -> dict[str, Any]:
    """A response as `/explain` tells it: the overall code, and per descriptor the decision
    and, where a limit applied, its remaining and reset."""
    out = []
    for status in response.statuses:
        shown: dict[str, Any] = {"decision": CODE_NAMES[status.code]}
        if status.rule is not None:
            shown["limit_remaining"] = status.limit_remaining
            shown["duration_until_reset"] = status.duration_until_reset
        out.append(shown)
    return {"overall_code": CODE_NAMES[response.overall_code], "descriptors": out}


def told(explained: dict[str, Any]) -> dict[str, Any]:
    """The same from `/explain`'s answer."""
    keep = ("decision", "limit_remaining", "duration_until_reset")
    return {
        "overall_code": explained["overall_code"],
        "descriptors": [{k: d[k] for k in keep if k in d} for d in explained["descriptors"]],
    }


def _decision_stats(stats: Any) -> dict[str, float]:
    """The statistics of decisions and of the local cache (not the store's connections and
    round trips, which a dry run uses too)."""
    return {
        name: value
        for name, value in stats.snapshot().items()
        if name.startswith(("ratelimit.service.", "ratelimit.localcache."))
    }


async def explain_then_decide(service: Any, stats: Any, request: Request) -> None:
    """Explain `request`, check that it counted nothing, decide it: the same answer (or
    the same refusal)."""
    admin = Admin(service)
    before = _decision_stats(stats)
    try:
        predicted: Any = told(await admin.explain(request))
    except AdminError as exc:
        predicted = ("refused", str(exc))
    assert _decision_stats(stats) == before, "/explain counted something"
    try:
        actual: Any = decided(await service.should_rate_limit(request))
    except ServiceError as exc:
        actual = ("refused", str(exc))
    assert predicted == actual, request
