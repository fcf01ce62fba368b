"""The compiled cores are what a normal install runs."""

import importlib
import os

import pytest

from ratelimitd import decision
from ratelimitd.backends.redis import resp
from ratelimitd.config import keys, match
from ratelimitd.transport import rls

# The selector modules, each choosing between a compiled module and its pure twin.
SELECTORS = (keys, match, decision, rls, resp)


@pytest.mark.skipif(
    bool(os.environ.get("RATELIMITD_NO_EXTENSIONS")), reason="pure-Python pass of the suite"
)
def test_compiled_extensions_are_in_use() -> None:
    assert [s.IMPLEMENTATION for s in SELECTORS] == ["compiled"] * len(SELECTORS)
    for name in (
        "ratelimitd.config._keys",
        "ratelimitd.config._match",
        "ratelimitd.decision._decision",
        "ratelimitd.transport._rls",
        "ratelimitd.backends.redis._resp",
    ):
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(".so")
    assert keys.cache_key.__module__ == "ratelimitd.config._keys" or type(
        keys.cache_key
    ).__name__ in (
        "builtin_function_or_method",
        "cython_function_or_method",
    )


@pytest.mark.skipif(
    not os.environ.get("RATELIMITD_NO_EXTENSIONS"), reason="only in the pure-Python pass"
)
def test_no_extensions_forces_the_twins() -> None:
    assert [s.IMPLEMENTATION for s in SELECTORS] == ["pure"] * len(SELECTORS)
    assert resp.incrby_expire_ops.__module__ == "ratelimitd.backends.redis._resp_py"
    assert keys.cache_key.__module__ == "ratelimitd.config._keys_py"
    assert match.lookup.__module__ == "ratelimitd.config._match_py"
