"""The package's layering, read from its source: what each layer may import, where a backend
is named, where gRPC status numbers are declared. A change that crosses a line fails here
first, with the module and the line, instead of surfacing as an import cycle at start-up.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ratelimitd"
BACKEND_NAMES = {"redis", "memcache", "memory"}
# google.rpc.Code names; messages.py's UNKNOWN/OK are the RLS response's Code, a different enum.
GRPC_STATUS_NAMES = {
    "CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "RESOURCE_EXHAUSTED",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "UNAUTHENTICATED",
}  # fmt: skip


def modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_proto" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text(), str(path))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def top_level_imports(name: str, tree: ast.Module, path: Path) -> Iterator[tuple[str, int]]:
    """The ratelimitd modules `tree` imports when it is imported (not in functions, not
    under TYPE_CHECKING), with their line numbers."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(body: list[ast.stmt]) -> Iterator[tuple[str, int]]:
        for node in body:
            if isinstance(node, ast.If) and not _is_type_checking(node):
                yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try):
                yield from walk(node.body)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, node.lineno
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                yield target, node.lineno
                for alias in node.names:  # `from ratelimitd.x import submodule`
                    yield f"{target}.{alias.name}", node.lineno

    for target, line in walk(tree.body):
        if target.startswith("ratelimitd"):
            yield target, line


SOURCES = {name: (path, tree) for name, path, tree in modules()}


def imports_of(prefix: str) -> list[tuple[str, str, int]]:
    return [
        (name, target, line)
        for name, (path, tree) in SOURCES.items()
        if name == prefix or name.startswith(prefix + ".")
        for target, line in top_level_imports(name, tree, path)
    ]


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("ratelimitd.config", "ratelimitd.backends"),  # algorithm ids belong to config
        ("ratelimitd.stats", "ratelimitd.transport"),  # stats sit below the transports
        ("ratelimitd.tracing", "ratelimitd.transport"),
        ("ratelimitd.settings", "ratelimitd.transport"),
        ("ratelimitd.decision", "ratelimitd.transport"),
        ("ratelimitd.service", "ratelimitd.transport.grpc"),
        # The quota service knows no transport (its status numbers are grpcstatus's).
        ("ratelimitd.quota", "ratelimitd.transport.grpc"),
        ("ratelimitd.quota", "ratelimitd.transport.native"),
        ("ratelimitd.quota", "ratelimitd.transport.rlqs"),
    ],
)
def test_a_layer_does_not_import_above_itself(layer: str, forbidden: str) -> None:
    crossing = [
        f"{name}:{line} imports {target}"
        for name, target, line in imports_of(layer)
        if target == forbidden or target.startswith(forbidden + ".")
    ]
    assert not crossing, crossing


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {name: set() for name in SOURCES}
    for name, (path, tree) in SOURCES.items():
        for target, _ in top_level_imports(name, tree, path):
            while target and target not in SOURCES:  # `from pkg import name` of a non-module
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            raise AssertionError(
                "import cycle: " + " -> ".join([*stack[stack.index(node) :], node])
            )
        if node in done:
            return
        for target in sorted(graph[node]):
            visit(target, [*stack, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])


def test_backends_are_named_only_in_the_backends_package() -> None:
    """A backend's name is compared only where it is registered and selected: everything
    else asks the backend's declared capabilities."""
    found = []
    for name, (_, tree) in SOURCES.items():
        if name.startswith(("ratelimitd.backends", "ratelimitd.settings")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names = {s.value for s in sides if isinstance(s, ast.Constant)}
                if names & BACKEND_NAMES and any(
                    isinstance(s, ast.Attribute) and s.attr in {"name", "backend_type"}
                    for s in sides
                ):
                    found.append(f"{name}:{node.lineno}")
    assert not found, found


def test_grpc_status_numbers_are_declared_once() -> None:
    declared = []
    for name, (_, tree) in SOURCES.items():
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in GRPC_STATUS_NAMES:
                        declared.append(name)
    assert set(declared) == {"ratelimitd.transport.grpcstatus"}, declared
    # The compiled modules bind their constants from grpcstatus (`cdef int OK = grpcstatus.OK`).
    names = "|".join(sorted(GRPC_STATUS_NAMES))
    pattern = re.compile(rf"^\s*(?:DEF|cdef\s+int)\s+({names})\s*=\s*\d", re.M)
    for pyx in [*PACKAGE.glob("*.pyx"), *PACKAGE.glob("*.pxi"), *PACKAGE.glob("*.pxd")]:
        assert not pattern.search(pyx.read_text()), pyx.name


def test_the_service_is_driven_by_an_explicit_contract() -> None:
    """The transports call the service's synchronous and asynchronous entry points; none
    drives a coroutine by hand hoping it does not suspend."""
    for name, (path, _) in SOURCES.items():
        assert ".send(None)" not in path.read_text(), name
