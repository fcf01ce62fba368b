"""The images built once per test session from deploy/Containerfile, with podman.

A missing podman (or runc, slirp4netns, mmdebstrap) fails these tests: scripts/bootstrap.sh
--system installs them. Tags are unique to the session and removed at its end; the layers
stay cached, so the next build redoes only what changed.
"""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support import REPO
from support.podman import Podman


@dataclass(frozen=True)
class Images:
    """The daemon image, the sidecars image, and what building them took."""

    ratelimit: str
    sidecars: str
    revision: str
    version: str
    build_seconds: float


def revision() -> str:
    """The checkout's commit, for the image's revision label."""
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    """podman with this session's containers.conf."""
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="session")
def images(podman: Podman) -> Iterator[Images]:
    """Both targets of deploy/Containerfile, built on the locally made base image."""
    podman.base_image()
    with open(REPO / "pyproject.toml", "rb") as fh:
        version = tomllib.load(fh)["project"]["version"]
    args = {"REVISION": revision(), "VERSION": version}
    tag = f"test-{os.getpid()}"
    started = time.monotonic()
    built = Images(
        ratelimit=f"localhost/ratelimitd:{tag}",
        sidecars=f"localhost/ratelimitd-sidecars:{tag}",
        revision=args["REVISION"],
        version=version,
        build_seconds=0.0,
    )
    podman.build(built.ratelimit, "ratelimit", args)
    podman.build(built.sidecars, "sidecars", args)
    built = Images(**(built.__dict__ | {"build_seconds": time.monotonic() - started}))
    print(f"\nimages built in {built.build_seconds:.0f} s")
    yield built
    podman("rmi", built.ratelimit, built.sidecars, check=False)
