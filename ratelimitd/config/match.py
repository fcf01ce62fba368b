"""Selects the compiled `_match` trie or its pure-Python twin `_match_py`.

RATELIMITD_NO_EXTENSIONS=1 forces the twin (settings.extensions_disabled, read at import).
"""

from typing import TYPE_CHECKING

from .._twins import chooser, install
from . import _match_py

# How `lookup` matched an entry, numbered alike by both twins (`_match.pyx` DEFs them).
from ._match_py import EXACT, KEY_ONLY, WILDCARD  # noqa: F401

IMPLEMENTATION = install(globals(), "ratelimitd.config._match", _match_py)
if TYPE_CHECKING:
    # The twins' names, typed as the pure one's (the module's own `__all__`).
    from ._match_py import (  # noqa: F401
        Level,
        Node,
        compile_level,
        lookup,
        wildcard_match,
    )


# implementation(name): the module behind the twin names, "compiled" `_match` or "pure"
# `_match_py` (None: the one selected at import).
implementation = chooser("ratelimitd.config._match", "ratelimitd.config._match_py", IMPLEMENTATION)
