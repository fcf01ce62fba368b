#!/usr/bin/env bash
# Redis round trips per decision over gRPC: 64 concurrent streams against ratelimitd on Redis.
#   bench/redis/grpc_round_trips.sh [NAME=VALUE ...]      e.g. REDIS_PIPELINE_WINDOW=5ms
#   RATE=2600 bench/redis/grpc_round_trips.sh ...          paced instead of saturating
# Round trips are read from the daemon's ratelimit.redis_pool.pipeline_writes gauge.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
read -r P1 P2 P3 P4 < <($PY -c "
import socket
ports = []
for _ in range(4):
    s = socket.socket(); s.bind(('127.0.0.1', 0)); ports.append(s.getsockname()[1]); s.close()
print(*ports)")
work=$(mktemp -d)
mkdir -p "$work/config"
printf 'domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n' \
    > "$work/config/bench.yaml"
redis-server --port "$P4" --save "" --appendonly no --dir "$work" >/dev/null 2>&1 &
redis_pid=$!
env PORT="$P1" GRPC_PORT="$P2" DEBUG_PORT="$P3" HOST=127.0.0.1 GRPC_HOST=127.0.0.1 \
    DEBUG_HOST=127.0.0.1 RUNTIME_ROOT="$work" RUNTIME_WATCH_ROOT=false DISABLE_STATS=true \
    BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$P4" "$@" \
    $PY -m ratelimitd serve >"$work/daemon.log" 2>&1 &
daemon_pid=$!
trap 'kill $daemon_pid $redis_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -sf "127.0.0.1:$P1/healthcheck" >/dev/null && break; sleep 0.1; done
writes() { curl -s "127.0.0.1:$P3/stats" | awk '/redis_pool.pipeline_writes/ {print $2}'; }
before=$(writes)
result=$($PY bench/load/grpc_load.py --target "127.0.0.1:$P2" --pid "$daemon_pid" \
    --requests 20000 --concurrency 64 --channels 8 --descriptor user=x ${RATE:+--rate $RATE} | tail -1)
after=$(writes)
$PY - "$result" "$before" "$after" "$*" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
trips = (float(sys.argv[3]) - float(sys.argv[2])) / r["requests"]
print(f"{sys.argv[4] or 'defaults'}: {r['rps']:.0f} req/s, p99 {r['p99_ms']:.1f} ms, "
      f"server CPU {r['cpu_per_10k']:.2f} s/10k, errors {r['errors']}, "
      f"Redis round trips per decision {trips:.3f}")
PY
