"""Choosing between a compiled module and its pure-Python twin: at import, and by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

from .settings import extensions_disabled

Pure = TypeVar("Pure", bound=ModuleType)


def select(compiled: str, pure: Pure) -> tuple[Pure, str]:
    """The compiled module if it is built, current and allowed, else the twin `pure`; and
    which.

    RATELIMITD_NO_EXTENSIONS=1 forces the twin (settings.extensions_disabled, read once), as
    yarl's YARL_NO_EXTENSIONS does. A compiled module lacking a name of `pure.__all__` is a
    stale build (a .so older than its .pyx), and one whose cimported modules are not built
    (or not as it was) a partial one: the twin serves, as when none is built. The
    compiled module is typed as its twin: same names.
    """
    if not extensions_disabled():
        try:
            module = importlib.import_module(compiled)
        except ImportError:  # not built (e.g. a source checkout without `make compile`)
            return pure, "pure"
        except (KeyError, ValueError):
            # A partial or stale build: a module it cimports is missing (so its source was
            # imported, with no C table) or is not the build it was compiled against.
            return pure, "pure"
        if all(hasattr(module, name) for name in pure.__all__):
            return module, "compiled"  # type: ignore[return-value]
    return pure, "pure"


def install(namespace: dict[str, object], compiled: str, pure: ModuleType) -> str:
    """`select` the twin for a selector module and put the names of `pure.__all__`, as
    that twin has them, in its `namespace`; which twin ("compiled" or "pure")."""
    module, which = select(compiled, pure)
    namespace.update({name: getattr(module, name) for name in pure.__all__})
    return which


def chooser(compiled: str, pure: str, selected: str) -> Callable[[str | None], ModuleType]:
    """A selector's `implementation(name)`: the module behind the twin names, "compiled" or
    "pure" as `name` says (None: the one selected at import)."""

    def implementation(name: str | None = None) -> ModuleType:
        return twin(compiled, pure, name, selected)

    return implementation


def twin(compiled: str, pure: str, name: str | None, selected: str) -> ModuleType:
    """Module `compiled` or `pure` as `name` says ("compiled", "pure"; None: `selected`)."""
    chosen = selected if name is None else name
    if chosen not in ("compiled", "pure"):
        raise ValueError(f"unknown implementation {name!r} (compiled or pure)")
    return importlib.import_module(compiled if chosen == "compiled" else pure)
