"""Selects the compiled `_match` trie or its pure-Python twin `_match_py`.

RATELIMITD_NO_EXTENSIONS=1 forces the twin (settings.extensions_disabled, read at import).
"""

from types import ModuleType

from ._twins import twin
from .settings import extensions_disabled

if extensions_disabled():
    from ._match_py import Level, Node, compile_level, lookup, wildcard_match

    IMPLEMENTATION = "pure"
else:
    try:
        from ._match import (  # type: ignore[no-redef]
            Level,
            Node,
            compile_level,
            lookup,
            wildcard_match,
        )

        IMPLEMENTATION = "compiled"
    except ImportError:  # not built (e.g. a source checkout without `make compile`)
        from ._match_py import Level, Node, compile_level, lookup, wildcard_match

        IMPLEMENTATION = "pure"


def implementation(name: str | None = None) -> ModuleType:
    """The module behind the twin names: "compiled" `_match`, "pure" `_match_py`, None as above."""
    return twin("ratelimitd._match", "ratelimitd._match_py", name, IMPLEMENTATION)


__all__ = [
    "IMPLEMENTATION",
    "Level",
    "Node",
    "compile_level",
    "implementation",
    "lookup",
    "wildcard_match",
]
