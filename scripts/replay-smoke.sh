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

TMP=$(mktemp -d -t pronto-replay-smoke.XXXXXX)
OUT=${OUT:-$TMP/out}
PIDS=()
cleanup() {
    local rc=$?
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $rc -ne 0 ]]; then
        for log in "$TMP"/*.log; do
            [[ -s "$log" ]] && { echo "--- $log (last 20 lines)" >&2; tail -n 20 "$log" >&2; }
        done
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Whether something accepts connections on 127.0.0.1:$1.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# 1. The simulated fleet on ephemeral ports; it prints "name<TAB>url<TAB>profile" per backend.
# (Logs go to stdout too, so only the tab-separated lines are read.)
RUST_LOG=warn "$BIN" sim-fleet --backends "$BACKENDS" --base-port 0 --num-kv-blocks 4000 \
    --time-scale "$TIME_SCALE" --model "$MODEL" >"$TMP/fleet.log" 2>&1 &
PIDS+=($!)
fleet_up() {
    grep -E $'^[^\t]+\thttp://[^\t]+\t' "$TMP/fleet.log" >"$TMP/fleet.tsv" || true
    [[ $(wc -l <"$TMP/fleet.tsv") -ge $BACKENDS ]]
}
for _ in $(seq 300); do
    fleet_up && break
    kill -0 "${PIDS[0]}" 2>/dev/null || { echo "replay-smoke: sim-fleet exited" >&2; exit 1; }
    sleep 0.1
done
fleet_up || { echo "replay-smoke: sim-fleet not up" >&2; exit 1; }

# 2. The gateway on free ports (a port taken between the check and the bind: try again).
backends=""
while IFS=$'\t' read -r name url _; do
    backends+="      - { name: $name, url: \"$url\" }"$'\n'
done <"$TMP/fleet.tsv"
started=""
for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 20000)); admin=$((port + 1))
    if listening "$port" || listening "$admin"; then continue; fi
    cat >"$TMP/pronto.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin
threads: 2
explain_headers: true
pools:
  $MODEL:
    policy: $POLICY
    backends:
$backends
EOF
    RUST_LOG=${RUST_LOG:-warn} "$BIN" serve --config "$TMP/pronto.yaml" >"$TMP/gateway.log" 2>&1 &
    gw=$!
    for _ in $(seq 300); do
        kill -0 "$gw" 2>/dev/null || break
        if listening "$port" && listening "$admin"; then started=1; break; fi
        sleep 0.1
    done
    if [[ -n "$started" ]]; then PIDS+=("$gw"); break; fi
    kill "$gw" 2>/dev/null || true
    wait "$gw" 2>/dev/null || true
    echo "replay-smoke: gateway attempt $attempt failed to start" >&2
done
[[ -n "$started" ]] || { echo "replay-smoke: gateway did not start" >&2; exit 1; }
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
