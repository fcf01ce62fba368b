"""One way into a decision, one place where failures become answers, read from the source.

Every caller of the service (the gRPC handlers, compiled and pure, `/json`, `/explain`,
RLQS) enters through `RateLimitService.decide` and hands the failures it meets to
`RateLimitService.answer`; the store's failure (`BackendError`) is named, on the decision's
path, in that one function only, and a failure is never re-raised bare to be answered.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ratelimitd.grpcstatus import REFUSED
from ratelimitd.messages import FAULT, INVALID, OVERLOADED, STORE_FAILED, TOO_LARGE
from ratelimitd.service import RateLimitService as Service

PACKAGE = Path(__file__).resolve().parents[2] / "ratelimitd"
# The service's callers: whatever of the service they use, they decide only through `decide`.
CALLERS = [
    *sorted((PACKAGE / "transport").glob("*.py")),
    *PACKAGE.rglob("_rls.pyx"),
    PACKAGE / "admin.py",
    PACKAGE / "quota" / "service.py",
]
# The decision's path: the service, what it counts with, and its callers.
DECISION_PATH = [PACKAGE / "service.py", PACKAGE / "limiter.py", *CALLERS]
# What a caller may call of the service: the way in, a waiter's two ends, and the answer to
# a failure it met before the service did (a decoder's) or out of a store call of its own.
ENTRY = {"decide", "received", "dropped", "answer"}
METHODS = {name for name, value in vars(Service).items() if callable(value)}


def _service_calls(text: str) -> set[str]:
    """The service's methods `text` names on something called `service` (`self.service.x`,
    `service.x`, `handler.service.x`, ...)."""
    return {m for m in re.findall(r"\bservice\.(\w+)", text) if m in METHODS}


@pytest.mark.parametrize("path", CALLERS, ids=lambda p: p.name)
def test_callers_enter_through_decide_only(path: Path) -> None:
    used = _service_calls(path.read_text())
    assert used <= ENTRY, f"{path.name} calls {sorted(used - ENTRY)} of the service"


def test_every_caller_decides_through_decide() -> None:
    deciding = {p.name for p in CALLERS if "decide" in _service_calls(p.read_text())}
    # The compiled gRPC call and its pure twin, /json, /explain, RLQS.
    assert {"_rls.pyx", "rls.py", "routes.py", "admin.py", "service.py"} <= deciding


def _names_backend_error(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "BackendError" for n in ast.walk(node))


def test_backend_error_is_answered_in_one_function() -> None:
    """On the decision's path, only `RateLimitService.answer` looks at a BackendError (an
    `except` clause or an isinstance test); the callers do not even import it."""
    found = []
    for path in DECISION_PATH:
        if path.suffix != ".py":
            assert "BackendError" not in path.read_text(), path.name
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                handler = isinstance(node, ast.ExceptHandler) and node.type is not None
                test = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"
                if (handler and _names_backend_error(node.type)) or (  # type: ignore[attr-defined]
                    test and _names_backend_error(node)
                ):
                    found.append(f"{path.name}:{fn.name}")
        if path.name != "service.py":
            imported = [
                n.lineno
                for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and any(a.name == "BackendError" for a in n.names)
            ]
            assert not imported, f"{path.name} imports BackendError (lines {imported})"
    assert sorted(set(found)) == ["service.py:answer"], found


@pytest.mark.parametrize("path", DECISION_PATH, ids=lambda p: p.name)
def test_no_failure_is_re_raised_bare(path: Path) -> None:
    """A failure is answered where it is caught, never raised again to be answered by an
    outer handler (`raise` alone), and no answer is raised."""
    if path.suffix != ".py":
        assert not re.search(r"^\s*raise\s*$", path.read_text(), re.M), path.name
        return
    tree = ast.parse(path.read_text())
    bare = [
        n.lineno
        for handler in ast.walk(tree)
        if isinstance(handler, ast.ExceptHandler)
        # A cancelled call's bookkeeping (a task's cancellation, a span's status) passes
        # the cancellation or the error on unchanged: not a failure answered.
        and not (
            (isinstance(handler.type, ast.Attribute) and handler.type.attr == "CancelledError")
            or (isinstance(handler.type, ast.Name) and handler.type.id == "BaseException")
        )
        for n in ast.walk(handler)
        if isinstance(n, ast.Raise) and n.exc is None
    ]
    assert not bare, f"{path.name}: bare raise at lines {bare}"


def test_every_refusal_has_a_status_on_every_transport() -> None:
    kinds = {INVALID, TOO_LARGE, OVERLOADED, STORE_FAILED, FAULT}
    assert set(REFUSED) == kinds
    assert all(len(row) == 3 for row in REFUSED.values())
