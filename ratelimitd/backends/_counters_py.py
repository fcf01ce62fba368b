"""The pure-Python twin of `_counters`: the memory store's counter map is a dict, and a
fixed-window count is `keys.Bump`'s (the same maths on `store._counters`)."""

from ..config.keys import Bump as TableBump

CounterTable = dict

__all__ = ["CounterTable", "TableBump"]
