"""The compiled cores are what a normal install runs; RATELIMITD_NO_EXTENSIONS=1 forces the
leaves' twins, never the decision model's (it has none), and without its build the daemon
stops at import with one line."""

import importlib
import os
import subprocess
import sys

import pytest

from ratelimitd import decision
from ratelimitd.backends import counters
from ratelimitd.backends.redis import resp
from ratelimitd.config import keys, match
from ratelimitd.transport import rls

# The selector modules, each choosing between a compiled leaf and its pure twin.
SELECTORS = (keys, match, rls, resp, counters)


@pytest.mark.skipif(
    bool(os.environ.get("RATELIMITD_NO_EXTENSIONS")), reason="pure-Python pass of the suite"
)
def test_compiled_extensions_are_in_use() -> None:
    assert [s.IMPLEMENTATION for s in SELECTORS] == ["compiled"] * len(SELECTORS)
    for name in (
        "ratelimitd.config._keys",
        "ratelimitd.config._match",
        "ratelimitd.decision._plan",
        "ratelimitd.decision._decision",
        "ratelimitd.transport._rls",
        "ratelimitd.backends.redis._resp",
        "ratelimitd.backends.redis.rounds",
        "ratelimitd.backends._counters",
        "ratelimitd.backends._rounds",
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
    assert counters.CounterTable is dict


def test_the_decision_model_is_compiled_in_either_pass() -> None:
    assert decision.Engine.__module__ == "ratelimitd.decision._decision"
    assert decision.Plan.__module__ == "ratelimitd.decision._plan"
    for name in ("ratelimitd.decision._plan", "ratelimitd.decision._decision"):
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(".so")


@pytest.mark.parametrize("missing", ["ratelimitd.decision._plan", "ratelimitd.decision._decision"])
def test_without_the_compiled_model_the_daemon_stops_with_one_line(missing: str) -> None:
    """As if the extension were not built: `python -m ratelimitd` exits 1 with one line on
    stderr saying what to run, and no traceback."""
    started = (
        "import runpy, sys\n"
        f"sys.modules[{missing!r}] = None  # an import of it raises ImportError\n"
        "sys.argv = ['ratelimitd', 'serve']\n"
        "runpy.run_module('ratelimitd', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", started], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ratelimitd: the compiled decision model is not built")
    assert "make compile" in lines[0] and "pip install ." in lines[0]
