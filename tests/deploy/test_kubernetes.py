"""deploy/kubernetes: every overlay renders with `kubectl kustomize`, every object it renders
is valid for Kubernetes 1.30 and 1.37 (unknown fields refused), and the Deployment is one the
daemon runs as written: each variable a setting it reads, Envoy Gateway's probes on its
health endpoint, a shutdown that fits the grace period, the ConfigMap as its config directory.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support import free_port, http_get, wait_for
from support.daemon import DaemonProcess
from support.manifests import (
    KUBERNETES_VERSIONS,
    KUSTOMIZE,
    by_kind,
    check_ai_gateway_service,
    container,
    env_of,
    kustomize,
    settings_of,
    validate,
)
from support.process import REPO
from support.ready import room_in_this_minute
from support.redis_server import RedisServer

from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.process.daemon import DRAIN_GRACE_SECONDS
from ratelimitd.stats.prometheus import SCRAPE_GRACE_SECONDS

OVERLAYS = ("memory", "redis", "xds", "ai-gateway")
# Envoy Gateway's probes of its rate-limit container (resource.go): all GET /healthcheck on
# 8080 with 1 s timeouts; readiness every 5 s, out at the first failure.
ENVOY_GATEWAY_PROBES = {
    "startupProbe": {"periodSeconds": 10, "successThreshold": 1, "failureThreshold": 30},
    "readinessProbe": {"periodSeconds": 5, "successThreshold": 1, "failureThreshold": 1},
    "livenessProbe": {"periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Each overlay's objects, rendered once for the module."""
    return {name: kustomize(KUSTOMIZE / "overlays" / name) for name in OVERLAYS}


def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = by_kind(objects)["Deployment"]
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, version: str
) -> None:
    kinds = set()
    for obj in rendered[overlay]:
        validate(obj, version)
        kinds.add(obj["kind"])
    assert {"Deployment", "Service", "NetworkPolicy", "ServiceMonitor"} <= kinds


def test_validation_refuses_unknown_fields(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # The check is strict, for built-in kinds and for the operator's CRD kinds alike.
    objects = by_kind(rendered["redis"])
    bad = copy.deepcopy(objects["Deployment"][0])
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad, KUBERNETES_VERSIONS[-1])
    monitor = copy.deepcopy(objects["ServiceMonitor"][0])
    monitor["spec"]["endpoints"][0]["prot"] = "metrics"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, KUBERNETES_VERSIONS[-1])
    monitor = copy.deepcopy(objects["ServiceMonitor"][0])
    monitor["metadata"]["label"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(monitor, KUBERNETES_VERSIONS[-1])


def test_overlays_scale_as_their_backend_counts(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The memory overlay runs one pod; under an autoscaler the Deployment has no
    `replicas`, so `kubectl apply -k` never scales a busy Deployment back down."""
    memory = by_kind(rendered["memory"])
    env = env_of(memory["Deployment"][0])
    assert env["BACKEND_TYPE"] == "memory"
    # Counters in the process: one replica, never two at once, nothing scaling it out.
    assert memory["Deployment"][0]["spec"]["replicas"] == 1
    assert memory["Deployment"][0]["spec"]["strategy"] == {"type": "Recreate"}
    assert "HorizontalPodAutoscaler" not in memory
    assert "PodDisruptionBudget" not in memory
    for name in ("redis", "xds", "ai-gateway"):
        objects = by_kind(rendered[name])
        assert settings_of(env_of(objects["Deployment"][0]))[0].cache.backend == "redis"
        (hpa,) = objects["HorizontalPodAutoscaler"]
        assert hpa["spec"]["minReplicas"] >= 2
        assert "replicas" not in objects["Deployment"][0]["spec"], name
        assert hpa["spec"]["scaleTargetRef"]["name"] == objects["Deployment"][0]["metadata"]["name"]
        (pdb,) = objects["PodDisruptionBudget"]
        assert pdb["spec"]["selector"] == objects["Deployment"][0]["spec"]["selector"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_environment_is_what_the_daemon_reads(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    objects = by_kind(rendered[overlay])
    rl = container(objects["Deployment"][0])
    settings, unread = settings_of(env_of(objects["Deployment"][0]))
    assert not unread, f"variables the daemon does not read: {sorted(unread)}"
    # Ports: the containerPorts are where the settings listen, and the Service routes to them.
    ports = {p["name"]: p["containerPort"] for p in rl["ports"]}
    listeners = settings.listeners
    assert settings.stats.prometheus_addr == f":{ports['metrics']}"
    assert ports == {"http": listeners.port, "grpc": listeners.grpc_port, "metrics": 19001}
    # The debug listener needs no credentials: loopback only, on no port of the Service.
    assert listeners.debug_host == "127.0.0.1"
    (service,) = objects["Service"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in ports.items()
    }
    assert (
        service["spec"]["selector"] == objects["Deployment"][0]["spec"]["selector"]["matchLabels"]
    )
    for probe, expected in ENVOY_GATEWAY_PROBES.items():
        assert rl[probe] == {
            "httpGet": {"path": "/healthcheck", "port": listeners.port},
            "timeoutSeconds": 1,
            **expected,
        }
    if overlay == "xds":
        assert settings.config.type == "GRPC_XDS_SOTW"
        assert settings.config.force_start_without_initial_config
        # mTLS both ways with Envoy Gateway's certificates.
        assert settings.grpc.server_use_tls and settings.xds.server_use_tls
        assert {
            settings.grpc.server_tls_cert,
            settings.xds.client_tls_cert,
        } == {"/certs/tls.crt"}
        assert settings.grpc.client_tls_cacert == settings.xds.server_tls_cacert == "/certs/ca.crt"
        assert {"name": "certs", "mountPath": "/certs", "readOnly": True} in rl["volumeMounts"]
        assert "ConfigMap" not in objects
        assert not [name for name in env_of(objects["Deployment"][0]) if "RUNTIME_" in name]
    elif overlay == "ai-gateway":  # plaintext xDS (test_ai_gateway_overlay_...)
        assert settings.config.type == "GRPC_XDS_SOTW"
        assert "ConfigMap" not in objects
    else:
        assert settings.config.type == "FILE"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_runs_as_envoy_gateway_runs_its_own(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    pod = deployment(rendered[overlay])["spec"]["template"]["spec"]
    rl = container(deployment(rendered[overlay]))
    assert rl["command"] == ["/bin/ratelimit"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "fsGroup": 65534,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert rl["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    assert rl["resources"]["requests"]["cpu"] and rl["resources"]["limits"]["memory"]
    # The only writable place is an emptyDir (/tmp); the rest is mounted read-only.
    for mount in rl["volumeMounts"]:
        writable = mount["mountPath"] == "/tmp"
        assert mount.get("readOnly", False) is not writable, mount


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_covers_pre_stop_and_drain(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    pod = deployment(rendered[overlay])["spec"]["template"]["spec"]
    pre_stop = container(deployment(rendered[overlay]))["lifecycle"]["preStop"]["sleep"]["seconds"]
    # The readiness probe has seen the pod go (it fails from SIGTERM on, every 5 s) and the
    # endpoints have been updated before the kubelet's SIGKILL: pre-stop, then the drain of
    # in-flight calls and of a scrape in progress, with room for the backend to close.
    assert pre_stop >= 5
    drain = DRAIN_GRACE_SECONDS + SCRAPE_GRACE_SECONDS
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + 5


def test_network_policy_admits_envoy_to_grpc_and_monitoring_to_metrics_only(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (policy,) = by_kind(rendered["redis"])["NetworkPolicy"]
    spec = policy["spec"]
    assert spec["podSelector"] == deployment(rendered["redis"])["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress"]
    rules = {tuple(p["port"] for p in rule["ports"]): rule["from"] for rule in spec["ingress"]}
    assert rules == {
        ("grpc",): [
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "envoy"}},
            }
        ],
        ("metrics",): [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
    }


def test_service_monitor_scrapes_the_metrics_port(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = by_kind(rendered["redis"])
    (monitor,) = objects["ServiceMonitor"]
    (service,) = objects["Service"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    # Envoy Gateway's dashboard selects app_kubernetes_io_component="ratelimit".
    assert monitor["spec"]["podTargetLabels"] == ["app.kubernetes.io/component"]
    template = deployment(rendered["redis"])["spec"]["template"]
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "ratelimit"


# -- the rendered Deployment, run ------------------------------------------------------------


def mount_configmap(directory: Path, data: dict[str, str], generation: str) -> None:
    """Lay out a ConfigMap volume as the kubelet's atomic writer does: the files in a
    timestamped directory, `..data` pointing at it, each key a symlink through `..data`;
    a later generation swaps `..data` in one rename and removes the previous directory."""
    directory.mkdir(parents=True, exist_ok=True)
    fresh = directory / f"..{generation}"
    fresh.mkdir()
    for key, text in data.items():
        (fresh / key).write_text(text)
    data_link = directory / "..data"
    previous = data_link.resolve() if data_link.is_symlink() else None
    staging = directory / "..data_tmp"
    staging.symlink_to(fresh.name)
    os.replace(staging, data_link)
    for key in data:
        if not (directory / key).is_symlink():
            (directory / key).symlink_to(f"..data/{key}")
    if previous is not None:
        shutil.rmtree(previous)


def run_deployment(
    objects: list[dict[str, Any]], root: Path, **overrides: str
) -> tuple[DaemonProcess, Path]:
    """The daemon with exactly the Deployment's environment (paths under `root`, ports free,
    loopback), its ConfigMap laid out where the pod mounts it; (daemon, config directory)."""
    kinds = by_kind(objects)
    rl = container(kinds["Deployment"][0])
    env = env_of(kinds["Deployment"][0])
    # The optional Secret with the Redis password does not exist here: the kubelet then
    # leaves the variable out.
    env.pop("REDIS_AUTH", None)
    (mount,) = [m for m in rl["volumeMounts"] if m["name"] == "config"]
    assert mount["mountPath"] == f"{env['RUNTIME_ROOT']}/{env['RUNTIME_SUBDIRECTORY']}/config"
    config_dir = root / mount["mountPath"].lstrip("/")
    (configmap,) = kinds["ConfigMap"]
    mount_configmap(config_dir, configmap["data"], "2026_01_01_00_00_00.000000001")
    env.update(
        RUNTIME_ROOT=str(root / env["RUNTIME_ROOT"].lstrip("/")),
        HOST="127.0.0.1",
        GRPC_HOST="127.0.0.1",
        DEBUG_HOST="127.0.0.1",
        PORT=str(free_port()),
        GRPC_PORT=str(free_port()),
        DEBUG_PORT=str(free_port()),
        PROMETHEUS_ADDR=f"127.0.0.1:{free_port()}",
        **overrides,
    )
    env.update(PATH=os.environ["PATH"], PYTHONPATH=str(REPO))
    daemon = DaemonProcess(env, root / "daemon.log")
    return daemon.wait_ready(), config_dir


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., tuple[DaemonProcess, Path]]]:
    started: list[DaemonProcess] = []

    def start(objects: list[dict[str, Any]], **overrides: str) -> tuple[DaemonProcess, Path]:
        daemon, config_dir = run_deployment(objects, tmp_path / f"pod{len(started)}", **overrides)
        started.append(daemon)
        return daemon, config_dir

    yield start
    for daemon in started:
        daemon.close()


def test_memory_overlay_serves_its_configmap_and_drains_in_time(
    rendered: dict[str, list[dict[str, Any]]], run: Callable[..., tuple[DaemonProcess, Path]]
) -> None:
    objects = rendered["memory"]
    daemon, config_dir = run(objects)
    rl = container(deployment(objects))
    # The probes' request, on the daemon's HTTP port: 200 once it serves.
    probe = rl["readinessProbe"]["httpGet"]
    assert http_get(f"http://127.0.0.1:{daemon.http_port}{probe['path']}")[0] == 200
    # The ConfigMap's rules decide: one request per minute per user. Every call below up to
    # the reload (at most 20 s) must fall in one minute's window.
    room_in_this_minute(25)
    assert daemon.decide("edge", [("user", "alice")]).overall_code == OK
    assert daemon.decide("edge", [("user", "alice")]).overall_code == OVER_LIMIT
    # An edited ConfigMap (the kubelet swaps ..data) is applied in place, counters kept.
    (configmap,) = by_kind(objects)["ConfigMap"]
    rules = yaml.safe_load(configmap["data"]["ratelimit.yaml"])
    rules["descriptors"].append(
        {"key": "tenant", "rate_limit": {"unit": "minute", "requests_per_unit": 1}}
    )
    mount_configmap(config_dir, {"ratelimit.yaml": yaml.safe_dump(rules)}, "2026_01_01_00_01")
    wait_for(lambda: "tenant" in daemon.debug("/rlconfig")[1].decode(), 20, "the edited ConfigMap")
    assert daemon.decide("edge", [("user", "alice")]).overall_code == OVER_LIMIT
    # SIGTERM (after preStop): drained and exited 0 well inside what the grace period leaves.
    pod = deployment(objects)["spec"]["template"]["spec"]
    budget = pod["terminationGracePeriodSeconds"] - rl["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert daemon.terminate(timeout=budget) == 0, daemon.log()[-2000:]
    assert "ratelimitd stopped" in daemon.log()


def test_redis_overlay_counts_in_redis(
    rendered: dict[str, list[dict[str, Any]]],
    run: Callable[..., tuple[DaemonProcess, Path]],
    redis_server: RedisServer,
) -> None:
    daemon, _ = run(rendered["redis"], REDIS_URL=f"127.0.0.1:{redis_server.port}")
    assert daemon.decide("edge", [("user", "bob")]).overall_code == OK
    assert daemon.decide("edge", [("user", "bob")]).overall_code == OVER_LIMIT
    keys = redis_server.client().keys("edge_user_bob_*")
    assert len(keys) == 1, keys


def test_ai_gateway_overlay_is_the_service_ai_gateway_dials(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    # AI Gateway's extension server dials envoy-ai-gateway-ratelimit.envoy-gateway-system:8081
    # in plaintext; its controller serves plaintext ADS on 18002 to this node id.
    objects = by_kind(rendered["ai-gateway"])
    deployment = check_ai_gateway_service(objects)
    assert objects["Service"][0]["metadata"]["namespace"] == "envoy-gateway-system"
    assert "certs" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
