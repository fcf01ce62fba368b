"""What a benchmark ran on: the machine, versions, and which implementation of each compiled
module was live (compiled or its pure twin). Every result file in bench/results/ carries it."""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from .process import REPO

# Compiled module -> the selector that picks it or its pure twin (IMPLEMENTATION says which).
SELECTORS = {
    "_keys": "ratelimitd.config.keys",
    "_decision": "ratelimitd.decision",
    "_match": "ratelimitd.config.match",
    "_rls": "ratelimitd.transport.rls",
    "_wire": "ratelimitd.transport.protocodec",
}
# What an HTTP sidecar benchmark also names (machine_info(SIDECAR_PACKAGES)).
SIDECAR_PACKAGES = ("falcon", "msgspec", "uvicorn", "gunicorn", "httpx")


def implementations() -> dict[str, str]:
    """For each .pyx of ratelimitd: "compiled" or "pure" as this process runs it (a module
    without a pure twin: "compiled" or "not built")."""
    out = {}
    package = REPO / "ratelimitd"
    for pyx in sorted(package.rglob("*.pyx"), key=lambda p: p.stem):
        name = pyx.stem
        module = ".".join(pyx.relative_to(REPO).with_suffix("").parts)
        selector = SELECTORS.get(name)
        if selector is not None:
            out[name] = str(importlib.import_module(selector).IMPLEMENTATION)
            continue
        # A module with no pure twin (the HTTP/2 core): built or not.
        try:
            importlib.import_module(module)
        except ImportError:
            out[name] = "not built"
        else:
            out[name] = "compiled"
    return out


def version(argv: list[str]) -> str:
    """The first line a `--version` command prints, or "not installed"."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "?"


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "?"


def git_revision() -> str:
    """The commit the tree is at, naming the ratelimitd files that differ from it."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "ratelimitd", "sidecars"],
        capture_output=True,
        text=True,
    ).stdout.split()[1::2]
    return head.stdout.strip() + (f" + uncommitted changes to {', '.join(dirty)}" if dirty else "")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (the machine is shared: say how busy it was)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_info(packages: tuple[str, ...] = ()) -> dict[str, object]:
    """The machine, the versions that matter (and of `packages`), the live implementations."""
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    info: dict[str, object] = {
        "cpu": f"{os.cpu_count()} x {_cpu_model()}",
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "grpcio": metadata.version("grpcio"),
        "protobuf": metadata.version("protobuf"),
        "uvloop": metadata.version("uvloop"),
        "redis-server": version(["redis-server", "--version"]),
        "implementations": implementations(),
        "git": git_revision(),
        "load average at start": load_average(),
    }
    for name in packages:
        info[name] = metadata.version(name)
    return info


def flat(value: object) -> str:
    """A machine_info value as one line of text ({"_keys": "compiled"} -> "_keys=compiled")."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def describe(info: dict[str, object]) -> list[str]:
    """Markdown table rows for a result file's "Machine" section."""
    return ["| | |", "|---|---|", *[f"| {k} | {flat(v)} |" for k, v in info.items()]]
