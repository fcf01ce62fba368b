"""Counters you can inspect, reset and explain (extension; asked upstream in
#191, #422, #509).

`Admin` answers three questions about the config in force and the counter store, without
counting anything:

- `explain(request)`: per descriptor, which rule matched and why (the walk, level by level:
  exact, wildcard or key-only, as the reference's GetLimit takes them), whether a request
  override or a `replaces` decided instead, the stats key, the cache key(s), the current
  value of each window and the status the request would get — a dry run: the store is read,
  never written, and no statistic moves.
- `counter(domain, entries)`: the same for one descriptor with no hits.
- `reset(domain, entries)`: deletes every window's key of that descriptor (all its limits)
  in the store and in this process's local over-limit cache; audited in the log.

The debug listener serves them only when ADMIN_TOKEN is set (`transport/debug.py`); the CLI
(`ratelimitd counters`, `ratelimitd explain`) calls those endpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import keys
from ._match_py import wildcard_match
from .config import Rule
from .config.ruleset import NodeSpec
from .limiter import Limiter
from .messages import MAX_UINT32, OK, OVER_LIMIT, Descriptor, Request, Status
from .service import RateLimitService, overall_code
from .stats import RuleStats

audit = logging.getLogger("ratelimitd.audit")

__all__ = ["Admin", "AdminError"]

CODE_NAMES = {0: "UNKNOWN", OK: "OK", OVER_LIMIT: "OVER_LIMIT"}


class AdminError(ValueError):
    """A request the admin endpoints refuse (400 with this message)."""


class Admin:
    """Dry runs and resets against the service's config and store."""

    def __init__(self, service: RateLimitService, clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self.clock = clock

    @property
    def limiter(self) -> Limiter:
        return self.service.limiter

    async def explain(self, request: Request) -> dict[str, Any]:
        """What `request` would get, descriptor by descriptor, counting nothing."""
        ruleset = self.service.ruleset
        if ruleset is None:
            raise AdminError("no rate limit configuration loaded")
        if not request.domain:
            raise AdminError("rate limit domain must not be empty")
        if not request.descriptors:
            raise AdminError("rate limit descriptor list must not be empty")
        opts = self.service.snapshot.options
        if len(request.descriptors) > opts.max_descriptors:
            raise AdminError(
                f"{len(request.descriptors)} descriptors in one request "
                f"(MAX_DESCRIPTORS_PER_REQUEST={opts.max_descriptors})"
            )
        if any(len(d.entries) > opts.max_entries for d in request.descriptors):
            raise AdminError(
                f"a descriptor with more than MAX_ENTRIES_PER_DESCRIPTOR={opts.max_entries} entries"
            )
        t = self.clock()
        default_hits = min(request.hits_addend or 1, keys.MAX_HITS)
        root = ruleset.domains.get(request.domain)
        specs = ruleset.specs.get(request.domain, [])
        found: list[tuple[Rule, str, tuple[str, ...] | None] | None] = []
        out: list[dict[str, Any]] = []
        for d in request.descriptors:
            entry: dict[str, Any] = {"entries": [{"key": k, "value": v} for k, v in d.entries]}
            out.append(entry)
            if d.limit is not None:
                rpu, unit = d.limit
                if not keys.unit_seconds(unit):
                    raise AdminError(f"invalid rate limit override unit {unit}")
                key = request.domain + "." + ".".join(k + "_" + v if v else k for k, v in d.entries)
                rule = Rule(key, rpu, unit)
                entry["matched"] = "override"
                entry["why"] = "the request's own limit (descriptor.limit) replaces any rule"
                found.append((rule, rule.full_key, None))
                continue
            entry["path"] = _walk(specs, d.entries)
            hit = None if root is None else ruleset.lookup(root, request.domain, d.entries)
            if hit is None:
                entry["matched"] = None
                entry["why"] = _no_match_reason(root is None, entry["path"], len(d.entries))
                found.append(None)
                continue
            rule, stats_key, share, _ = hit
            entry["matched"] = "rule"
            entry["why"] = "matched at depth {}: {}".format(
                len(d.entries), ", ".join(step["matched"] for step in entry["path"])
            )
            found.append((rule, stats_key, share))
        replaced: dict[str, str] = {}
        for hit in found:
            if hit is not None:
                for name in hit[0].replaces:
                    replaced.setdefault(name, hit[0].name or hit[0].full_key)
        statuses: list[Status] = []
        unlimited: list[int] = []
        local = self.limiter.local_cache
        now = int(t)
        for i, (d, hit, entry) in enumerate(zip(request.descriptors, found, out, strict=True)):
            if hit is None:
                statuses.append(Status(OK))
                continue
            rule, stats_key, share = hit
            entry["rule"] = _describe(rule)
            entry["stats_key"] = stats_key
            if rule.name and rule.name in replaced and rule.limits is None:
                entry["replaced_by"] = replaced[rule.name]
                statuses.append(Status(OK))
                continue
            if rule.unlimited:
                unlimited.append(i)
                entry["windows"] = []
                statuses.append(Status(OK, None, MAX_UINT32, 0))
                continue
            hits = default_hits if d.hits_addend is None else min(d.hits_addend, keys.MAX_HITS)
            limits = self.limiter.keys_for(request.domain, d.entries, rule, share, hits, t)
            if rule.limits is not None and replaced:
                limits = [(lim, op) for lim, op in limits if lim.name not in replaced]
            values = await self.limiter.backend.get([op for _, op in limits]) if limits else []
            windows = []
            best: Status | None = None
            for (limit, op), value in zip(limits, values, strict=True):
                reset = limit.unit_seconds - now % limit.unit_seconds
                cached = local is not None and local.contains(op.key, now)
                after = value + hits
                status = keys.verdict(
                    limit, RuleStats(""), hits, after, self.limiter.near_limit_ratio, reset
                )
                if cached:
                    status = Status(OK if limit.shadow_mode else OVER_LIMIT, limit, 0, reset)
                windows.append(
                    {
                        "cache_key": op.key,
                        "limit": limit.requests_per_unit,
                        "unit": limit.unit_name,
                        "window_seconds": limit.unit_seconds,
                        "algorithm": limit.algorithm_name,
                        "value": value,
                        "remaining": max(0, limit.requests_per_unit - value),
                        "reset_seconds": reset,
                        "in_local_cache": cached,
                        "would_be": CODE_NAMES[status.code],
                    }
                )
                if best is None or _tighter(status, best):
                    best = status
            entry["windows"] = windows
            entry["hits"] = hits
            statuses.append(best or Status(OK))
        for entry, status in zip(out, statuses, strict=True):
            entry["decision"] = CODE_NAMES[status.code]
            if status.rule is not None:
                entry["limit_remaining"] = status.limit_remaining
                entry["duration_until_reset"] = status.duration_until_reset
        overall = overall_code(statuses, unlimited, opts.quota_mode)
        if overall == OVER_LIMIT and opts.shadow_mode:
            overall = OK
        return {
            "domain": request.domain,
            "overall_code": CODE_NAMES[overall],
            "dry_run": True,
            "descriptors": out,
        }

    async def counter(self, domain: str, entries: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """One descriptor's rule, cache keys and current windows (no hits)."""
        explained = await self.explain(Request(domain, [Descriptor(tuple(entries))]))
        d = explained["descriptors"][0]
        if d.get("matched") is None:
            raise LookupError(d["why"])
        return {"domain": domain, **d}

    async def reset(
        self, domain: str, entries: Sequence[tuple[str, str]], who: str = ""
    ) -> dict[str, Any]:
        """Delete every window of one descriptor's counters; audited."""
        shown = await self.counter(domain, entries)
        names = [w["cache_key"] for w in shown.get("windows", [])]
        deleted = await self.limiter.backend.delete(names) if names else 0
        local = self.limiter.local_cache
        if local is not None:
            for name in names:
                local.discard(name)
        audit.warning(
            "admin reset: domain=%s descriptor=%s keys=%s existed=%d by=%s",
            domain,
            ",".join(f"{k}={v}" for k, v in entries),
            names,
            deleted,
            who or "-",
        )
        return {"domain": domain, "entries": shown["entries"], "reset": names, "existed": deleted}


def _tighter(a: Status, b: Status) -> bool:
    """Is `a` the status to report over `b`: over limit first, then the least remaining."""
    if (a.code == OVER_LIMIT) != (b.code == OVER_LIMIT):
        return a.code == OVER_LIMIT
    return a.limit_remaining < b.limit_remaining


def _describe(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {"key": rule.full_key}
    if rule.name:
        out["name"] = rule.name
    if rule.unlimited:
        out["unlimited"] = True
    else:
        out["requests_per_unit"] = rule.requests_per_unit
        out["unit"] = rule.unit_name
    for flag in ("shadow_mode", "quota_mode", "detailed_metric", "meter"):
        if getattr(rule, flag):
            out[flag] = True
    if rule.replaces:
        out["replaces"] = list(rule.replaces)
    if rule.limits is not None:
        out["limits"] = [_describe(limit) for limit in rule.limits]
    return out


def _walk(specs: list[NodeSpec], entries: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The reference's GetLimit walk, told level by level: at each entry an exact `key_value`
    node, else the first wildcard node (config order) matching it, else a `key`-only node."""
    path: list[dict[str, Any]] = []
    level = specs
    for k, v in entries:
        probe = k + "_" + v
        node = how = None
        for spec in level:
            if spec.final_key == probe:
                node, how = spec, "exact"
                break
        if node is None:
            for spec in level:
                if "*" in spec.final_key and wildcard_match(
                    tuple(spec.final_key.split("*")), probe
                ):
                    node, how = spec, "wildcard"
                    break
        if node is None:
            for spec in level:
                if spec.final_key == k:
                    node, how = spec, "key_only"
                    break
        if node is None:
            path.append({"entry": f"{k}={v}", "matched": None})
            break
        step: dict[str, Any] = {"entry": f"{k}={v}", "matched": how, "config": node.final_key}
        step["has_limit"] = node.rule is not None
        path.append(step)
        if not node.children:
            break
        level = node.children
    return path


def _no_match_reason(unknown_domain: bool, path: list[dict[str, Any]], depth: int) -> str:
    if unknown_domain:
        return "no config for this domain"
    if path and path[-1].get("matched") is None:
        return f"no config entry matches {path[-1]['entry']} at depth {len(path)}"
    if len(path) < depth:
        return (
            f"the config ends at depth {len(path)} and the descriptor has {depth} entries "
            "(a limit applies only at the descriptor's own depth)"
        )
    return "the entry at the descriptor's depth has no rate_limit"
