"""Counters you can inspect, reset and explain (extension; asked upstream in
#191, #422, #509).

`Admin` answers three questions about the config in force and the counter store, without
counting anything:

- `explain(request)`: per descriptor, which rule matched and why (the walk, level by level:
  exact, wildcard or key-only, as the reference's GetLimit takes them), whether a request
  override or a `replaces` decided instead, the stats key, the cache key(s), the current
  value of each window and the status the request would get — a dry run: the store is read,
  never written, and no statistic moves. A token budget's descriptor shows its call
  (reserve, settle, close or a plain count), what the call would do (`outcome`: admitted,
  refused, duplicate, settled, ...), and per window the usage and reservations.
- `counter(domain, entries)`: the same for one descriptor with no hits.
- `reset(domain, entries)`: deletes every window's key of that descriptor (all its limits)
  in the store and in this process's local over-limit cache; audited in the log.

The debug listener serves them only when ADMIN_TOKEN is set (`transport/debug.py`); the CLI
(`ratelimitd counters`, `ratelimitd explain`) calls those endpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Any

from .config import Rule
from .config.budget_store import (
    COUNT,
    DUPLICATE,
    FULL,
    KIND_NAMES,
    OUTCOME_NAMES,
    RELEASE,
    RESERVE,
    Result,
    command_keys,
)
from .config.match import EXACT, KEY_ONLY, WILDCARD
from .decision import CONSUME
from .limiter import Limiter
from .messages import CODE_NAMES, INVALID, TOO_LARGE, Descriptor, Refusal, Request
from .service import DryRun, RateLimitService, settled

audit = logging.getLogger("ratelimitd.audit")

__all__ = ["Admin", "AdminError"]

HOW = {EXACT: "exact", WILDCARD: "wildcard", KEY_ONLY: "key_only"}


class AdminError(ValueError):
    """A request the admin endpoints refuse (400 with this message), or the service's
    `refusal` of it (its status is the debug listener's for that refusal)."""

    def __init__(self, message: str, refusal: Refusal | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal

    @classmethod
    def of(cls, refusal: Refusal) -> AdminError:
        """The error of a refusal: a request refused is the caller's (400), a store that
        failed or a defect is not (`refusal` says which)."""
        bad = refusal.kind in (INVALID, TOO_LARGE)
        return cls(refusal.message, None if bad else refusal)


class Admin:
    """Dry runs and resets against the service's config and store."""

    def __init__(self, service: RateLimitService) -> None:
        self.service = service

    @property
    def limiter(self) -> Limiter:
        return self.service.limiter

    async def explain(self, request: Request) -> dict[str, Any]:
        """What `request` would get, descriptor by descriptor, counting nothing: the
        service's own dry run (`RateLimitService.dry_run`), told."""
        walks: list[Any] = []
        run = await settled(self.service.decide(request, dry_run=True, walks=walks))
        if run.__class__ is Refusal:
            raise AdminError.of(run)
        plan = run.plan
        items = {item.index: item for item in plan.items}
        windows, budgets = await self._windows(run)
        out: list[dict[str, Any]] = []
        for i, d in enumerate(request.descriptors):
            entry: dict[str, Any] = {"entries": [{"key": k, "value": v} for k, v in d.entries]}
            out.append(entry)
            walk, rule, stats_key = walks[i] if i < len(walks) else ([], None, None)
            item = items.get(i)
            looked_up = d  # a budget call is matched without its phase and transaction
            if item is not None and item.budget is not None:
                looked_up = Descriptor(tuple(item.budget[2]))
            if walk is None:
                entry["matched"] = "override"
                entry["why"] = "the request's own limit (descriptor.limit) replaces any rule"
            else:
                entry["path"] = _path(looked_up, walk)
                entry["matched"] = None if rule is None else "rule"
                depth = len(looked_up.entries)
                entry["why"] = _why(plan.found, rule is not None, entry["path"], depth)
            if rule is not None:
                entry["rule"] = _describe(rule)
                entry["stats_key"] = stats_key
                if item is not None:
                    entry["windows"] = windows[i]
                    entry["hits"] = item.hits
                    if i in budgets:
                        entry["budget"] = budgets[i]
                elif rule.unlimited:
                    entry["windows"] = []
                elif plan.replaced and rule.name in plan.replaced:
                    entry["replaced_by"] = plan.replaced[rule.name]
            status = run.response.statuses[i]
            entry["decision"] = CODE_NAMES[status.code]
            if status.rule is not None:
                entry["limit_remaining"] = status.limit_remaining
                entry["duration_until_reset"] = status.duration_until_reset
        return {
            "domain": request.domain,
            "overall_code": CODE_NAMES[run.response.overall_code],
            "dry_run": True,
            "descriptors": out,
        }

    async def _windows(
        self, run: DryRun
    ) -> tuple[dict[int, list[dict[str, Any]]], dict[int, dict[str, Any]]]:
        """Per descriptor that counts, each window: its key, current value (read now), and
        what the dry run found for it; and per budget descriptor, its call."""
        limiter = self.limiter
        d = limiter.decision
        plan = run.plan
        t = run.t
        now = int(t)
        now_ms = int(t * 1000)
        local = limiter.local_cache
        shown: dict[int, list[dict[str, Any]]] = {}
        budgets: dict[int, dict[str, Any]] = {}
        reads = []
        for item in plan.items:
            if item.budget is not None:  # the dry call's own answer: nothing to read
                key, result = run.ops[item.first].key, run.results[item.first]
                budgets[item.index] = _budget_call(item, key, result, now_ms)
                shown[item.index] = _budget_windows(item, key, result)
                continue
            names = d.window_keys(plan, item, now, limiter.prefix)
            rows = shown[item.index] = []
            for k, (w, name) in enumerate(zip(item.rule.windows, names, strict=True)):
                reads.append(d.window_op(CONSUME, w, name, 0, now_ms))
                cached = local is not None and local.expiry(name) > now
                if item.first >= 0:
                    after, reset, _ = d.reading(w, run.results[item.first + k], now, now_ms)
                    over = after > w.requests
                else:  # answered from the local cache
                    reset = max(1, local.expiry(name) - now) if cached else 0  # type: ignore[union-attr]
                    over = cached
                limit = w.limit
                rows.append(
                    {
                        "cache_key": name,
                        "limit": w.requests,
                        "unit": limit.unit_name,
                        "window_seconds": w.seconds,
                        "algorithm": limit.algorithm_name,
                        "reset_seconds": reset,
                        "in_local_cache": cached,
                        "would_be": "OVER_LIMIT" if over and not limit.shadow_mode else "OK",
                    }
                )
        values = iter(await self._store(limiter.backend.get(reads)) if reads else ())
        for index, rows in shown.items():
            if index in budgets:
                continue
            for row in rows:
                row["value"] = value = next(values)
                row["remaining"] = max(0, row["limit"] - value)
        return shown, budgets

    async def _store(self, call: Awaitable[Any]) -> Any:
        """A store call's result; its failure answered by the service (`answer`)."""
        try:
            return await call
        except Exception as exc:
            raise AdminError.of(self.service.answer(exc, record=False)) from exc  # type: ignore[arg-type]

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
        names = list(dict.fromkeys(w["cache_key"] for w in shown.get("windows", [])))
        if "budget" in shown:  # every key it may live in
            names += shown["budget"]["store_keys"]
            names = list(dict.fromkeys(names))
        deleted = await self._store(self.limiter.backend.delete(names)) if names else 0
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
    spec = rule.budget
    if spec is not None:
        out["budget"] = {
            "phase_key": spec.phase_key,
            "transaction_key": spec.transaction_key,
            "unsettled": spec.unsettled,
            "reservation_ttl_seconds": spec.ttl_ms / 1000,
        }
    return out


def _budget_call(item: Any, key: str, result: Result, now_ms: int) -> dict[str, Any]:
    """What a budget descriptor asks (its call) and what the call would do now."""
    kind, txn, _, force, remember = item.budget
    call: dict[str, Any] = {
        "call": "close" if kind == RELEASE else KIND_NAMES[kind],
        "outcome": OUTCOME_NAMES.get(result.outcome, str(result.outcome)),
        "key": key,
        "due_key": key + "_due",
        # where a store may keep it: the script's two keys, or in plain commands its
        # records and current counters (`config.budget_store`)
        "store_keys": [key, key + "_due", *command_keys(key, item.rule.budget.windows, now_ms)],
    }
    if txn:
        call["transaction"] = txn
    if force:
        call["force"] = True  # shadow mode: a reserve is held even past the limit
    if remember:
        call["remember_refusal"] = True  # quota mode
    if result.expired:
        call["expires_first"] = result.expired  # reservations past their TTL it would end
    return call


def _budget_windows(item: Any, key: str, result: Result) -> list[dict[str, Any]]:
    """A budget's windows: used and reserved now, and the level after the call."""
    asks = item.budget[0] in (RESERVE, COUNT)  # a settle or close never refuses
    # Refused whatever the levels: a reused id, or a budget holding its most transactions.
    refused = result.outcome in (DUPLICATE, FULL)
    rows = []
    for w, win, (after, ticks), (used, reserved) in zip(
        item.rule.windows, item.rule.budget.windows, result.levels, result.held, strict=True
    ):
        limit = w.limit
        over = asks and (after > w.requests or refused)
        rows.append(
            {
                "cache_key": key,
                "limit": w.requests,
                "unit": limit.unit_name,
                "window_seconds": w.seconds,
                "algorithm": limit.algorithm_name,
                "value": used,
                "reserved": reserved,
                "remaining": max(0, w.requests - used - reserved),
                "after": after,
                "reset_seconds": -(-ticks * win.tick // 1000),
                "in_local_cache": False,
                "would_be": "OVER_LIMIT" if over and not limit.shadow_mode else "OK",
            }
        )
    return rows


def _path(d: Descriptor, walk: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    """The walk of `match.lookup`, level by level: at each entry an exact `key_value` node,
    else the first wildcard node (config order) matching it, else a `key`-only node."""
    path: list[dict[str, Any]] = []
    for (k, v), (how, node) in zip(d.entries, walk, strict=False):
        if node is None:
            path.append({"entry": f"{k}={v}", "matched": None})
            break
        step = {"entry": f"{k}={v}", "matched": HOW[how], "config": node.final_key}
        step["has_limit"] = node.rule is not None
        path.append(step)
    return path


def _why(domain_found: bool, matched: bool, path: list[dict[str, Any]], depth: int) -> str:
    if matched:
        return "matched at depth {}: {}".format(depth, ", ".join(s["matched"] for s in path))
    if not domain_found:
        return "no config for this domain"
    if path and path[-1].get("matched") is None:
        return f"no config entry matches {path[-1]['entry']} at depth {len(path)}"
    if len(path) < depth:
        return (
            f"the config ends at depth {len(path)} and the descriptor has {depth} entries "
            "(a limit applies only at the descriptor's own depth)"
        )
    return "the entry at the descriptor's depth has no rate_limit"
