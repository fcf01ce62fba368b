"""Every third-party module the shipped packages import is installed by their extras.

Before: `pip install '.[sidecars]'` in a clean venv, then `import sidecars.usage.app`, failed
with `No module named 'redis'`: the development venv had redis-py only through `.[test]`.
Checked statically (every import statement, at any depth) against pyproject.toml, so the
suite needs no network; the clean-venv install itself is the packaging check of the report.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from support import REPO

# What each shipped package may use: the base dependencies plus these extras.
EXTRAS = {"ratelimitd": ("tracing",), "sidecars": ("sidecars",)}


def declared(*extras: str) -> set[str]:
    """Normalized distribution names of the base dependencies and `extras`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return {_normal(re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0]) for r in requirements}


def imported(package: str) -> dict[str, Path]:
    """Top-level module -> a file importing it, for every absolute import in `package`."""
    found: dict[str, Path] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("package", list(EXTRAS))
def test_every_import_is_a_declared_dependency(package: str) -> None:
    allowed = declared(*EXTRAS[package])
    distributions = importlib.metadata.packages_distributions()
    missing = []
    for module, path in imported(package).items():
        if module in sys.stdlib_module_names or module in ("ratelimitd", "sidecars"):
            continue
        providers = {_normal(d) for d in distributions.get(module, [])}
        if not providers & allowed:
            missing.append(f"{module} ({path.relative_to(REPO)}; from {sorted(providers)})")
    assert not missing, f"imported but not installed by {package}'s extras: {missing}"
