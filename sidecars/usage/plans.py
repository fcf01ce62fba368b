"""Plans (`free`, `startup`, `pro`): their quota and default window kind, from YAML."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

PLAN_NAMES = ("free", "startup", "pro")
WINDOW_KINDS = ("billing_cycle", "rolling_30_days")
DEFAULT_PLANS_FILE = Path(__file__).resolve().parent / "plans.yaml"


class PlanError(ValueError):
    """A plans file that cannot be used."""


class Plan(msgspec.Struct, frozen=True):
    """One plan: its name, quota per window and default window kind."""

    name: str
    limit: int
    window: str


# What a plan is when the file leaves it out: a file only has to name what it changes.
DEFAULTS: Mapping[str, Plan] = {
    "free": Plan("free", 1_000, "rolling_30_days"),
    "startup": Plan("startup", 100_000, "billing_cycle"),
    "pro": Plan("pro", 1_000_000, "billing_cycle"),
}


def parse_plans(text: str, source: str = "<plans>") -> dict[str, Plan]:
    """Plans from YAML text `plans: {name: {limit, window}}`, defaults for omitted plans."""
    try:
        doc: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise PlanError(f"{source}: not YAML: {exc}") from None
    raw = doc.get("plans", {}) if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        raise PlanError(f"{source}: expected a mapping 'plans: {{name: {{limit, window}}}}'")
    plans = dict(DEFAULTS)
    for name, spec in raw.items():
        if name not in PLAN_NAMES:
            raise PlanError(f"{source}: unknown plan {name!r} (plans: {', '.join(PLAN_NAMES)})")
        if not isinstance(spec, dict) or set(spec) - {"limit", "window"}:
            raise PlanError(f"{source}: plan {name!r} takes only 'limit' and 'window'")
        base = DEFAULTS[name]
        limit = spec.get("limit", base.limit)
        window = spec.get("window", base.window)
        # bool is an int in Python; a quota of `true` is a typo, not 1.
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise PlanError(f"{source}: plan {name!r}: limit must be a non-negative integer")
        if window not in WINDOW_KINDS:
            raise PlanError(
                f"{source}: plan {name!r}: window must be one of {', '.join(WINDOW_KINDS)}"
            )
        plans[name] = Plan(name, limit, window)
    return plans


def load_plans(path: str | Path | None = None) -> dict[str, Plan]:
    """The plans from `path` (default: the shipped plans.yaml)."""
    p = Path(path) if path else DEFAULT_PLANS_FILE
    try:
        text = p.read_text()
    except OSError as exc:
        raise PlanError(f"{p}: cannot read: {exc.strerror}") from None
    return parse_plans(text, str(p))
