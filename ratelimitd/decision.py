"""Selects the compiled `_decision` (plan, count, verdict) or its pure-Python twin
`_decision_py`; see `_decision_py` for the model.

RATELIMITD_NO_EXTENSIONS=1 forces the twin (settings.extensions_disabled, read at import).
"""

from types import ModuleType
from typing import TYPE_CHECKING

from . import _decision_py
from ._twins import select, twin

_impl, IMPLEMENTATION = select("ratelimitd._decision", _decision_py)

if TYPE_CHECKING:
    from ._decision_py import Engine, Item, Plan
else:
    Engine = _impl.Engine
    Item = _impl.Item
    Plan = _impl.Plan

CONSUME = _impl.CONSUME
REFUND = _impl.REFUND
SLICE = _impl.SLICE
NO_LIMIT = _impl.NO_LIMIT
UNLIMITED = _impl.UNLIMITED
begin = _impl.begin
bind = _impl.bind
bound = _impl.bound
extend = _impl.extend
finish = _impl.finish
plan = _impl.plan
planned = _impl.planned
collect = _impl.collect
count_now = _impl.count_now
meter_ops = _impl.meter_ops
reading = _impl.reading
settle = _impl.settle
respond = _impl.respond
overall_code = _impl.overall_code
window_keys = _impl.window_keys
window_op = _impl.window_op


def implementation(name: str | None = None) -> ModuleType:
    """The module behind the twin names: "compiled" `_decision`, "pure" `_decision_py`, None
    as above."""
    return twin("ratelimitd._decision", "ratelimitd._decision_py", name, IMPLEMENTATION)


__all__ = [
    "CONSUME",
    "IMPLEMENTATION",
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
    "implementation",
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
