"""The package's layering, read from its source: what each layer may import, where a backend
is named, where gRPC status numbers are declared. A change that crosses a line fails here
first, with the module and the line, instead of surfacing as an import cycle at start-up.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ratelimitd"
BACKEND_NAMES = {"redis", "memcache", "memory"}
# google.rpc.Code names (messages.py's OK is the RLS response's Code, a different enum; its
# UNKNOWN is spelled CODE_UNKNOWN, so that UNKNOWN means the gRPC status only).
GRPC_STATUS_NAMES = {
    "UNKNOWN", "CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "RESOURCE_EXHAUSTED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "UNAUTHENTICATED",
}  # fmt: skip


def modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_proto" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text(), str(path))


def imports(name: str, tree: ast.Module, path: Path) -> Iterator[tuple[str, int]]:
    """Every ratelimitd module `tree` imports, with its line: at module level, in functions
    (lazy) and under TYPE_CHECKING alike, since each is a dependency a cycle can hide in."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ratelimitd"):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ratelimitd"):
                continue
            yield target, node.lineno
            for alias in node.names:  # `from ratelimitd.x import submodule`
                yield f"{target}.{alias.name}", node.lineno


SOURCES = {name: (path, tree) for name, path, tree in modules()}


# The architecture, bottom first: a module imports only from its own package and the
# packages before it (a root module counts as a package of its own). Leaves (settings, the
# event loop's helpers, the messages, health, the gRPC statuses, the twin selector) know
# nothing above them; the configuration (rules, tries, key and window maths, the budget's
# store contract) knows no store; the stores know no decision; the decision model, the
# service, the protocols and servers, and the process that composes them follow. The Go
# service composes the same way: its runner builds each layer from the ones below.
ARCHITECTURE = (
    "settings", "runtime", "_twins", "_slots", "messages", "health", "grpcstatus",
    "stats", "config", "backends", "budget", "decision", "localcache", "limiter",
    "service", "admin", "quota", "core", "transport", "process", "__main__",
)  # fmt: skip
COMPILED_IMPORT = re.compile(
    r"^\s*(?:from\s+(ratelimitd[\w.]*)\s+c?import|c?import\s+(ratelimitd[\w.]*))", re.M
)


def compiled_imports() -> Iterator[tuple[str, str, int]]:
    """(module, target, line) of every ratelimitd import of the compiled halves (.pyx, .pxd,
    .pxi: the Cython sources the AST walk cannot read), cimports included."""
    for path in sorted(PACKAGE.rglob("*.p[yx][xdi]")):
        if path.suffix not in (".pyx", ".pxd", ".pxi"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        text = path.read_text()
        for m in COMPILED_IMPORT.finditer(text):
            yield ".".join(parts), m[1] or m[2], text.count("\n", 0, m.start()) + 1


def every_import() -> Iterator[tuple[str, str, int]]:
    """(module, imported module, line) of every import of the package, Python and Cython; an
    imported name that is not a module (`from ratelimitd.x import f`) counts as its module."""
    found = [
        *((name, target, line) for name, (path, tree) in SOURCES.items()
          for target, line in imports(name, tree, path)),
        *compiled_imports(),
    ]  # fmt: skip
    known = set(SOURCES) | {name for name, _, _ in found}
    for name, target, line in found:
        while target.count(".") and target not in known:
            target = target.rpartition(".")[0]
        yield name, target, line


def layer(module: str) -> int:
    """The position in ARCHITECTURE of the package (or root module) `module` belongs to."""
    top = module.split(".")[1] if module.count(".") else ""
    assert top in ARCHITECTURE, f"{module}: place ratelimitd.{top} in ARCHITECTURE"
    return ARCHITECTURE.index(top)


def test_every_import_goes_down_the_architecture() -> None:
    """No upward import and no import between two packages of one rank: with a total order
    of packages, this is also the proof that no cycle runs through two packages."""
    crossing = [
        f"{name}:{line} imports {target}"
        for name, target, line in every_import()
        if target != "ratelimitd" and target.split(".")[1] not in ("_proto", "py")
        and layer(target) > layer(name)
    ]  # fmt: skip
    assert not crossing, crossing


def test_the_compiled_halves_are_read_too() -> None:
    found = {(name, target) for name, target, _ in compiled_imports()}
    assert ("ratelimitd.transport._h2", "ratelimitd.transport._nghttp2") in found
    assert any(name.startswith("ratelimitd.decision") for name, _ in found), found


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (any import, lazy or TYPE_CHECKING included)."""
    graph: dict[str, set[str]] = {name: set() for name in SOURCES}
    for name, (path, tree) in SOURCES.items():
        for target, _ in imports(name, tree, path):
            while target and target not in SOURCES:  # `from pkg import name` of a non-module
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def test_the_layering_sees_lazy_and_type_checking_imports() -> None:
    """The graph holds the imports a module-level walk misses: a function's own import and
    one under TYPE_CHECKING (both hid cycles before)."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .b import B\n"
        "def f():\n    from ..c import d\n    import ratelimitd.e\n"
    )
    found = {t for t, _ in imports("ratelimitd.x.a", tree, PACKAGE / "x" / "a.py")}
    assert {"ratelimitd.x.b", "ratelimitd.c", "ratelimitd.c.d", "ratelimitd.e"} <= found


def test_no_import_cycle() -> None:
    graph = module_graph()
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


def test_a_twin_is_imported_only_through_its_selector() -> None:
    """`_match_py`, `_keys_py`, ... are reached through `match`, `keys`, ... (which pick the
    compiled module or the twin); only the selector and the other private modules import
    them."""
    crossing = [
        f"{name} imports {target}"
        for name, targets in module_graph().items()
        if not name.rpartition(".")[2].startswith("_")
        for target in targets
        if (twin := re.fullmatch(r"(.*)\._(\w+)_py", target))
        and name not in (f"{twin[1]}.{twin[2]}", twin[1] if twin[1].endswith(f".{twin[2]}") else "")
    ]
    assert not crossing, crossing


def _is_algorithm(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "algorithm"


def test_algorithm_ids_are_named() -> None:
    """The backends and the decision model compare algorithms with config/windows.py's
    names (`FIXED_WINDOW`, ...), never with a bare number or by truthiness (which says
    "not the fixed window" only while its id is 0)."""
    found = []
    for name, (_, tree) in SOURCES.items():
        if not name.startswith(("ratelimitd.backends", "ratelimitd.decision")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                map(_is_algorithm, [node.left, *node.comparators])
            ):
                if any(isinstance(side, ast.Constant) for side in node.comparators):
                    found.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.BoolOp | ast.If | ast.IfExp | ast.UnaryOp):
                tests = (
                    node.values
                    if isinstance(node, ast.BoolOp)
                    else [node.operand if isinstance(node, ast.UnaryOp) else node.test]
                )
                found += [f"{name}:{node.lineno}" for test in tests if _is_algorithm(test)]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "frozenset":
                numbers = [e for a in node.args for e in getattr(a, "elts", [])]
                found += [f"{name}:{node.lineno}" for e in numbers if isinstance(e, ast.Constant)]
            elif isinstance(node, ast.comprehension | ast.GeneratorExp):
                elts = [node.elt] if isinstance(node, ast.GeneratorExp) else node.ifs
                found += [f"{name}:{node.lineno}" for e in elts if _is_algorithm(e)]
    # The compiled halves and the Lua scripts, by their spelling.
    bare = re.compile(
        r'(W_ALGORITHM\]|"algorithm"\)|\balg)\s*(==|!=|~=)\s*\d|"algorithm"\)\s*\n\s*(or|and)\b'
    )
    sources = [*PACKAGE.rglob("decision/_*.pyx"), *PACKAGE.rglob("backends/**/*.py*")]
    for path in (p for p in sources if p.suffix in (".py", ".pyx")):
        found += [f"{path.name}: {m[0]!r}" for m in bare.finditer(path.read_text())]
    assert not found, found


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


def module_constants(tree: ast.Module) -> Iterator[str]:
    """The names a module assigns at its top level, one by one or unpacked (`A, B = 0, 1`)."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for leaf in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(leaf, ast.Name):
                        yield leaf.id


def test_grpc_status_numbers_are_declared_once() -> None:
    declared = [
        name
        for name, (_, tree) in SOURCES.items()
        for constant in module_constants(tree)
        if constant in GRPC_STATUS_NAMES
    ]
    assert set(declared) == {"ratelimitd.grpcstatus"}, declared
    # The compiled modules bind their constants from grpcstatus (`cdef int OK = grpcstatus.OK`).
    names = "|".join(sorted(GRPC_STATUS_NAMES))
    pattern = re.compile(rf"^\s*(?:DEF|cdef\s+int)\s+({names})\s*=\s*\d", re.M)
    for pyx in [*PACKAGE.rglob("*.pyx"), *PACKAGE.rglob("*.pxi"), *PACKAGE.rglob("*.pxd")]:
        assert not pattern.search(pyx.read_text()), pyx.name


def test_the_service_is_driven_by_an_explicit_contract() -> None:
    """The transports call the service's synchronous and asynchronous entry points; none
    drives a coroutine by hand hoping it does not suspend."""
    for name, (path, _) in SOURCES.items():
        assert ".send(None)" not in path.read_text(), name


def test_the_tree_shows_the_architecture() -> None:
    """The package root holds the decision core's few modules (the rest lives in backends/,
    transport/, process/, ...) and no source file outgrows what one reader holds in mind."""
    root = sorted(p.name for p in PACKAGE.iterdir() if p.suffix in (".py", ".pyx"))
    assert len(root) <= 12, root
    sources = [
        p for p in PACKAGE.rglob("*")
        if p.suffix in (".py", ".pyx", ".pxi") and "_proto" not in p.parts
    ]  # fmt: skip
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sources
        if (n := sum(1 for line in p.read_text().splitlines() if line.strip())) > 600
    }
    assert not long, long
