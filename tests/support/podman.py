"""podman as it works on these machines, for the image and compose tests (tests/deploy).

Container registries cannot be reached from here, so `Podman.base_image` makes the image
the Containerfile's FROM line names from Debian's packages (mmdebstrap, slimmed as Debian's
official -slim images are, with /usr merged as they are: no usrmerge package, no perl),
tagged `localhost/ratelimitd-base:<release>-slim`; builds name it with the BASE build
argument (the Containerfile pins the public image by digest), so the same Containerfile
builds here and anywhere else. The base is made once per machine and kept in podman's storage
(a fresh clone on a fresh machine makes it, about 40 s); building reuses podman's layer
cache and a pip cache mount between runs.

Containers run with runc and a containers.conf of our own (podman's defaults ask for
ulimits and a runtime these machines refuse), on slirp4netns: each container has its own
network namespace (its fixed ports 8080/8081/19001 collide with nothing on the host) and
reaches the host's loopback services at 10.0.2.2.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import resource
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from .process import REPO, binary

CONTAINERFILE = REPO / "deploy" / "Containerfile"
# The host's loopback, seen from a slirp4netns container (allow_host_loopback).
HOST_LOOPBACK = "10.0.2.2"
NETWORK = "slirp4netns:allow_host_loopback=true"
INSTALL = "scripts/bootstrap.sh --system installs it"
# Debian's -slim images leave out documentation, manuals and locales, and keep no package
# archives or apt caches (their /etc/dpkg/dpkg.cfg.d and /etc/apt/apt.conf.d say so).
SLIM = [
    *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "doc", "info", "locale")),
    *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("groff", "lintian")),
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    '--aptopt=Dir::Cache::pkgcache ""',
    '--aptopt=Dir::Cache::srcpkgcache ""',
    '--aptopt=APT::Install-Recommends "false"',
]


def base_name(containerfile: Path = CONTAINERFILE) -> str:
    """The locally made stand-in for the image the Containerfile builds FROM (its
    `ARG BASE=` default, a Debian -slim image pinned by digest)."""
    found = re.search(
        r"^ARG BASE=\S+/debian:(\S+)@sha256:[0-9a-f]{64}$", containerfile.read_text(), re.M
    )
    assert found, f"no ARG BASE=...debian:<tag>@sha256:<digest> in {containerfile}"
    return f"localhost/ratelimitd-base:{found.group(1)}"


class Podman:
    """The podman CLI with our containers.conf (under `workdir`)."""

    def __init__(self, workdir: Path) -> None:
        self.path = binary("podman", INSTALL)
        binary("runc", INSTALL)
        binary("slirp4netns", INSTALL)
        workdir.mkdir(parents=True, exist_ok=True)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        conf = workdir / "containers.conf"
        conf.write_text(
            "[containers]\n"
            f'default_ulimits = ["nofile={hard}:{hard}", "nproc=32768:32768"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
        )
        self.workdir = workdir
        self.env = os.environ | {"CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """`podman *args`; its stdout (AssertionError with stderr when it fails and `check`)."""
        done = subprocess.run(
            [self.path, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr}")
        return done.stdout

    def exists(self, image: str) -> bool:
        """True when `image` is in the local storage."""
        done = subprocess.run([self.path, "image", "exists", image], env=self.env, check=False)
        return done.returncode == 0

    def base_image(self) -> str:
        """The Containerfile's base image, made from Debian's packages unless already here."""
        name = base_name()
        # One machine-wide lock: test runs of several checkouts may start at once.
        with _locked(Path("/var/tmp/ratelimitd-podman-base.lock")):
            if not self.exists(name):
                rootfs = self.workdir / "rootfs.tar"
                release = name.rpartition(":")[2].removesuffix("-slim")
                subprocess.run(
                    [binary("mmdebstrap", INSTALL), "--quiet", "--variant=minbase", *SLIM,
                     "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", release, str(rootfs)],
                    check=True, capture_output=True, timeout=900,
                )  # fmt: skip
                self("import", "--change", 'CMD ["bash"]', str(rootfs), name, timeout=300)
                rootfs.unlink()
        return name

    def build(
        self,
        tag: str,
        target: str,
        build_args: dict[str, str],
        timestamp: int | None = None,
        cache: bool = True,
    ) -> None:
        """Build `target` of deploy/Containerfile from the repository as `tag`, on the locally
        made base; with `timestamp`, every file and the image's creation time set to it (as
        the release builds: the same commit, the same image)."""
        args = ["build", "--network", "host", "--pull=never", "-f", str(CONTAINERFILE)]
        args += ["--target", target, "-t", tag, "--build-arg", f"BASE={self.base_image()}"]
        if not cache:
            args.append("--no-cache")
        if timestamp is not None:
            args += ["--timestamp", str(timestamp), "--build-arg", f"SOURCE_DATE_EPOCH={timestamp}"]
        for key, value in build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        # pip in the build stage trusts what this machine's pip trusts (a TLS-intercepting
        # proxy's CA, here): the bundle is mounted for the build's RUN steps only.
        bundle = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
        if bundle and Path(bundle).is_file():
            args += ["--volume", f"{bundle}:/run/host-ca.crt:ro"]
            args += ["--build-arg", "PIP_CERT=/run/host-ca.crt"]
        self(*args, str(REPO), timeout=1800)

    def build_from(self, tag: str, steps: str, files: dict[str, Path] | None = None) -> str:
        """An image `tag`: the base image plus `steps` (Containerfile lines), with `files`
        (name: path) in its build context."""
        context = self.workdir / tag.replace("/", "_").replace(":", "_")
        context.mkdir(parents=True, exist_ok=True)
        for name, path in (files or {}).items():
            shutil.copy(path, context / name)  # with its mode: an executable stays one
        (context / "Containerfile").write_text(f"FROM {self.base_image()}\n{steps}\n")
        self("build", "--network", "host", "--pull=never", "-t", tag, str(context), timeout=900)
        return tag

    def image_size(self, image: str) -> int:
        """The image's size in bytes, as `podman images` counts it."""
        return int(self("image", "inspect", "--format", "{{.Size}}", image).strip())


class Container:
    """A detached `podman run`; `stop` sends SIGTERM and waits up to its grace period."""

    def __init__(self, podman: Podman, name: str, args: Sequence[str]) -> None:
        self.podman = podman
        self.name = name
        podman("rm", "-f", "-t", "0", name, check=False)
        self.id = podman("run", "-d", "--name", name, *args).strip()

    def logs(self) -> str:
        """stdout and stderr so far."""
        return self.logs_of(self.podman, self.name)

    @staticmethod
    def logs_of(podman: Podman, name: str) -> str:
        """A container's stdout and stderr so far."""
        done = subprocess.run(
            [podman.path, "logs", name], env=podman.env, capture_output=True, text=True, check=False
        )
        return done.stdout + done.stderr

    def running(self) -> bool:
        return self.podman("inspect", "--format", "{{.State.Running}}", self.name).strip() == "true"

    def stop(self, grace: int) -> int:
        """`podman stop -t grace`: SIGTERM, SIGKILL after `grace` s; the exit code."""
        self.podman("stop", "-t", str(grace), self.name, timeout=grace + 60)
        return int(self.podman("inspect", "--format", "{{.State.ExitCode}}", self.name).strip())

    def remove(self) -> None:
        self.podman("rm", "-f", "-t", "0", self.name, check=False)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
