#!/usr/bin/env bash
# The offline routing evaluation matrix (issues 4 and 18): `pronto evaluate` on
# - the Mooncake conversation and synthetic traces × a homogeneous 8×H100 fleet and a
#   4×H100 + 4×A100 fleet × LOADS, each over SEEDS (seeds ≠ 1 re-draw the inter-arrival gaps,
#   `--arrival-seed`; seed 1 is the trace's own timing);
# - the generated worlds of issue 18 (no files needed): the seeded chat and agentic workloads
#   × a fleet of small bounded caches and a fleet of two speed classes with 2–4 running
#   slots × WORLD_LOADS, over WORLD_SEEDS;
# every policy and the oracle, goodput against TTFT_SLO / TPOT_SLO. Writes one JSON per cell
# (`WORKLOAD--FLEET--LOAD--sSEED.json`) and a markdown table with the targets summary.
#
# Usage: scripts/eval-matrix.sh [OUT_DIR]   (default docs/benchmarks/eval-matrix)
# Env: TRACES_DIR (default ../shared/traces/mooncake), LOADS ("0.5 0.8 0.9 0.95 0.98"),
#      SEEDS ("1"), WORLD_LOADS ("0.8 0.95"), WORLD_SEEDS ("1"), WORLDS (set to 0 to skip them),
#      TRACES (set to 0 to skip the traces), POLICIES (default: all gateway policies + oracle),
#      EXTRA_POLICIES (more policies, separated by `;`, each as `pronto evaluate --policy` takes
#      it, parameters included: "predicted_ttft{decode_stall_weight: 0.3}"),
#      LIMIT (requests per trace, default all), TTFT_SLO (1s), TPOT_SLO (50ms),
#      BIN (default target/release/pronto, built if missing), REPLACE (set to 1 to rerun only
#      POLICIES and replace their runs in the cells already in OUT_DIR, keeping the other
#      policies' runs: each policy's run is independent of the others in the same cell, so a
#      change that can move only some policies is rerun for those; the cell's capacity must
#      not change, or the script stops).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/benchmarks/eval-matrix}
TRACES_DIR=${TRACES_DIR:-../shared/traces/mooncake}
LOADS=${LOADS:-0.5 0.8 0.9 0.95 0.98}
SEEDS=${SEEDS:-1}
WORLD_LOADS=${WORLD_LOADS:-0.8 0.95}
WORLD_SEEDS=${WORLD_SEEDS:-1}
POLICIES=${POLICIES:-round_robin random least_inflight power_of_two consistent_hash cache_aware predicted_ttft oracle}
TTFT_SLO=${TTFT_SLO:-1s}
TPOT_SLO=${TPOT_SLO:-50ms}
BIN=${BIN:-target/release/pronto}
[[ -x "$BIN" ]] || cargo build --release --locked --bin pronto
mkdir -p "$OUT"

# cell NAME FLEET LOAD SEED ARGS...: one JSON cell.
cell() {
    local name=$1 fleet=$2 load=$3 seed=$4
    shift 4
    local args=(evaluate --fleet "config/sim/$fleet.yaml" --load "$load" --json
        --ttft-slo "$TTFT_SLO" --tpot-slo "$TPOT_SLO" "$@")
    [[ -n "${LIMIT:-}" ]] && args+=(--limit "$LIMIT")
    for p in $POLICIES; do args+=(--policy "$p"); done
    if [[ -n "${EXTRA_POLICIES:-}" ]]; then
        local extra
        IFS=';' read -ra extra <<<"$EXTRA_POLICIES"
        for p in "${extra[@]}"; do args+=(--policy "$p"); done
    fi
    echo "eval-matrix: $name × $fleet × load $load × seed $seed" >&2
    local cell="$OUT/$name--$fleet--$load--s$seed.json"
    if [[ "${REPLACE:-0}" == 1 ]]; then
        [[ -f "$cell" ]] || { echo "eval-matrix: REPLACE=1 but $cell is absent" >&2; exit 1; }
        "$BIN" "${args[@]}" 2>/dev/null >"$cell.new"
        python3 - "$cell" "$cell.new" <<'PY'
import json, sys
cell, new = sys.argv[1:]
old, fresh = json.load(open(cell)), json.load(open(new))
if old["capacity_rps"] != fresh["capacity_rps"]:
    sys.exit(f"eval-matrix: {cell}: capacity {old['capacity_rps']} → {fresh['capacity_rps']}; rerun the whole cell")
by = {r["policy"]: r for r in fresh["runs"]}
old["runs"] = [by.pop(r["policy"], r) for r in old["runs"]] + list(by.values())
with open(cell, "w") as f:
    json.dump(old, f, separators=(",", ":"))
    f.write("\n")
PY
        rm "$cell.new"
    else
        "$BIN" "${args[@]}" 2>/dev/null >"$cell"
    fi
}

if [[ "${TRACES:-1}" != 0 ]]; then
    for t in conversation synthetic; do
        trace="$TRACES_DIR/${t}_trace.jsonl"
        if [[ ! -f "$trace" ]]; then
            echo "eval-matrix: $trace is absent; skipping the $t trace" >&2
            continue
        fi
        for fleet in fleet fleet-hetero; do
            for load in $LOADS; do
                for seed in $SEEDS; do
                    extra=()
                    [[ "$seed" != 1 ]] && extra=(--arrival-seed "$seed")
                    cell "$t" "$fleet" "$load" "$seed" --trace "$trace" "${extra[@]}"
                done
            done
        done
    done
fi
if [[ "${WORLDS:-1}" != 0 ]]; then
    for w in chat agentic; do
        for fleet in fleet-small-cache fleet-slots; do
            for load in $WORLD_LOADS; do
                for seed in $WORLD_SEEDS; do
                    cell "gen_$w" "$fleet" "$load" "$seed" --workload "$w" --seed "$seed"
                done
            done
        done
    done
fi
python3 scripts/eval-matrix-table.py "$OUT" >"$OUT/README.md"
cat "$OUT/README.md"
