"""deploy/helm/ratelimitd: the chart renders with a real helm (4.3.1, from the venv) for each
backend, config source and option; every object it renders is valid for Kubernetes 1.30 and
1.37 (unknown fields refused); its daemon environment is what the daemon reads; it carries the
same Deployment as the kustomize overlays, and the same alerts and dashboard as deploy/.
Values that would make a wrong deployment are refused with one line.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from support.manifests import (
    ALERTS,
    CHART,
    DASHBOARD,
    KUBERNETES_VERSIONS,
    KUSTOMIZE,
    by_kind,
    check_ai_gateway_service,
    container,
    env_of,
    helm_template,
    helm_template_run,
    kustomize,
    run,
    settings_of,
    tool,
    validate,
)

from sidecars.transit.settings import TransitSettings
from sidecars.usage.settings import Settings as UsageSettings

# name -> --set values: every backend, both config sources, TLS, tracing, the sidecars,
# the operator's objects and metrics off.
CASES: dict[str, tuple[str, ...]] = {
    "redis": (),
    "memory": ("backend.type=memory",),
    "sentinel": (
        "backend.type=sentinel",
        "backend.redis.url=mymaster\\,sentinel-0:26379\\,sentinel-1:26379",
        "backend.redis.authSecret.name=redis",
        "backend.redis.authSecret.key=password",
        "backend.redis.sentinelAuthSecret.name=redis",
        "backend.redis.sentinelAuthSecret.key=sentinel-password",
    ),
    "cluster-tls": (
        "backend.type=cluster",
        "backend.redis.url=redis-0:6379\\,redis-1:6379",
        "backend.redis.tls.enabled=true",
        "backend.redis.tls.secretName=redis-client",
        "backend.redis.tls.useCA=true",
        "backend.redis.perSecond.enabled=true",
        "backend.redis.perSecond.url=fast-0:6379\\,fast-1:6379",
    ),
    "xds": ("config.source=xds", "tls.enabled=true"),
    "tracing": ("tracing.enabled=true", "tracing.protocol=grpc"),
    "everything": (
        "backend.redis.urlSecret.name=redis",
        "backend.redis.urlSecret.key=url",
        "metrics.prometheusRule.enabled=true",
        "metrics.dashboard.enabled=true",
        "sidecars.usage.enabled=true",
        "sidecars.transit.enabled=true",
        "sidecars.transit.env[0].name=TRANSIT_DEMO",
        "sidecars.transit.env[0].value=true",
    ),
    "metrics-off": ("metrics.enabled=false",),
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: helm_template(*values) for name, values in CASES.items()}


def daemon(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        d for d in by_kind(objects)["Deployment"] if d["metadata"]["name"] == "rl-ratelimitd"
    ]
    return found


def test_chart_lints() -> None:
    done = run(tool("helm"), "lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid(
    rendered: dict[str, list[dict[str, Any]]], case: str, version: str
) -> None:
    for obj in rendered[case]:
        validate(obj, version)


@pytest.mark.parametrize("case", CASES)
def test_environment_is_what_the_daemon_reads(
    rendered: dict[str, list[dict[str, Any]]], case: str
) -> None:
    deployment = daemon(rendered[case])
    settings, unread = settings_of(env_of(deployment))
    assert not unread, f"variables the daemon does not read: {sorted(unread)}"
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    listeners = settings.listeners
    assert (ports["http"], ports["grpc"], ports["debug"]) == (
        listeners.port,
        listeners.grpc_port,
        listeners.debug_port,
    )
    if settings.stats.use_prometheus:
        assert settings.stats.prometheus_addr == f":{ports['metrics']}"
    else:
        assert "metrics" not in ports and "ServiceMonitor" not in by_kind(rendered[case])


def test_backends(rendered: dict[str, list[dict[str, Any]]]) -> None:
    memory = by_kind(rendered["memory"])
    assert settings_of(env_of(daemon(rendered["memory"])))[0].cache.backend == "memory"
    assert daemon(rendered["memory"])["spec"]["replicas"] == 1
    assert daemon(rendered["memory"])["spec"]["strategy"] == {"type": "Recreate"}
    assert "HorizontalPodAutoscaler" not in memory and "PodDisruptionBudget" not in memory

    redis = by_kind(rendered["redis"])
    assert "replicas" not in daemon(rendered["redis"])["spec"]  # the autoscaler's
    assert redis["HorizontalPodAutoscaler"][0]["spec"]["minReplicas"] == 2
    assert "PodDisruptionBudget" in redis

    sentinel = daemon(rendered["sentinel"])
    settings = settings_of(env_of(sentinel))[0]
    assert (settings.redis.type, settings.redis.url) == (
        "sentinel",
        "mymaster,sentinel-0:26379,sentinel-1:26379",
    )
    env = {e["name"]: e for e in container(sentinel)["env"]}
    assert env["REDIS_AUTH"]["valueFrom"]["secretKeyRef"] == {"name": "redis", "key": "password"}
    assert env["REDIS_SENTINEL_AUTH"]["valueFrom"]["secretKeyRef"]["key"] == "sentinel-password"

    cluster = daemon(rendered["cluster-tls"])
    settings = settings_of(env_of(cluster))[0]
    assert settings.redis.type == "cluster" and settings.redis.tls
    assert (settings.redis.tls_client_cert, settings.redis.tls_cacert) == (
        "/redis-certs/tls.crt",
        "/redis-certs/ca.crt",
    )
    assert settings.redis_persecond is not None
    assert settings.redis_persecond.type == "cluster" and settings.redis_persecond.tls
    pod = cluster["spec"]["template"]["spec"]
    assert {
        "name": "redis-certs",
        "secret": {"secretName": "redis-client", "defaultMode": 288},
    } in (pod["volumes"])

    url = {e["name"]: e for e in container(daemon(rendered["everything"]))["env"]}["REDIS_URL"]
    assert url["valueFrom"]["secretKeyRef"] == {"name": "redis", "key": "url"}


def test_xds_with_envoy_gateway_certificates(rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployment = daemon(rendered["xds"])
    settings = settings_of(env_of(deployment))[0]
    assert settings.config.type == "GRPC_XDS_SOTW"
    assert (settings.xds.server_url, settings.xds.node_id) == (
        "envoy-gateway:18001",
        "envoy-ratelimit",
    )
    assert settings.grpc.server_use_tls and settings.xds.server_use_tls
    assert settings.grpc.client_tls_cacert == settings.xds.server_tls_cacert == "/certs/ca.crt"
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "certs", "secret": {"secretName": "envoy-rate-limit", "defaultMode": 288}} in (
        pod["volumes"]
    )
    assert "ConfigMap" not in by_kind(rendered["xds"])
    assert all(v["name"] != "config" for v in pod["volumes"])


def test_tracing(rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployment = daemon(rendered["tracing"])
    settings = settings_of(env_of(deployment))[0]
    assert settings.tracing.enabled and settings.tracing.exporter_protocol == "grpc"
    assert settings.tracing.service_namespace == "edge"
    env = {e["name"]: e for e in container(deployment)["env"]}
    assert env["TRACING_SERVICE_INSTANCE_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector:4318"


@pytest.mark.parametrize(("case", "overlay_name"), [("redis", "redis"), ("xds", "xds")])
def test_same_deployment_as_the_overlay(
    rendered: dict[str, list[dict[str, Any]]], case: str, overlay_name: str
) -> None:
    chart = daemon(rendered[case])
    (overlay,) = by_kind(kustomize(KUSTOMIZE / "overlays" / overlay_name))["Deployment"]
    env = env_of(overlay)
    env.pop("REDIS_AUTH")  # the overlay's optional Secret; the chart's is off by default
    assert settings_of(env_of(chart))[0] == settings_of(env)[0]
    same = (
        "command",
        "ports",
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
        "lifecycle",
        "resources",
        "securityContext",
        "volumeMounts",
    )
    for field in same:
        assert container(chart)[field] == container(overlay)[field], field
    pods = chart["spec"]["template"]["spec"], overlay["spec"]["template"]["spec"]
    for field in (
        "securityContext",
        "terminationGracePeriodSeconds",
        "automountServiceAccountToken",
    ):
        assert pods[0][field] == pods[1][field], field
    # The same volumes of the same kinds (the chart's ConfigMap is named after the release).
    kinds = [[(v["name"], sorted(set(v) - {"name"})) for v in pod["volumes"]] for pod in pods]
    assert kinds[0] == kinds[1]
    labels = chart["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "ratelimit"


def test_alerts_and_dashboard_are_deploys_own(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = by_kind(rendered["everything"])
    (rule,) = objects["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    (dashboard,) = [c for c in objects["ConfigMap"] if c["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["ratelimitd.json"]) == json.loads(DASHBOARD.read_text())


def test_sidecars(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = by_kind(rendered["everything"])
    deployments = {d["metadata"]["name"]: d for d in objects["Deployment"]}
    # The sidecars image (deploy/Containerfile's `sidecars` target), the daemon's own.
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container(deployments["rl-ratelimitd"])["image"] == (
        f"ghcr.io/ratelimitd/ratelimitd:{version}"
    )
    for name in ("usage", "transit"):
        assert container(deployments[f"rl-ratelimitd-{name}"], name)["image"] == (
            f"ghcr.io/ratelimitd/ratelimitd-sidecars:{version}"
        )
    usage = UsageSettings.from_env(env_of(deployments["rl-ratelimitd-usage"], "usage"))
    assert (usage.host, usage.port) == ("0.0.0.0", 8090)
    assert usage.ratelimit_address == "rl-ratelimitd.edge.svc:8081"
    transit = TransitSettings.from_env(env_of(deployments["rl-ratelimitd-transit"], "transit"))
    assert (transit.server.host, transit.server.port) == ("0.0.0.0", 8080)
    services = {s["metadata"]["name"] for s in objects["Service"]}
    assert {"rl-ratelimitd-usage", "rl-ratelimitd-transit"} <= services
    # The sidecars call the daemon: the policy admits them besides Envoy.
    (policy,) = objects["NetworkPolicy"]
    sources = policy["spec"]["ingress"][0]["from"]
    for name in ("usage", "transit"):
        assert {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "rl"}
            }
        } in sources


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ("backend.type=memory", "replicaCount=3"),
            "replicaCount=3: the memory backend counts per process",
        ),
        (
            ("backend.type=memory", "autoscaling.enabled=true"),
            "autoscaling.enabled=true: the memory backend counts per process",
        ),
        (("backend.type=redys",), "at '/backend/type': value must be one of"),
        (("backend.redis.uri=redis:6379",), "additional properties 'uri' not allowed"),
        (("tls.enabled=true", "tls.secretName="), "tls.secretName: the Secret with tls.crt"),
        (("backend.redis.url=",), "backend.redis.url: the Redis address"),
    ],
)
def test_wrong_values_are_refused(values: tuple[str, ...], message: str) -> None:
    done = helm_template_run(*values)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_ai_gateway_values_make_the_service_ai_gateway_dials() -> None:
    objects = by_kind(
        helm_template(
            release="envoy-ai-gateway-ratelimit",
            namespace="envoy-gateway-system",
            values_file="values-ai-gateway.yaml",
        )
    )
    check_ai_gateway_service(objects)
    for version in KUBERNETES_VERSIONS:
        for obj in objects["Deployment"] + objects["Service"]:
            validate(obj, version)
