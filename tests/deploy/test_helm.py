"""deploy/helm/ratelimitd: the chart renders with a real helm (4.3.1, from the venv) for each
backend, config source and option; every object it renders is valid for Kubernetes 1.30 and
1.37 (unknown fields refused); its daemon environment is what the daemon reads; it carries the
same Deployment as the kustomize overlays, and the same alerts and dashboard as deploy/.
Values that would make a wrong deployment are refused with one line.
"""

from __future__ import annotations

import json
import sys
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
from support.process import REPO

from ratelimitd.process.cli import parse_flags
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
    # What operators set: names, OpenShift's restricted-v2 (no fixed user, group or fsGroup),
    # priority, extra volumes, probe tuning, the Service, relabelings, a pinned image.
    "operator": (
        "nameOverride=limiter",
        "podSecurityContext.runAsUser=null",
        "podSecurityContext.runAsGroup=null",
        "podSecurityContext.fsGroup=null",
        "priorityClassName=system-cluster-critical",
        "extraVolumes[0].name=ca",
        "extraVolumes[0].secret.secretName=corporate-ca",
        "extraVolumeMounts[0].name=ca",
        "extraVolumeMounts[0].mountPath=/etc/corporate-ca",
        "extraVolumeMounts[0].readOnly=true",
        "probes.readiness.periodSeconds=2",
        "probes.readiness.failureThreshold=2",
        "probes.liveness.timeoutSeconds=3",
        "service.type=LoadBalancer",
        "service.annotations.service\\.beta\\.kubernetes\\.io/aws-load-balancer-scheme=internal",
        "metrics.serviceMonitor.relabelings[0].targetLabel=cluster",
        "metrics.serviceMonitor.relabelings[0].replacement=eu-1",
        "metrics.serviceMonitor.metricRelabelings[0].action=drop",
        "metrics.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
        "metrics.serviceMonitor.metricRelabelings[0].regex=go_.*",
        "image.digest=sha256:" + "ab" * 32,
        "debug.exposed=true",
        "networkPolicy.allowJson=true",
        "networkPolicy.envoy.podSelector.matchLabels.security\\.istio\\.io/tlsMode=istio",
        "networkPolicy.envoy.namespaceSelector.matchLabels.istio-injection=enabled",
    ),
    "usage-postgres": (
        "sidecars.usage.enabled=true",
        "sidecars.usage.replicaCount=3",
        "sidecars.usage.database.type=postgres",
        "sidecars.usage.database.postgres.dsnSecret.name=usage-db",
        "fullnameOverride=edge-limits",
    ),
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: helm_template(*values) for name, values in CASES.items()}


def daemon(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        d
        for d in by_kind(objects)["Deployment"]
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "ratelimit"
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
    assert (ports["http"], ports["grpc"]) == (listeners.port, listeners.grpc_port)
    if "debug" in ports:  # debug.exposed
        assert (ports["debug"], listeners.debug_host) == (listeners.debug_port, "0.0.0.0")
    else:  # no credentials on it: the pod's loopback only
        assert listeners.debug_host == "127.0.0.1"
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
    # The sidecars call the daemon: the policy admits them besides Envoy, to gRPC.
    (policy,) = objects["NetworkPolicy"]
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": "grpc", "protocol": "TCP"}]
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
        (
            ("replicaCount=4",),
            "replicaCount=4 with the autoscaler on: the HorizontalPodAutoscaler owns",
        ),
        (
            ("sidecars.usage.enabled=true", "sidecars.usage.replicaCount=2"),
            "sidecars.usage.replicaCount=2 with database.type=sqlite: the accounts database",
        ),
        (
            ("sidecars.usage.enabled=true", "sidecars.usage.database.type=postgres"),
            "sidecars.usage.database.postgres.dsnSecret: the Secret's name",
        ),
        (("image.digest=latest",), "at '/image/digest'"),
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


def test_operator_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = by_kind(rendered["operator"])
    deployment = daemon(rendered["operator"])
    assert deployment["metadata"]["name"] == "rl-limiter"
    assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "limiter"
    pod = deployment["spec"]["template"]["spec"]
    # restricted-v2 picks the user, group and fsGroup: none is fixed, the rest stays.
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert {"name": "ca", "secret": {"secretName": "corporate-ca"}} in pod["volumes"]
    rl = container(deployment)
    assert {"name": "ca", "mountPath": "/etc/corporate-ca", "readOnly": True} in rl["volumeMounts"]
    assert (rl["readinessProbe"]["periodSeconds"], rl["readinessProbe"]["failureThreshold"]) == (
        2,
        2,
    )
    assert rl["livenessProbe"]["timeoutSeconds"] == 3
    assert rl["image"] == "ghcr.io/ratelimitd/ratelimitd@sha256:" + "ab" * 32
    (service,) = objects["Service"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["metadata"]["annotations"] == {
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"
    }
    assert "debug" in {p["name"] for p in service["spec"]["ports"]}
    (endpoint,) = objects["ServiceMonitor"][0]["spec"]["endpoints"]
    assert endpoint["relabelings"] == [{"targetLabel": "cluster", "replacement": "eu-1"}]
    assert endpoint["metricRelabelings"][0]["regex"] == "go_.*"
    # Every object carries the overridden name; the sidecars' names follow fullnameOverride.
    assert all(o["metadata"]["name"].startswith("rl-limiter") for o in rendered["operator"])
    assert {o["metadata"]["name"] for o in by_kind(rendered["usage-postgres"])["Deployment"]} == {
        "edge-limits",
        "edge-limits-usage",
    }


def test_replica_count_without_the_autoscaler() -> None:
    objects = by_kind(helm_template("autoscaling.enabled=false", "replicaCount=4"))
    assert daemon(objects["Deployment"])["spec"]["replicas"] == 4
    assert "HorizontalPodAutoscaler" not in objects


def policy_rules(objects: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The NetworkPolicy's ingress rules: ports -> sources."""
    (policy,) = by_kind(objects)["NetworkPolicy"]
    return {tuple(p["port"] for p in r["ports"]): r["from"] for r in policy["spec"]["ingress"]}


def test_network_policy_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    test_pod = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "ratelimitd-test",
                "app.kubernetes.io/instance": "rl",
                "app.kubernetes.io/component": "test",
            }
        }
    }
    # By default: gRPC from Envoy Gateway's proxies (and the `helm test` pod); metrics from
    # the monitoring namespace; /json and the debug listener from nowhere.
    assert policy_rules(rendered["redis"]) == {
        ("grpc",): [
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "envoy"}},
            },
            test_pod,
        ],
        ("metrics",): [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
    }
    # Another fleet's selectors (Istio's here), /json and the debug listener when asked.
    operator = policy_rules(rendered["operator"])
    assert operator[("grpc", "http")][0] == {
        "namespaceSelector": {"matchLabels": {"istio-injection": "enabled"}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "envoy",
                "security.istio.io/tlsMode": "istio",
            }
        },
    }
    assert ("debug", "metrics") in operator
    # Neither metrics nor debug: no monitoring rule at all.
    assert list(policy_rules(rendered["metrics-off"])) == [("grpc",)]
    assert "NetworkPolicy" not in by_kind(helm_template("networkPolicy.enabled=false"))
    # The selector is loud where an operator reads: values.yaml and the install's notes.
    values = (CHART / "values.yaml").read_text()
    assert "DROPPED" in values and "failure_mode_deny=false" in values
    notes = run(tool("helm"), "install", "rl", str(CHART), "--dry-run=client").stdout
    assert '{"app.kubernetes.io/name":"envoy"}' in notes and "DROPPED" in notes


def test_usage_database(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # SQLite (the default): a claim kept on uninstall, one pod, Recreate, the image's path
    # overridden to the claim's mount.
    objects = by_kind(rendered["everything"])
    (claim,) = objects["PersistentVolumeClaim"]
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    usage = {d["metadata"]["name"]: d for d in objects["Deployment"]}["rl-ratelimitd-usage"]
    assert (usage["spec"]["replicas"], usage["spec"]["strategy"]) == (1, {"type": "Recreate"})
    env = env_of(usage, "usage")
    path = UsageSettings.from_env(env).sqlite_path
    (mount,) = [m for m in container(usage, "usage")["volumeMounts"] if m["name"] == "database"]
    assert path == f"{mount['mountPath']}/usage.sqlite3"
    pod = usage["spec"]["template"]["spec"]
    assert {
        "name": "database",
        "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
    } in pod["volumes"]
    # PostgreSQL: the DSN from a Secret, the image's SQLite path emptied, any replicas.
    objects = by_kind(rendered["usage-postgres"])
    assert "PersistentVolumeClaim" not in objects
    usage = {d["metadata"]["name"]: d for d in objects["Deployment"]}["edge-limits-usage"]
    assert usage["spec"]["replicas"] == 3 and "strategy" not in usage["spec"]
    env = env_of(usage, "usage")
    assert env["USAGE_SQLITE_PATH"] == "" and env["USAGE_POSTGRES_DSN"] == "secret-dsn"
    existing = helm_template(
        "sidecars.usage.enabled=true", "sidecars.usage.database.sqlite.existingClaim=accounts"
    )
    assert "PersistentVolumeClaim" not in by_kind(existing)


@pytest.mark.parametrize("case", ["redis", "xds"])
def test_helm_test_asks_the_release_for_a_decision(
    rendered: dict[str, list[dict[str, Any]]], case: str
) -> None:
    (pod,) = [
        o
        for o in by_kind(rendered[case]).get("Pod", [])
        if o["metadata"]["annotations"]["helm.sh/hook"] == "test"
    ]
    (test,) = pod["spec"]["containers"]
    assert test["image"] == container(daemon(rendered[case]))["image"]
    command = test["command"]
    assert command[:2] == ["/bin/ratelimit", "client"]
    flags = parse_flags(command[2:])  # the daemon's own client parses them
    assert flags.dial_string == "rl-ratelimitd.edge.svc:8081"
    assert flags.grpc_use_tls is (case == "xds")
    assert test["securityContext"]["readOnlyRootFilesystem"] is True


def test_chart_readme_is_generated_from_the_values() -> None:
    done = run(sys.executable, str(REPO / "scripts" / "chart_readme.py"), "--check")
    assert done.returncode == 0, done.stderr
