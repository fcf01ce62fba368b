"""The decision model: plan -> count -> verdict, one compiled source, which the service and
`/explain` both take.

* **plan** (`_plan`): the request checked, each descriptor looked up in the rule
  set, request overrides, `replaces`, unlimited and metered descriptors resolved; an `Item`
  per descriptor that counts, each of a `kind`: CONSUME, REFUND or BUDGET.
* **count** and **verdict** (`_decision`): every item's windows as store
  operations at one instant and the store's results read back; the deciding window of each
  item, the statuses and the overall code.

The model's notes are those modules' docstrings. It has no pure-Python twin (the compiled
leaves it calls, `keys` and `match`, have theirs: RATELIMITD_NO_EXTENSIONS=1 forces those);
without the build the process stops here, with one line saying what to run.
"""

try:
    from ._decision import (  # type: ignore[import-not-found]
        NO_LIMIT,
        SLICE,
        UNLIMITED,
        Engine,
        collect,
        count_now,
        meter_ops,
        overall_code,
        reading,
        respond,
        settle,
        window_keys,
        window_op,
    )
    from ._plan import (  # type: ignore[import-not-found]
        BUDGET,
        CONSUME,
        REFUND,
        Item,
        Plan,
        begin,
        bind,
        bound,
        extend,
        finish,
        plan,
        planned,
    )
except ImportError as exc:  # not built, or built from older sources (a name missing)
    raise SystemExit(
        f"ratelimitd: the compiled decision model is not built or is stale ({exc}); "
        "run `make compile` in a source checkout, or `pip install .`"
    ) from None

__all__ = [
    "BUDGET",
    "CONSUME",
    "NO_LIMIT",
    "REFUND",
    "SLICE",
    "UNLIMITED",
    "Engine",
    "Item",
    "Plan",
    "begin",
    "bind",
    "bound",
    "collect",
    "count_now",
    "extend",
    "finish",
    "meter_ops",
    "overall_code",
    "plan",
    "planned",
    "reading",
    "respond",
    "settle",
    "window_keys",
    "window_op",
]
