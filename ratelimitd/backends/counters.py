"""Selects the compiled counter table (`_counters`) or its pure-Python twin (`_counters_py`:
a dict): the memory store's map of key to packed counter, and its one-probe fixed-window
count. RATELIMITD_NO_EXTENSIONS=1 forces the twin; `implementation(name)` gives either."""

from typing import TYPE_CHECKING

from .._twins import chooser, install
from . import _counters_py

IMPLEMENTATION = install(globals(), "ratelimitd.backends._counters", _counters_py)
implementation = chooser(
    "ratelimitd.backends._counters", "ratelimitd.backends._counters_py", IMPLEMENTATION
)
if TYPE_CHECKING:
    from ._counters_py import CounterTable, TableBump

__all__ = ["IMPLEMENTATION", "CounterTable", "TableBump", "implementation"]
