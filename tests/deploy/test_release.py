"""What a release publishes, checked here as far as this machine can: the GitHub workflows
linted (actionlint) and doing what docs/deploy.md says they do, the cibuildwheel
configuration valid, the host's wheel built with the pinned dependencies and repaired by
auditwheel as the release's manylinux wheels are (libnghttp2 bundled), and the licence files
where pyproject, the wheel and the images point to them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.manifests import ALERTS, CHART, DASHBOARD, by_kind, run, tool
from support.process import REPO, binary

WORKFLOWS = REPO / ".github" / "workflows"
VENV_BIN = Path(sys.executable).parent
INSTALL = "the test extras install it (pip install -e '.[test]')"


def venv_tool(name: str) -> str:
    """A tool the test extras put in the venv; missing fails."""
    path = VENV_BIN / name
    assert path.is_file(), f"{name} is missing: {INSTALL}"
    return str(path)


def workflow(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    loaded["on"] = loaded.pop(True)
    return loaded


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job.get("steps", []))


def uses(job: dict[str, Any], action: str) -> dict[str, Any]:
    (found,) = [s for s in steps(job) if s.get("uses", "").startswith(action + "@")]
    return found


def test_workflows_lint() -> None:
    # actionlint checks the `run:` scripts with shellcheck when it is there: it must be.
    binary("shellcheck", "scripts/bootstrap.sh --system installs it")
    files = sorted(WORKFLOWS.glob("*.yaml"))
    assert {f.name for f in files} == {"ci.yaml", "release.yaml"}
    done = run(venv_tool("actionlint"), *map(str, files))
    assert done.returncode == 0, done.stdout + done.stderr
    # It does lint: a job needing one that does not exist is refused.
    broken = REPO / ".github" / "workflows" / "release.yaml"
    text = broken.read_text().replace("needs: [version, images]", "needs: [version, imagez]")
    done = subprocess.run(
        [venv_tool("actionlint"), "-"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1 and "imagez" in done.stdout, done.stdout + done.stderr
    # and a `run:` script's shell mistake, through shellcheck.
    text = broken.read_text().replace('cosign sign --yes "$IMAGE"', "cosign sign --yes $IMAGE")
    done = subprocess.run(
        [venv_tool("actionlint"), "-"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1 and "SC2086" in done.stdout, done.stdout + done.stderr


def test_release_scripts_pass_shellcheck() -> None:
    scripts = [
        REPO / "scripts" / "wheel-nghttp2.sh",
        *sorted((REPO / "deploy" / "image").glob("*.sh")),
    ]
    done = run(
        binary("shellcheck", "scripts/bootstrap.sh --system installs it"), *map(str, scripts)
    )
    assert done.returncode == 0, done.stdout


def test_ci_runs_the_readme_test_command_on_every_push_and_pull_request() -> None:
    ci = workflow("ci.yaml")
    assert {"push", "pull_request"} <= set(ci["on"])
    (job,) = ci["jobs"].values()
    assert [s["run"] for s in steps(job) if s.get("run") == "bash .ci/run"]
    # The test command is the README's: .ci/run runs it.
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert "scripts/test.sh" in (REPO / "README.md").read_text()


def test_release_publishes_signed_multi_arch_images_the_chart_and_wheels() -> None:
    release = workflow("release.yaml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    jobs = release["jobs"]
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yaml"
    # Images: both targets, amd64 and arm64, SBOM and provenance, signed keylessly.
    images = jobs["images"]
    assert "test" in images["needs"]
    assert images["permissions"]["id-token"] == "write"
    targets = {m["target"] for m in images["strategy"]["matrix"]["include"]}
    assert targets == {"ratelimit", "sidecars"}
    build = uses(images, "docker/build-push-action")["with"]
    assert build["file"] == "deploy/Containerfile"
    assert build["platforms"] == "linux/amd64,linux/arm64"
    assert build["sbom"] is True and build["provenance"] == "mode=max"
    assert "REVISION=${{ github.sha }}" in build["build-args"]
    assert "SOURCE_DATE_EPOCH=" in build["build-args"]
    sign = [s["run"] for s in steps(images) if "cosign sign" in s.get("run", "")]
    assert sign == ['cosign sign --yes "$IMAGE"']
    # The chart: packaged at the tag's version, pushed as an OCI artifact, signed.
    (script,) = [s["run"] for s in steps(jobs["chart"]) if "helm push" in s.get("run", "")]
    assert 'helm push "dist/ratelimitd-$VERSION.tgz" "oci://$REGISTRY/$OWNER/charts"' in script
    assert "cosign sign --yes" in script
    # Wheels on both architectures' runners, to PyPI by trusted publishing.
    assert uses(jobs["wheels"], "pypa/cibuildwheel")
    assert {"ubuntu-24.04", "ubuntu-24.04-arm"} == set(
        jobs["wheels"]["strategy"]["matrix"]["runner"]
    )
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}
    assert uses(jobs["pypi"], "pypa/gh-action-pypi-publish")
    # The chart README's install command names what the chart job pushes.
    readme = (REPO / "deploy" / "helm" / "ratelimitd" / "README.md").read_text()
    assert "oci://ghcr.io/ratelimitd/charts/ratelimitd" in readme


def test_cibuildwheel_builds_manylinux_wheels_for_both_architectures() -> None:
    done = run(
        venv_tool("cibuildwheel"), "--print-build-identifiers", "--platform", "linux",
        "--archs", "x86_64,aarch64", str(REPO),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        f"cp3{minor}-manylinux_{arch}" for arch in ("x86_64", "aarch64") for minor in (11, 12, 13)
    ]


@pytest.fixture(scope="module")
def host_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ratelimitd's wheel for this machine, built from a clean copy of the tracked files
    with the pinned dependencies (as the release builds it)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        path = REPO / name.decode()
        if path.is_file():
            (source / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name.decode())
    out = root / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin:/sbin", "HOME": str(root),
             "PIP_CONSTRAINT": str(REPO / "constraints.txt")},
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("ratelimitd-*.whl")
    return wheel


def test_host_wheel_bundles_libnghttp2_when_repaired(host_wheel: Path, tmp_path: Path) -> None:
    auditwheel = venv_tool("auditwheel")
    done = run(auditwheel, "-v", "show", str(host_wheel))
    assert done.returncode == 0, done.stderr
    # The native HTTP/2 core links the system's libnghttp2, which a manylinux wheel may not
    # assume: the repair must copy it in.
    assert "dependencies will need to be eliminated:\n\nlibnghttp2.so.14" in done.stdout
    print(f"\nauditwheel show {host_wheel.name}:\n{done.stdout}")
    done = subprocess.run(
        [auditwheel, "repair", "-w", str(tmp_path), str(host_wheel)],
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin"}, capture_output=True, text=True, check=False,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (repaired,) = tmp_path.glob("ratelimitd-*manylinux*.whl")
    names = zipfile.ZipFile(repaired).namelist()
    assert [n for n in names if n.startswith("ratelimitd.libs/libnghttp2")], names
    done = run(auditwheel, "-v", "show", str(repaired))
    assert done.returncode == 0, done.stderr
    assert "manylinux_" in done.stdout and "need to be eliminated" not in done.stdout
    print(f"auditwheel show {repaired.name}:\n{done.stdout}")
    # The licence travels with the wheel.
    licences = {Path(n).name for n in names if ".dist-info/licenses/" in n and n[-1] != "/"}
    assert licences == {"LICENSE", "NOTICE"}, names


def test_licence_files() -> None:
    licence = (REPO / "LICENSE").read_text()
    assert (
        licence.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in licence
    )
    assert "END OF TERMS AND CONDITIONS" in licence
    with open(REPO / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE", "NOTICE"]
    notice = (REPO / "NOTICE").read_text()
    # What came from the reference service is named, with where it lives here.
    assert "envoyproxy/ratelimit" in notice and "tests/configs/" in notice
    assert (
        "Copied from envoyproxy/ratelimit (Apache-2.0)"
        in (REPO / "tests" / "configs" / "README.md").read_text()
    )
    containerfile = (REPO / "deploy" / "Containerfile").read_text()
    assert containerfile.count('org.opencontainers.image.licenses="Apache-2.0"') == 2
    assert "COPY LICENSE NOTICE /rootfs/usr/share/doc/ratelimitd/" in containerfile


def test_packaged_chart_renders_as_the_directory_does(tmp_path: Path) -> None:
    """What the chart job pushes: `helm package` at a version, then rendered from the
    archive alone (its dashboard and alerts are links into deploy/, which the archive must
    carry as files)."""
    helm = tool("helm")
    done = run(helm, "package", str(CHART), "--version", "9.9.9", "--app-version", "9.9.9",
               "-d", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    (archive,) = tmp_path.glob("ratelimitd-9.9.9.tgz")
    values = ("metrics.prometheusRule.enabled=true", "metrics.dashboard.enabled=true")
    sets = [arg for value in values for arg in ("--set", value)]
    packaged = run(helm, "template", "rl", str(archive), "--namespace", "edge", *sets)
    assert packaged.returncode == 0, packaged.stderr
    objects = by_kind(yaml.safe_load_all(packaged.stdout))
    assert objects["PrometheusRule"][0]["spec"] == yaml.safe_load(ALERTS.read_text())
    (pod,) = objects["Pod"]
    assert pod["spec"]["containers"][0]["image"] == "ghcr.io/ratelimitd/ratelimitd:9.9.9"
    (dashboard,) = [c for c in objects["ConfigMap"] if c["metadata"]["name"].endswith("-dashboard")]
    assert json.loads(dashboard["data"]["ratelimitd.json"]) == json.loads(DASHBOARD.read_text())
