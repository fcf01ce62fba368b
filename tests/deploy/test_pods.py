"""The chart's and the overlays' pods, as rendered, run with podman as the kubelet runs them
(support.kubelet): the session's images with their own environment under the pod's, the
pod's security contexts (read-only root, nothing writable but the pod's volumes), its
ConfigMaps, emptyDirs and claims; each container answers its probes.

The release's daemon, its usage API and its `helm test` pod share one network namespace,
where the Services' names resolve to it (a stand-in for the cluster's DNS): the usage API
asks the daemon at the address the chart gives it, and `helm test` asks it for a decision.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support import wait_for
from support.kubelet import PodContainer, Volumes, probe, run_pod_container
from support.manifests import KUSTOMIZE, by_kind, helm_template, kustomize
from support.podman import HOST_LOOPBACK, Podman
from support.redis_server import RedisServers

from .conftest import Images

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# The kubelet's patience on a loaded machine: startupProbe allows 30 x 10 s.
STARTUP_SECONDS = 300


def configmaps(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {c["metadata"]["name"]: c["data"] for c in by_kind(objects).get("ConfigMap", [])}


def template(objects: list[dict[str, Any]], component: str, name: str = "") -> dict[str, Any]:
    """The pod template of the Deployment with that component label (and name suffix)."""
    (found,) = [
        d["spec"]["template"]
        for d in by_kind(objects)["Deployment"]
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
        and d["metadata"]["name"].endswith(name)
    ]
    return found


def answers_probes(pod: PodContainer) -> None:
    """Every probe of the container answers 200 (startup first, as the kubelet asks)."""
    first, *others = [kind for kind in PROBES if kind in pod.spec]
    with logs_on_failure(pod):
        wait_for(lambda: probe(pod, first) == 200, STARTUP_SECONDS, f"{pod.container.name}")
        for kind in others:
            assert probe(pod, kind) == 200, kind


@contextlib.contextmanager
def logs_on_failure(pod: PodContainer) -> Iterator[None]:
    try:
        yield
    except AssertionError as exc:
        logs = pod.container.logs()[-4000:]
        raise AssertionError(f"{exc}\n--- {pod.container.name}:\n{logs}") from None


def exec_json(podman: Podman, pod: PodContainer, *args: str) -> Any:
    return json.loads(podman("exec", pod.container.name, *args))


def test_chart_pods_run_and_answer_their_probes(
    podman: Podman, images: Images, redis_servers: RedisServers, tmp_path: Path
) -> None:
    redis = redis_servers()
    objects = helm_template(
        f"backend.redis.url=redis:{redis.port}",
        "sidecars.usage.enabled=true",
        "sidecars.usage.env[0].name=USAGE_REDIS_URL",
        f"sidecars.usage.env[0].value=redis:{redis.port}",
    )
    volumes = Volumes(tmp_path / "volumes", configmaps(objects))
    (test_pod,) = by_kind(objects)["Pod"]
    usage_spec = template(objects, "sidecar", "-usage")
    started: list[PodContainer] = []
    try:
        # The daemon publishes the usage API's port too: their network namespace is one.
        daemon = run_pod_container(
            podman, f"rl-daemon-{redis.port}", template(objects, "ratelimit"), "ratelimitd",
            volumes, image=images.ratelimit, extra_ports=(8090,),
            hosts={"redis": HOST_LOOPBACK, "rl-ratelimitd.edge.svc": "127.0.0.1"},
        )  # fmt: skip
        started.append(daemon)
        answers_probes(daemon)
        # `helm test`: one decision from the daemon image's client, exit status 0.
        test = run_pod_container(
            podman, f"rl-test-{redis.port}", test_pod, "decision", volumes,
            image=images.ratelimit, network_of=daemon,
        )  # fmt: skip
        started.append(test)
        assert podman("wait", test.container.name, timeout=120).strip() == "0", (
            test.container.logs()
        )
        assert "overall_code:OK" in test.container.logs().replace(" ", "")

        # The usage API on its claim; an account made, the pod replaced, the account kept.
        def usage(generation: int) -> PodContainer:
            pod = run_pod_container(
                podman, f"rl-usage-{redis.port}-{generation}", usage_spec, "usage", volumes,
                image=images.sidecars, network_of=daemon,
            )  # fmt: skip
            started.append(pod)
            answers_probes(pod)
            return pod

        first = usage(1)
        cli = ("python", "-m", "sidecars.usage")
        podman(
            "exec", first.container.name, *cli, "accounts", "create", "acme", "--plan", "startup"
        )
        assert first.container.stop(grace=30) == 0, first.container.logs()
        first.container.remove()
        second = usage(2)
        listed = exec_json(podman, second, *cli, "accounts", "list", "--format", "json")
        assert [a["id"] for a in listed] == ["acme"], listed
    finally:
        for pod in reversed(started):
            pod.container.remove()


def test_overlay_and_openshift_pods_run_and_answer_their_probes(
    podman: Podman, images: Images, tmp_path: Path
) -> None:
    # The memory overlay, as kustomize renders it.
    overlay = kustomize(KUSTOMIZE / "overlays" / "memory")
    # The chart under OpenShift's restricted-v2: the chart fixes no user, group or fsGroup
    # and the platform assigns them from the namespace's range (root's group added).
    chart = helm_template(
        "backend.type=memory",
        "podSecurityContext.runAsUser=null",
        "podSecurityContext.runAsGroup=null",
        "podSecurityContext.fsGroup=null",
    )
    openshift = template(chart, "ratelimit")
    assigned = {"runAsUser": 1000680000, "runAsGroup": 0, "fsGroup": 1000680000}
    openshift["spec"]["securityContext"].update(assigned)
    started: list[PodContainer] = []
    try:
        for name, objects, spec in (
            ("overlay", overlay, template(overlay, "ratelimit")),
            ("openshift", chart, openshift),
        ):
            volumes = Volumes(tmp_path / name, configmaps(objects))
            pod = run_pod_container(
                podman, f"rl-{name}-{os.getpid()}", spec, "ratelimitd", volumes,
                image=images.ratelimit,
            )  # fmt: skip
            started.append(pod)
            answers_probes(pod)
    finally:
        for pod in started:
            pod.container.remove()
