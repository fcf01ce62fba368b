"""Plans (`free`, `startup`, `pro`): their quota, default window kind and the usage
thresholds (percent of the quota) whose crossing is notified, from YAML."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

PLAN_NAMES = ("free", "startup", "pro")
WINDOW_KINDS = ("billing_cycle", "rolling_30_days")
DEFAULT_PLANS_FILE = Path(__file__).resolve().parent / "plans.yaml"
DEFAULT_THRESHOLDS = (80, 100)
# As OpenMeter's threshold rules: a handful per plan, not a per-request loop to worry about.
MAX_THRESHOLDS = 10


class PlanError(ValueError):
    """A plans file that cannot be used."""


class Plan(msgspec.Struct, frozen=True):
    """One plan: its name, quota per window, default window kind and notified thresholds."""

    name: str
    limit: int
    window: str
    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS


# What a plan is when the file leaves it out: a file only has to name what it changes.
DEFAULTS: Mapping[str, Plan] = {
    "free": Plan("free", 1_000, "rolling_30_days"),
    "startup": Plan("startup", 100_000, "billing_cycle"),
    "pro": Plan("pro", 1_000_000, "billing_cycle"),
}


def check_thresholds(values: Any, what: str) -> tuple[int, ...]:
    """Percentages of the quota, 1-100, at most MAX_THRESHOLDS: sorted, without repeats.

    Above 100 is refused: the quota stops counting at 100 %, so such a threshold would never
    be crossed (a setting that does nothing).
    """
    if not isinstance(values, list | tuple):
        raise PlanError(f"{what}: thresholds must be a list of percentages, e.g. [80, 100]")
    out = set()
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 100:
            raise PlanError(f"{what}: threshold {v!r} is not a whole percentage from 1 to 100")
        out.add(v)
    if len(out) > MAX_THRESHOLDS:
        raise PlanError(f"{what}: at most {MAX_THRESHOLDS} thresholds")
    return tuple(sorted(out))


def parse_thresholds(text: str) -> tuple[int, ...]:
    """`80,100` (or empty for none) as a checked tuple of percentages."""
    words = [w.strip().rstrip("%") for w in text.split(",") if w.strip()]
    try:
        values = [int(w) for w in words]
    except ValueError:
        raise PlanError(f"thresholds {text!r}: comma-separated percentages, e.g. 80,100") from None
    return check_thresholds(values, f"thresholds {text!r}")


def parse_plans(text: str, source: str = "<plans>") -> dict[str, Plan]:
    """Plans from YAML text `plans: {name: {limit, window, thresholds}}`, defaults for what
    is omitted."""
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
        if not isinstance(spec, dict) or set(spec) - {"limit", "window", "thresholds"}:
            raise PlanError(
                f"{source}: plan {name!r} takes only 'limit', 'window' and 'thresholds'"
            )
        base = DEFAULTS[name]
        limit = spec.get("limit", base.limit)
        window = spec.get("window", base.window)
        thresholds = check_thresholds(
            spec.get("thresholds", list(base.thresholds)), f"{source}: plan {name!r}"
        )
        # bool is an int in Python; a quota of `true` is a typo, not 1.
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise PlanError(f"{source}: plan {name!r}: limit must be a non-negative integer")
        if window not in WINDOW_KINDS:
            raise PlanError(
                f"{source}: plan {name!r}: window must be one of {', '.join(WINDOW_KINDS)}"
            )
        plans[name] = Plan(name, limit, window, thresholds)
    return plans


def read_file(path: str | Path | None, default: Path, error: type[ValueError]) -> tuple[str, str]:
    """(text, name) of the file `path` (or `default`); `error` when it cannot be read."""
    p = Path(path) if path else default
    try:
        return p.read_text(), str(p)
    except OSError as exc:
        raise error(f"{p}: cannot read: {exc.strerror}") from None


def load_plans(path: str | Path | None = None) -> dict[str, Plan]:
    """The plans from `path` (default: the shipped plans.yaml)."""
    return parse_plans(*read_file(path, DEFAULT_PLANS_FILE, PlanError))
