#!/usr/bin/env bash
# The offline routing evaluation matrix of issue 4: `pronto evaluate` on the Mooncake
# conversation and synthetic traces × a homogeneous 8×H100 fleet and a 4×H100 + 4×A100 fleet ×
# 50/80/95 % load, every policy and the oracle. Writes one JSON per cell and a markdown table.
#
# Usage: scripts/eval-matrix.sh [OUT_DIR]   (default docs/benchmarks/eval-matrix)
# Env: TRACES_DIR (default ../shared/traces/mooncake), LOADS ("0.5 0.8 0.95"),
#      POLICIES (default: all gateway policies + oracle), LIMIT (requests per trace, default all),
#      BIN (default target/release/pronto, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/benchmarks/eval-matrix}
TRACES_DIR=${TRACES_DIR:-../shared/traces/mooncake}
LOADS=${LOADS:-0.5 0.8 0.95}
POLICIES=${POLICIES:-round_robin random least_inflight power_of_two consistent_hash cache_aware predicted_ttft oracle}
BIN=${BIN:-target/release/pronto}
[[ -x "$BIN" ]] || cargo build --release --locked --bin pronto
mkdir -p "$OUT"
for t in conversation synthetic; do
    trace="$TRACES_DIR/${t}_trace.jsonl"
    if [[ ! -f "$trace" ]]; then
        echo "eval-matrix: $trace is absent; skipping the $t trace" >&2
        continue
    fi
    for fleet in fleet fleet-hetero; do
        for load in $LOADS; do
            cell="$OUT/$t-$fleet-$load.json"
            args=(evaluate --trace "$trace" --fleet "config/sim/$fleet.yaml" --load "$load" --json)
            [[ -n "${LIMIT:-}" ]] && args+=(--limit "$LIMIT")
            for p in $POLICIES; do args+=(--policy "$p"); done
            echo "eval-matrix: $t × $fleet × load $load" >&2
            "$BIN" "${args[@]}" 2>/dev/null >"$cell"
        done
    done
done
python3 scripts/eval-matrix-table.py "$OUT" >"$OUT/README.md"
cat "$OUT/README.md"
