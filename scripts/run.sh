#!/usr/bin/env bash
# The one run command: set up, then start the daemon on the bundled example config
# with the embedded in-memory backend (no Redis needed). Extra arguments go to ratelimitd.
# On a fresh Debian machine the set-up installs what the build needs (see bootstrap.sh),
# so gRPC is served by the native HTTP/2 transport from the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --run
export RUNTIME_ROOT=${RUNTIME_ROOT:-$PWD/examples}
export RUNTIME_SUBDIRECTORY=${RUNTIME_SUBDIRECTORY:-}
export RUNTIME_APPDIRECTORY=${RUNTIME_APPDIRECTORY:-config}
export RUNTIME_WATCH_ROOT=${RUNTIME_WATCH_ROOT:-false}
export USE_STATSD=${USE_STATSD:-false}
export LOG_LEVEL=${LOG_LEVEL:-INFO}
exec .venv/bin/ratelimitd serve "$@"
