"""Choosing between a compiled module and its pure-Python twin: at import, and by name."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TypeVar

from .settings import extensions_disabled

Pure = TypeVar("Pure", bound=ModuleType)


def select(compiled: str, pure: Pure) -> tuple[Pure, str]:
    """The compiled module if it is built, current and allowed, else the twin `pure`; and
    which.

    RATELIMITD_NO_EXTENSIONS=1 forces the twin (settings.extensions_disabled, read once), as
    yarl's YARL_NO_EXTENSIONS does. A compiled module lacking a name of `pure.__all__` is a
    stale build (a .so older than its .pyx): the twin serves, as when none is built. The
    compiled module is typed as its twin: same names.
    """
    if not extensions_disabled():
        try:
            module = importlib.import_module(compiled)
        except ImportError:  # not built (e.g. a source checkout without `make compile`)
            return pure, "pure"
        if all(hasattr(module, name) for name in pure.__all__):
            return module, "compiled"  # type: ignore[return-value]
    return pure, "pure"


def twin(compiled: str, pure: str, name: str | None, selected: str) -> ModuleType:
    """Module `compiled` or `pure` as `name` says ("compiled", "pure"; None: `selected`)."""
    chosen = selected if name is None else name
    if chosen not in ("compiled", "pure"):
        raise ValueError(f"unknown implementation {name!r} (compiled or pure)")
    return importlib.import_module(compiled if chosen == "compiled" else pure)
