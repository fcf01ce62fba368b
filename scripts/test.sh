#!/usr/bin/env bash
# The one test command (README, `make test` and CI all call this): set up, then run the
# whole suite with the compiled core, then the core tests again on the pure-Python twins of
# the compiled leaves (keys, match, the Redis codec, the gRPC codec and call), under the one
# decision model, which is compiled only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --system
# The slowest tests are listed at the end, to keep the suite within its 15 minutes.
.venv/bin/python -m pytest --durations=25 "$@"
RATELIMITD_NO_EXTENSIONS=1 .venv/bin/python -m pytest -q -m "not slow" tests/core
