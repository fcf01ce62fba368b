"""A rule's `budget:` block, checked, and the phases a budget call is recognised by in a
descriptor (`budget.calls.recognise`; docs/budgets.md).

```yaml
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100000}
    budget:
      phase_key: phase          # the entry naming the call: reserve, settle or close
      transaction_key: txn      # the entry carrying the transaction id (x-request-id)
      unsettled: charge_served  # a stream end without usage: charge the estimate if the
                                # response was a success (content may have flowed), else
                                # release it; or release / charge (always); past its TTL a
                                # reservation is charged unless the policy is release
      reservation_ttl: 10m      # longer than the route timeout + the filter timeout
      outbox: ratelimitd:settled  # optional (Redis): a stream each settle is appended to
```

Every field is optional (`budget: {}` takes the defaults above). The phase and
transaction entries are taken out of the descriptor before it is matched, so neither is
ever part of a counter key, a stats key or a metric label; one domain recognises budget
calls by one pair of keys. A budget holds reservations in fixed and sliding windows (a
token bucket has no window to hold them in), on a store that declares it keeps budgets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..settings.goparse import parse_go_duration
from .budget_store import EXTRA, GUARD, RELEASE, RESERVE, SETTLE, Window
from .errors import ConfigError
from .windows import ALGORITHM_NAMES, FIXED_WINDOW, SLIDING_WINDOW

__all__ = [
    "DEFAULT_TTL_MS",
    "PHASES",
    "UNSETTLED",
    "BudgetSpec",
    "budget_of",
    "budget_spec",
    "domain_keys",
]

DEFAULT_TTL_MS = 600_000
# A reservation outliving a day is a misconfiguration, not a budget.
MAX_TTL_MS = 86_400_000
# The phase values a stock Envoy config sends (generic_key descriptor_value) and the call
# each one is: `close` is the stream end that carries no usage (hits: the response code);
# `guard` the request-time entry that stands in for a reserve Envoy dropped (model.GUARD),
# `extra` another part of the estimate (model.EXTRA).
PHASES = {
    "reserve": RESERVE,
    "extra": EXTRA,
    "guard": GUARD,
    "settle": SETTLE,
    "close": RELEASE,
}
# What a reservation that ends without usage costs: `charge_served` (the default) its
# estimate when the response was a success (a stream the client or the upstream cut after
# it started may have streamed up to it: tokens are never free) and nothing otherwise (an
# error, a refusal, a client gone before any answer); `release` nothing; `charge` always
# its estimate but after a 429. Past its TTL a reservation is charged unless `release`.
UNSETTLED = ("charge_served", "release", "charge")
_FIELDS = ("phase_key", "transaction_key", "unsettled", "reservation_ttl", "outbox")


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """A rule's budget: how its calls are recognised and how reservations end, and the
    store's view of its limits (`windows`, one per limit of the rule, in its order)."""

    phase_key: str = "phase"
    transaction_key: str = "txn"
    unsettled: str = "charge_served"  # one of UNSETTLED
    ttl_ms: int = DEFAULT_TTL_MS
    windows: tuple[Window, ...] = ()
    outbox: str = ""  # the Redis stream each settle is appended to (`budget.outbox`)

    def with_windows(self, windows: Iterable[Any]) -> BudgetSpec:
        """This budget over a rule's windows (`config.windows.Window`s, fixed or sliding)."""
        return replace(self, windows=tuple(_window(w) for w in windows))


def _window(w: Any) -> Window:
    # The field prefix names the window as the counter keys' suffixes do.
    if w.algorithm == FIXED_WINDOW:
        return Window(f"{w.seconds}s", FIXED_WINDOW, w.seconds, 1000, w.requests)
    return Window(f"{w.seconds}s_sliding", SLIDING_WINDOW, w.ticks, w.tick, w.requests)


def _fail(name: str, full_key: str, line: int, message: str) -> ConfigError:
    where = f"line {line}: " if line else ""
    return ConfigError(name, f"{where}budget of '{full_key}': {message}")


def budget_of(
    name: str,
    full_key: str,
    block: Any,
    line: int,
    windows: Sequence[Any],
    kept_by: tuple[str, frozenset[int]] | None = None,
) -> BudgetSpec:
    """The budget of a rule with `windows` (its `config.windows.Window`s): `budget_spec`,
    and a ConfigError unless every window is a fixed or sliding one that the store
    `kept_by` names (its name and the algorithms it keeps budgets for; None: no store check)
    can keep."""
    spec = budget_spec(name, full_key, block, line)
    if not windows:
        raise _fail(name, full_key, line, "needs a rate_limit or rate_limits with a limit")
    for w in windows:
        algorithm = ALGORITHM_NAMES[w.algorithm]
        if w.algorithm not in (FIXED_WINDOW, SLIDING_WINDOW):
            raise _fail(
                name,
                full_key,
                line,
                f"a {algorithm} limit cannot hold reservations (a budget's limits are "
                "fixed_window or sliding_window)",
            )
        if kept_by is not None and w.algorithm not in kept_by[1]:
            raise _fail(
                name,
                full_key,
                line,
                f"the {kept_by[0]} backend keeps no budgets"
                + (f" of {algorithm} limits" if kept_by[1] else ""),
            )
    if spec.outbox and kept_by is not None and kept_by[0] != "redis":
        raise _fail(name, full_key, line, f"outbox needs the redis backend, not {kept_by[0]}")
    return spec.with_windows(windows)


def budget_spec(name: str, full_key: str, block: Any, line: int = 0) -> BudgetSpec:
    """The checked BudgetSpec of the `budget:` block of `full_key` (a mapping, or null for
    the defaults); ConfigError naming the field otherwise."""

    def fail(message: str) -> ConfigError:
        return _fail(name, full_key, line, message)

    if block is None:
        return BudgetSpec()
    if not isinstance(block, Mapping):
        raise fail(f"expected a mapping of {', '.join(_FIELDS)}, got {block!r}")
    for field in block:
        if field not in _FIELDS:
            raise fail(f"unknown field '{field}' (expected {', '.join(_FIELDS)})")
    keys = []
    for field, default in (("phase_key", "phase"), ("transaction_key", "txn")):
        value = block.get(field, default)
        if not isinstance(value, str) or not value:
            raise fail(f"{field} must be a non-empty descriptor key, got {value!r}")
        keys.append(value)
    if keys[0] == keys[1]:
        raise fail(f"phase_key and transaction_key are both '{keys[0]}'")
    unsettled = block.get("unsettled", UNSETTLED[0])
    if unsettled not in UNSETTLED:
        raise fail(f"unsettled must be one of {', '.join(UNSETTLED)}, got {unsettled!r}")
    ttl = block.get("reservation_ttl", "10m")
    try:
        seconds = parse_go_duration(ttl) if isinstance(ttl, str) else None
    except ValueError:
        seconds = None
    if seconds is None or not 1000 <= seconds * 1000 <= MAX_TTL_MS:
        raise fail(
            f"reservation_ttl must be a duration from 1s to 24h (e.g. 10m), got {ttl!r}; "
            "it must exceed the route timeout plus the rate-limit filter's timeout"
        )
    outbox = block.get("outbox", "")
    if not isinstance(outbox, str) or outbox != outbox.strip():
        raise fail(f"outbox must be a Redis stream key, got {outbox!r}")
    return BudgetSpec(keys[0], keys[1], unsettled, int(seconds * 1000), outbox=outbox)


def domain_keys(name: str, specs: Mapping[str, BudgetSpec]) -> tuple[str, str] | None:
    """The one (phase key, transaction key) pair a domain's budget rules share (None
    without budget rules); ConfigError when two rules of the domain name different ones."""
    pair: tuple[str, str] | None = None
    first = ""
    for full_key, spec in specs.items():
        mine = (spec.phase_key, spec.transaction_key)
        if pair is None:
            pair, first = mine, full_key
        elif mine != pair:
            raise ConfigError(
                name,
                f"budget of '{full_key}' is recognised by {mine[0]}/{mine[1]} but "
                f"'{first}' by {pair[0]}/{pair[1]}: a domain recognises budget calls by one "
                "pair of keys",
            )
    return pair
