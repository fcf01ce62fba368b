"""`bash scripts/run.sh` on a fresh Debian machine serves gRPC on the native transport.

The fresh machine is a container of the Debian base image (minbase: no Python, no compiler,
no libnghttp2) holding this checkout's files (tracked and new, not ignored: what a clone
has). run.sh installs what the build needs with apt, builds and starts the daemon; the
daemon must say it serves gRPC on the native HTTP/2 transport, and answer.

pip's and apt's downloads are kept in podman volumes between runs (caches only: a fresh
machine starts with them empty and fills them).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tarfile
import time
from pathlib import Path

from support import REPO, free_port, http_get, wait_for
from support.podman import Container, Podman

from ratelimitd.messages import CODE_NAMES
from ratelimitd.transport.client import RateLimitClient

NATIVE = "gRPC (native HTTP/2) listening on"


def checkout_tar(path: Path) -> Path:
    """The checkout's files as a clone would have them, in a tar at `path`."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    with tarfile.open(path, "w") as tar:
        for name in filter(None, names):
            if (REPO / name).exists():
                tar.add(REPO / name, arcname=name, recursive=False)
    return path


def decide(target: str, times: int) -> list[str]:
    """The bundled example's rule (one request per minute per user), asked `times` times."""

    async def run() -> list[str]:
        async with RateLimitClient(target) as client:
            replies = [await client.should_rate_limit("example", [[("user", "alice")]])
                       for _ in range(times)]  # fmt: skip
        return [CODE_NAMES[r.overall_code] for r in replies]

    return asyncio.run(run())


def test_run_sh_on_a_fresh_debian_machine_serves_grpc_natively(
    podman: Podman, tmp_path: Path
) -> None:
    base = podman.base_image()
    ports = {"PORT": free_port(), "GRPC_PORT": free_port(), "DEBUG_PORT": free_port()}
    args = [
        "--network", "host",
        "-v", f"{checkout_tar(tmp_path / 'checkout.tar')}:/checkout.tar:ro",
        "-v", "ratelimitd-test-pip-cache:/root/.cache/pip",
        "-v", "ratelimitd-test-apt-cache:/var/cache/apt/archives",
        *(f"--env={k}={v}" for k, v in ports.items()),
    ]  # fmt: skip
    # pip trusts what this machine's pip trusts (a TLS-intercepting proxy's CA, here).
    bundle = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if bundle and Path(bundle).is_file():
        args += ["-v", f"{bundle}:/run/host-ca.crt:ro", "--env=PIP_CERT=/run/host-ca.crt"]
    script = "mkdir /src && tar -xf /checkout.tar -C /src && exec bash /src/scripts/run.sh"
    started = time.monotonic()
    c = Container(podman, f"fresh-debian-{ports['PORT']}", [*args, base, "bash", "-c", script])
    try:
        wait_for(lambda: NATIVE in c.logs() or not c.running(), 900, what="the daemon")
        print(f"\nrun.sh on a fresh machine to serving: {time.monotonic() - started:.0f} s")
        log = c.logs()
        assert NATIVE in log, log
        assert "serving gRPC with grpc.aio" not in log
        health = f"http://127.0.0.1:{ports['PORT']}/healthcheck"
        wait_for(lambda: http_get(health)[0] == 200, 30, what="/healthcheck 200")
        assert decide(f"127.0.0.1:{ports['GRPC_PORT']}", 2) == ["OK", "OVER_LIMIT"]
        assert c.stop(grace=10) == 0
    finally:
        c.remove()
