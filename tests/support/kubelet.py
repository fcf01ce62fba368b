"""A container of a rendered pod run with podman as the kubelet runs it (tests/deploy).

No Kubernetes API server can be run here (docs/deploy.md says what was tried), so the
tests take the chart's and the overlays' rendered pods and hand podman what the kubelet
would: the image's entrypoint or the container's `command`, the image's environment with
the container's on top (values from Secrets and the pod's name filled in), the pod's and
the container's security contexts (user, group, fsGroup as a supplementary group owning
the volumes, read-only root with no tmpfs added, no new privileges, capabilities dropped),
`workingDir`, and every volume mount: emptyDir and PersistentVolumeClaim volumes as
directories owned by the fsGroup (a claim's directory outlives the container, as the claim
outlives the pod), ConfigMaps and Secrets as read-only files. `probe` asks a container's
httpGet probe as the kubelet does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .podman import NETWORK, Container, Podman
from .ready import free_port, http_get


@dataclass
class Volumes:
    """Where a pod's volumes live on the host: `root` holds one directory per volume;
    `configmaps` and `secrets` are name -> {key: text} (the rendered objects' data)."""

    root: Path
    configmaps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def source(self, volume: dict[str, Any], fs_group: int | None) -> tuple[Path, bool]:
        """The host directory backing `volume`, and whether it is read-only."""
        if "configMap" in volume:
            return self._files(f"configmap-{volume['configMap']['name']}", self.configmaps[
                volume["configMap"]["name"]]), True  # fmt: skip
        if "secret" in volume:
            return self._files(f"secret-{volume['secret']['secretName']}", self.secrets[
                volume["secret"]["secretName"]]), True  # fmt: skip
        if "persistentVolumeClaim" in volume:
            name = f"claim-{volume['persistentVolumeClaim']['claimName']}"
        else:
            assert set(volume) == {"name", "emptyDir"}, f"a volume kind not run here: {volume}"
            name = f"emptydir-{volume['name']}-{os.urandom(4).hex()}"
        path = self.root / name
        if not path.exists():
            path.mkdir(parents=True)
            # The kubelet makes a volume the fsGroup's, group-writable and setgid.
            if fs_group is not None:
                os.chown(path, -1, fs_group)
                path.chmod(0o2775)
            else:
                path.chmod(0o777)
        return path, False

    def _files(self, name: str, data: Mapping[str, str]) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            (path / key).write_text(text)
            (path / key).chmod(0o444)
        return path


@dataclass
class PodContainer:
    """A running container of a pod, and the host ports its container ports are at."""

    container: Container
    ports: dict[int, int]
    spec: dict[str, Any]

    def port(self, port: int | str) -> int:
        """The host port of a container port, given by number or name."""
        if isinstance(port, str):
            (port,) = [p["containerPort"] for p in self.spec["ports"] if p["name"] == port]
        return self.ports[port]


def run_pod_container(
    podman: Podman,
    name: str,
    pod: dict[str, Any],
    container_name: str,
    volumes: Volumes,
    *,
    image: str,
    secrets: Mapping[tuple[str, str], str] = {},
    hosts: Mapping[str, str] = {},
    extra_ports: tuple[int, ...] = (),
    network_of: PodContainer | None = None,
) -> PodContainer:
    """Start the container `container_name` of `pod` (a pod spec) as `name`, with `image`
    standing in for the one the spec names. `hosts` are names the cluster's DNS would
    resolve, with the address each stands for (HOST_LOOPBACK: a server on the host's
    loopback); `network_of` joins another container's network namespace, its names and
    its published ports (it must publish `extra_ports`)."""
    spec = pod.get("spec", pod)
    (c,) = [c for c in spec["containers"] if c["name"] == container_name]
    context = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    args: list[str] = []
    user, group = context.get("runAsUser"), context.get("runAsGroup")
    if user is not None:
        args += ["--user", f"{user}:{group if group is not None else user}"]
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    if fs_group is not None:
        args += ["--group-add", str(fs_group)]
    if context.get("readOnlyRootFilesystem"):
        # The kubelet adds no tmpfs: only what is mounted is writable.
        args += ["--read-only", "--read-only-tmpfs=false"]
    if context.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    for cap in context.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    for item in c.get("env", []):
        value = _env_value(item, secrets, name)
        if value is not None:
            args.append(f"--env={item['name']}={value}")
    if "command" in c:
        args += ["--entrypoint", json.dumps(c["command"])]
    if "workingDir" in c:
        args += ["--workdir", c["workingDir"]]
    pod_volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        path, read_only = volumes.source(pod_volumes[mount["name"]], fs_group)
        ro = read_only or mount.get("readOnly", False)
        args += ["-v", f"{path}:{mount['mountPath']}{':ro' if ro else ''}"]
    ports: dict[int, int] = {}
    if network_of is None:
        args += ["--network", NETWORK]
        args += [f"--add-host={host}:{address}" for host, address in hosts.items()]
        for port in [p["containerPort"] for p in c.get("ports", [])] + list(extra_ports):
            ports[port] = free_port()
            args += ["-p", f"127.0.0.1:{ports[port]}:{port}"]
    else:
        args += ["--network", f"container:{network_of.container.name}"]
        ports = network_of.ports
    if context.get("runAsNonRoot") and user is None:
        # The kubelet refuses to start a root image under runAsNonRoot.
        configured = podman("image", "inspect", "--format", "{{.Config.User}}", image).strip()
        assert configured and configured.split(":")[0] not in ("0", "root"), configured
    started = Container(podman, name, [*args, image, *c.get("args", [])])
    return PodContainer(started, ports, c)


def _env_value(
    item: dict[str, Any], secrets: Mapping[tuple[str, str], str], pod: str
) -> str | None:
    """An env entry's value; None for an optional Secret's key that is not there (the
    kubelet leaves the variable out)."""
    source = item.get("valueFrom")
    if source is None:
        return str(item.get("value", ""))
    if "fieldRef" in source:
        assert source["fieldRef"]["fieldPath"] == "metadata.name", source
        return pod
    ref = source["secretKeyRef"]
    if (ref["name"], ref["key"]) not in secrets and ref.get("optional"):
        return None
    return secrets[(ref["name"], ref["key"])]


def probe(pod: PodContainer, kind: str) -> int | None:
    """The HTTP status of the container's `kind` probe (startupProbe, readinessProbe,
    livenessProbe), or None when nothing answers."""
    get = pod.spec[kind]["httpGet"]
    url = f"http://127.0.0.1:{pod.port(get['port'])}{get['path']}"
    try:
        return http_get(url, timeout=pod.spec[kind].get("timeoutSeconds", 1) + 2)[0]
    except OSError:
        return None
