#!/usr/bin/env bash
# A reasoning workload offline: time to first answer (TTFA) by routing policy (issue 17,
# item 5). `pronto evaluate` replays the seeded synthetic workload (or TRACE) through the
# 4×H100 + 4×A100 fleet serving a reasoning model (config/sim/fleet-hetero-reasoning.yaml:
# log-normal reasoning, mean 400 tokens) at LOAD of its capacity, reasoning counted as
# generated work, and reports TTFT and TTFA per policy. Writes $OUT/README.md (the table) and
# $OUT/evaluate.json.
#
# Usage: ./scripts/reasoning-ttfa.sh
# Environment (all optional):
#   LOAD=0.8  FLEET=config/sim/fleet-hetero-reasoning.yaml  LIMIT=2000  SEED=1
#   POLICIES="round_robin least_inflight cache_aware predicted_ttft"
#   TRACE=FILE FORMAT=mooncake   a trace instead of the synthetic workload
#   OUT=DIR   (default target/reasoning-ttfa/<UTC time>)
#   BIN=PATH  pronto binary (default $CARGO_TARGET_DIR/debug/pronto, built unless SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."

LOAD=${LOAD:-0.8}
FLEET=${FLEET:-config/sim/fleet-hetero-reasoning.yaml}
LIMIT=${LIMIT:-2000}
SEED=${SEED:-1}
POLICIES=${POLICIES:-round_robin least_inflight cache_aware predicted_ttft}
OUT=${OUT:-target/reasoning-ttfa/$(date -u +%Y%m%dT%H%M%SZ)}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug/pronto}

if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --locked --bin pronto
fi
mkdir -p "$OUT"
args=(evaluate --fleet "$FLEET" --load "$LOAD" --limit "$LIMIT" --seed "$SEED" --json)
for p in $POLICIES; do args+=(--policy "$p"); done
if [[ -n "${TRACE:-}" ]]; then args+=(--trace "$TRACE" --format "${FORMAT:-mooncake}"); fi
"$BIN" "${args[@]}" >"$OUT/evaluate.json"

python3 - "$OUT/evaluate.json" "$FLEET" "$LOAD" "$LIMIT" "${TRACE:-synthetic (seed $SEED)}" \
    <<'PY' >"$OUT/README.md"
import json, sys
path, fleet, load, limit, trace = sys.argv[1:]
doc = json.load(open(path))
runs = doc["runs"]
base = next((r for r in runs if r["policy"] == "predicted_ttft"), runs[0])
print("# A reasoning workload: time to first answer by policy (offline)\n")
print(f"`pronto evaluate` on `{fleet}` at load {load} (capacity {doc['capacity_rps']:.2f} req/s, "
      f"reasoning counted as generated work), {limit} requests of the {trace} workload. TTFA: "
      "arrival to the first answer token after the model's reasoning. "
      "Produced by `scripts/reasoning-ttfa.sh`.\n")
print("| policy | TTFT mean (ms) | TTFT p99 (ms) | TTFA mean (ms) | TTFA p99 (ms) "
      f"| TTFA p99 vs {base['policy']} | reasoning tokens (mean) | prefix hit % |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in runs:
    ratio = r["ttfa_p99_ms"] / base["ttfa_p99_ms"] if base["ttfa_p99_ms"] else float("nan")
    print(f"| {r['policy']} | {r['ttft_mean_ms']:.0f} | {r['ttft_p99_ms']:.0f} "
          f"| {r['ttfa_mean_ms']:.0f} | {r['ttfa_p99_ms']:.0f} | {ratio:.2f}× "
          f"| {r['reasoning_tokens_mean']:.0f} | {100 * r['prefix_hit_rate']:.1f} |")
PY
cat "$OUT/README.md"
