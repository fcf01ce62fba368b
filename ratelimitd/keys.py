"""Selects the compiled `_keys` or its pure-Python twin `_keys_py`.

Like yarl's YARL_NO_EXTENSIONS, RATELIMITD_NO_EXTENSIONS=1 forces the twin; the choice is
made at import, through the settings package (the only reader of the environment).
"""

from .settings import extensions_disabled

if extensions_disabled():
    from ._keys_py import (
        UNIT_SECONDS,
        cache_key,
        evaluate,
        near_threshold,
        reset_seconds,
        unit_seconds,
        window_start,
    )

    IMPLEMENTATION = "pure"
else:
    try:
        from ._keys import (  # type: ignore[no-redef]
            UNIT_SECONDS,
            cache_key,
            evaluate,
            near_threshold,
            reset_seconds,
            unit_seconds,
            window_start,
        )

        IMPLEMENTATION = "compiled"
    except ImportError:  # not built (e.g. a source checkout without `make compile`)
        from ._keys_py import (
            UNIT_SECONDS,
            cache_key,
            evaluate,
            near_threshold,
            reset_seconds,
            unit_seconds,
            window_start,
        )

        IMPLEMENTATION = "pure"

__all__ = [
    "IMPLEMENTATION",
    "UNIT_SECONDS",
    "cache_key",
    "evaluate",
    "near_threshold",
    "reset_seconds",
    "unit_seconds",
    "window_start",
]
