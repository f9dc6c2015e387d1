#!/usr/bin/env bash
# One-minute replay smoke test: a simulated fleet, the gateway in front of it, and
# `pronto replay` sending the seeded synthetic workload through the gateway.
#
# Fails when any request failed or none was sent. Prints the summary table.
#
# Usage: ./scripts/replay-smoke.sh [extra `pronto replay` flags...]
# Environment (all optional):
#   DURATION=60s      how much of the synthetic workload to replay
#   BACKENDS=4        simulated backends
#   TIME_SCALE=1      simulated step-time multiplier (0.5 = twice as fast as the GPU profile)
#   POLICY=predicted_ttft   the gateway's routing policy
#   OUT=DIR           keep the replay's files here (default: a temporary directory)
#   SKIP_BUILD=1      use the existing debug binary without running `cargo build`
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60s}
BACKENDS=${BACKENDS:-4}
TIME_SCALE=${TIME_SCALE:-1}
POLICY=${POLICY:-predicted_ttft}
MODEL=sim-llama
BIN="${CARGO_TARGET_DIR:-target}/debug/pronto"

if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --locked --bin pronto
fi
[[ -x "$BIN" ]] || { echo "replay-smoke: $BIN not found; run cargo build" >&2; exit 1; }

source scripts/lib/live.sh
live_init replay-smoke
OUT=${OUT:-$TMP/out}

# 1. The simulated fleet on ephemeral ports.
start_fleet "$TMP/fleet.log" "$BACKENDS" --backends "$BACKENDS" --base-port 0 \
    --num-kv-blocks 4000 --time-scale "$TIME_SCALE" --model "$MODEL"

# 2. The gateway on free ports (a port taken between the check and the bind: try again).
gateway_yaml() {
    cat <<EOF
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
threads: 2
explain_headers: true
pools:
  $MODEL:
    policy: $POLICY
    backends:
$FLEET_BACKENDS
EOF
}
start_gateway gateway_yaml
port=$GW_PORT
echo "replay-smoke: $BACKENDS simulated backends (time scale $TIME_SCALE), gateway :$port ($POLICY)"

# 3. The replay.
"$BIN" replay --target "http://127.0.0.1:$port" --duration "$DURATION" --out "$OUT" "$@"
cat "$OUT/summary.md"

requests=$(sed -n 's/^ *"requests": *\([0-9]*\).*/\1/p' "$OUT/summary.json")
errors=$(sed -n 's/^ *"errors": *\([0-9]*\).*/\1/p' "$OUT/summary.json")
if [[ -z "$requests" || "$requests" -eq 0 ]]; then
    echo "replay-smoke: FAILED: no requests replayed" >&2; exit 1
fi
if [[ -z "$errors" || "$errors" -ne 0 ]]; then
    echo "replay-smoke: FAILED: $errors of $requests requests failed; the first errors:" >&2
    grep -m 5 '"error":"' "$OUT/results.jsonl" | sed 's/.*"error":"//' | cut -c 1-240 >&2 || true
    exit 1
fi
echo "replay-smoke: OK: $requests requests, 0 errors"
