"""Selects the compiled `_match` trie or its pure-Python twin `_match_py`.

RATELIMITD_NO_EXTENSIONS=1 forces the twin (settings.extensions_disabled, read at import).
"""

from types import ModuleType

from . import _match_py
from ._twins import select, twin

_impl, IMPLEMENTATION = select("ratelimitd._match", _match_py)

Level = _impl.Level
Node = _impl.Node
compile_level = _impl.compile_level
lookup = _impl.lookup
wildcard_match = _impl.wildcard_match


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
