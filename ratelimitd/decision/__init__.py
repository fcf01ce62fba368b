"""Selects the compiled `_decision` (plan, count, verdict) or its pure-Python twin
`_decision_py`; see `_decision_py` for the model.

RATELIMITD_NO_EXTENSIONS=1 forces the twin (settings.extensions_disabled, read at import).
"""

from typing import TYPE_CHECKING

from .._twins import chooser, install
from . import _decision_py

IMPLEMENTATION = install(globals(), "ratelimitd.decision._decision", _decision_py)
if TYPE_CHECKING:
    # The twins' names, typed as the pure one's (the module's own `__all__`).
    from ._decision_py import (  # noqa: F401
        CONSUME,
        NO_LIMIT,
        REFUND,
        SLICE,
        UNLIMITED,
        Engine,
        Item,
        Plan,
        begin,
        bind,
        bound,
        collect,
        count_now,
        extend,
        finish,
        meter_ops,
        overall_code,
        plan,
        planned,
        reading,
        respond,
        settle,
        window_keys,
        window_op,
    )


# implementation(name): the module behind the twin names, "compiled" `_decision` or "pure"
# `_decision_py` (None: the one selected at import).
implementation = chooser(
    "ratelimitd.decision._decision", "ratelimitd.decision._decision_py", IMPLEMENTATION
)
