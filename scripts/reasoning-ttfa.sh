#!/usr/bin/env bash
# A reasoning workload offline: time to first answer (TTFA) by routing policy and objective
# (issue 17, items 4 and 5). `pronto evaluate` replays the seeded synthetic workload (or
# TRACE) through the 4×H100 + 4×A100 fleet serving a reasoning model
# (config/sim/fleet-hetero-reasoning.yaml: log-normal reasoning, mean 400 tokens) at each of
# LOADS of its capacity, reasoning counted as generated work, with no SLO on the route (as the
# gateway's default route), and reports TTFT and TTFA per policy — POLICIES minimising TTFT,
# plus `predicted_ttft` with `--objective ttfa` (a route's `objective: ttfa`) and the oracle
# with `--objective ttfa` (the reference: it knows each request's reasoning length and the
# engines' true state, and picks the smallest true TTFA). Writes
# $OUT/README.md (the tables) and $OUT/evaluate-<load>-<objective>.json.
#
# Usage: ./scripts/reasoning-ttfa.sh
# Environment (all optional):
#   LOADS="0.8 0.5 0.95"  FLEET=config/sim/fleet-hetero-reasoning.yaml  LIMIT=2000  SEED=1
#   POLICIES="round_robin least_inflight cache_aware predicted_ttft"
#   TRACE=FILE FORMAT=mooncake   a trace instead of the synthetic workload
#   OUT=DIR   (default target/reasoning-ttfa/<UTC time>)
#   BIN=PATH  pronto binary (default $CARGO_TARGET_DIR/debug/pronto, built unless SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."

LOADS=${LOADS:-${LOAD:-0.8 0.5 0.95}}
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
for load in $LOADS; do
    args=(evaluate --fleet "$FLEET" --load "$load" --limit "$LIMIT" --seed "$SEED" --json
          --ttft-slo off --tpot-slo off)
    if [[ -n "${TRACE:-}" ]]; then args+=(--trace "$TRACE" --format "${FORMAT:-mooncake}"); fi
    ttft=("${args[@]}")
    for p in $POLICIES; do ttft+=(--policy "$p"); done
    "$BIN" "${ttft[@]}" >"$OUT/evaluate-$load-ttft.json"
    "$BIN" "${args[@]}" --policy predicted_ttft --policy oracle --objective ttfa \
        >"$OUT/evaluate-$load-ttfa.json"
done

python3 - "$OUT" "$FLEET" "$LOADS" "${TRACE:-synthetic (seed $SEED)}" <<'PY' >"$OUT/README.md"
import json, sys
out, fleet, loads, trace = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
print("# A reasoning workload: time to first answer by policy and objective (offline)\n")
print(f"`pronto evaluate` on `{fleet}` (reasoning counted as generated work; no SLO on the "
      f"route), the {trace} workload. TTFA: arrival to the first answer token after the "
      "model's reasoning. `predicted_ttft (ttfa)`: `--objective ttfa`, a route's "
      "`objective: ttfa`. `oracle (ttfa)`: the evaluator's oracle with `--objective ttfa`, "
      "which knows each request's reasoning length and every engine's true state and sends "
      "the request where its true TTFA is least (greedy, request by request) — what routing "
      "alone could reach. Produced by `scripts/reasoning-ttfa.sh`.\n")
for load in loads:
    ttft = json.load(open(f"{out}/evaluate-{load}-ttft.json"))
    ttfa = json.load(open(f"{out}/evaluate-{load}-ttfa.json"))
    runs = ttft["runs"] + [dict(r, policy=r["policy"] + " (ttfa)") for r in ttfa["runs"]]
    base = next((r for r in runs if r["policy"] == "predicted_ttft"), runs[0])
    print(f"## Load {load} (capacity {ttft['capacity_rps']:.2f} req/s, "
          f"{runs[0]['requests']} requests)\n")
    print("| policy | TTFT mean (ms) | TTFT p99 (ms) | TTFA mean (ms) | TTFA p99 (ms) "
          f"| TTFA mean, p99 vs {base['policy']} | TPOT p50 (ms) | reasoning tokens (mean) "
          "| prefix hit % |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        mean = r["ttfa_mean_ms"] / base["ttfa_mean_ms"] if base["ttfa_mean_ms"] else float("nan")
        p99 = r["ttfa_p99_ms"] / base["ttfa_p99_ms"] if base["ttfa_p99_ms"] else float("nan")
        print(f"| {r['policy']} | {r['ttft_mean_ms']:.0f} | {r['ttft_p99_ms']:.0f} "
              f"| {r['ttfa_mean_ms']:.0f} | {r['ttfa_p99_ms']:.0f} | {mean:.2f}×, {p99:.2f}× "
              f"| {r['tpot_p50_ms']:.1f} | {r['reasoning_tokens_mean']:.0f} "
              f"| {100 * r['prefix_hit_rate']:.1f} |")
    print()
PY
cat "$OUT/README.md"
