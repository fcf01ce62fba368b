"""The compiled cores are what a normal install runs."""

import importlib
import os

import pytest

from ratelimitd import decision
from ratelimitd.backends.redis import resp
from ratelimitd.config import keys, match
from ratelimitd.transport import rls


@pytest.mark.skipif(
    bool(os.environ.get("RATELIMITD_NO_EXTENSIONS")), reason="pure-Python pass of the suite"
)
def test_compiled_extensions_are_in_use() -> None:
    assert keys.IMPLEMENTATION == "compiled"
    assert match.IMPLEMENTATION == "compiled"
    assert decision.IMPLEMENTATION == "compiled"
    assert rls.IMPLEMENTATION == "compiled"
    assert resp.IMPLEMENTATION == "compiled"
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
    assert keys.IMPLEMENTATION == "pure"
    assert match.IMPLEMENTATION == "pure"
    assert decision.IMPLEMENTATION == "pure"
    assert rls.IMPLEMENTATION == "pure"
    assert resp.IMPLEMENTATION == "pure"
    assert resp.incrby_expire_ops.__module__ == "ratelimitd.backends.redis._resp_py"
    assert keys.cache_key.__module__ == "ratelimitd.config._keys_py"
    assert match.lookup.__module__ == "ratelimitd.config._match_py"
