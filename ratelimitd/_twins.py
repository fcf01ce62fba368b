"""Choosing between a compiled module and its pure-Python twin by name (for `impl=`)."""

from __future__ import annotations

import importlib
from types import ModuleType


def twin(compiled: str, pure: str, name: str | None, selected: str) -> ModuleType:
    """Module `compiled` or `pure` as `name` says ("compiled", "pure"; None: `selected`)."""
    chosen = selected if name is None else name
    if chosen not in ("compiled", "pure"):
        raise ValueError(f"unknown implementation {name!r} (compiled or pure)")
    return importlib.import_module(compiled if chosen == "compiled" else pure)
