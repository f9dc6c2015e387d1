#!/usr/bin/env bash
# The offline half of scripts/failover-bench.sh (issue 17): the same setup through
# `pronto evaluate`, whose discrete-event simulation models the stall fault, first-token
# failover and hedging with the gateway's own race arithmetic and routing core
# (crates/pronto-sim/src/evaluate/race.rs).
#
# A fleet of BACKENDS × PROFILE (KV_BLOCKS blocks each) whose every backend stalls its first
# token STALL with probability STALL_P, the generated chat workload at LOAD of the fleet's
# capacity (seed 1 is the workload `pronto replay` sends in the live bench), predicted_ttft:
#   nofault      the same fleet without the fault (the reference)
#   fault        the fault, no race
#   failover     the fault, --first-token-deadline "$DEADLINE"
#   hedge        the fault, --hedge "$HEDGE"
#   bound        the fault, --failover-oracle: each stalled copy fails over the instant its
#                engine made the first token the stall holds, no healthy copy ever does — the
#                least p99 and the least extra prefill any deadline can reach (a reference,
#                not a setting)
# then a sweep of deadlines (SWEEP_FACTORS × SWEEP_FLOORS, and the absolute SWEEP_AFTERS) over
# the workload seeds SEEDS:
# each setting's p99 TTFT under the fault over the same seed's no-fault p99, and its extra
# prefill (prompt tokens the engines prefilled for aborted copies over the uncached prompt
# tokens of the relayed first tokens), against the issue's target (≤ 1.2× with ≤ 5 %).
# Last, the same fleet serving a reasoning model (REASONING, the fleet file's `reasoning:`),
# seed 1: no fault, the fault, the fault with DEADLINE raced on the first token, and with
# DEADLINE raced on the first answer (`--race-on ttfa`), on TTFA.
# Writes the tables to $OUT (default docs/benchmarks/failover/offline.md) and the JSON of
# every run beside them in $RUNS.
#
# Usage: ./scripts/failover-eval.sh
# Environment (all optional):
#   LOAD=0.5 BACKENDS=4 PROFILE=h100-llama3-8b KV_BLOCKS=8000 STALL=2s STALL_P=0.05
#   DEADLINE="{factor: 2, floor: 150ms}"  HEDGE="{quantile: 0.95, budget: 0.1}"
#   SEEDS="1 2 3 4 5"  SWEEP_FACTORS="1.2 1.5 2"  SWEEP_FLOORS="30ms 60ms 150ms"
#   SWEEP_AFTERS="60ms 100ms 150ms"
#   REASONING="{mean_tokens: 30, sigma: 0.6, max_tokens: 600, seed: 1}"
#   OUT=FILE  RUNS=DIR (default target/failover-eval/<UTC time>)
#   BIN=PATH  pronto binary (default $CARGO_TARGET_DIR/debug/pronto, built unless SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."

LOAD=${LOAD:-0.5}
BACKENDS=${BACKENDS:-4}
PROFILE=${PROFILE:-h100-llama3-8b}
KV_BLOCKS=${KV_BLOCKS:-8000}
STALL=${STALL:-2s}
STALL_P=${STALL_P:-0.05}
DEADLINE=${DEADLINE:-"{factor: 2, floor: 150ms}"}
HEDGE=${HEDGE:-"{quantile: 0.95, budget: 0.1}"}
SEEDS=${SEEDS:-1 2 3 4 5}
SWEEP_FACTORS=${SWEEP_FACTORS:-1.2 1.5 2}
SWEEP_FLOORS=${SWEEP_FLOORS:-30ms 60ms 150ms}
SWEEP_AFTERS=${SWEEP_AFTERS:-60ms 100ms 150ms}
REASONING=${REASONING:-"{mean_tokens: 30, sigma: 0.6, max_tokens: 600, seed: 1}"}
OUT=${OUT:-docs/benchmarks/failover/offline.md}
RUNS=${RUNS:-target/failover-eval/$(date -u +%Y%m%dT%H%M%SZ)}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug/pronto}

if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --locked --bin pronto
fi
[[ -x "$BIN" ]] || { echo "failover-eval: $BIN not found" >&2; exit 1; }
mkdir -p "$RUNS"

fleet_file() { # $1: faults flow mapping entries (may be empty), $2: reasoning (optional)
    echo "model: sim-llama"
    [[ -n "${2:-}" ]] && echo "reasoning: $2"
    echo "backends:"
    for i in $(seq 0 $((BACKENDS - 1))); do
        echo "  - { name: b$i, profile: $PROFILE, num_kv_blocks: $KV_BLOCKS, faults: {$1 seed: $i} }"
    done
}
fleet_file "" >"$RUNS/nofault.yaml"
fleet_file "stall_first_token: $STALL, stall_probability: $STALL_P," >"$RUNS/fault.yaml"
fleet_file "" "$REASONING" >"$RUNS/r-nofault.yaml"
fleet_file "stall_first_token: $STALL, stall_probability: $STALL_P," "$REASONING" \
    >"$RUNS/r-fault.yaml"

run() { # $1: name, $2: fleet, $3: seed, then extra flags
    local name=$1 fleet=$2 seed=$3
    shift 3
    "$BIN" evaluate --fleet "$RUNS/$fleet.yaml" --policy predicted_ttft --load "$LOAD" \
        --seed "$seed" --json "$@" >"$RUNS/$name.seed$seed.json"
}

echo "failover-eval: contenders (seed 1)" >&2
run nofault nofault 1
run fault fault 1
run failover fault 1 --first-token-deadline "$DEADLINE"
run hedge fault 1 --hedge "$HEDGE"
run bound fault 1 --failover-oracle
echo "failover-eval: reasoning (seed 1)" >&2
run r-nofault r-nofault 1
run r-fault r-fault 1
run r-failover r-fault 1 --first-token-deadline "$DEADLINE"
run r-failover-ttfa r-fault 1 --first-token-deadline "$DEADLINE" --race-on ttfa
SWEEP=()
for seed in $SEEDS; do
    echo "failover-eval: sweep, seed $seed" >&2
    [[ -f "$RUNS/nofault.seed$seed.json" ]] || run nofault nofault "$seed"
    [[ -f "$RUNS/fault.seed$seed.json" ]] || run fault fault "$seed"
    [[ -f "$RUNS/bound.seed$seed.json" ]] || run bound fault "$seed" --failover-oracle
    for factor in $SWEEP_FACTORS; do
        for floor in $SWEEP_FLOORS; do
            run "sweep-$factor-$floor" fault "$seed" \
                --first-token-deadline "{factor: $factor, floor: $floor}"
        done
    done
    for after in $SWEEP_AFTERS; do
        run "sweep-after-$after" fault "$seed" --first-token-deadline "{after: $after}"
    done
done
for factor in $SWEEP_FACTORS; do
    for floor in $SWEEP_FLOORS; do SWEEP+=("$factor/$floor"); done
done
for after in $SWEEP_AFTERS; do SWEEP+=("after/$after"); done

mkdir -p "$(dirname "$OUT")"
LOAD=$LOAD BACKENDS=$BACKENDS PROFILE=$PROFILE KV_BLOCKS=$KV_BLOCKS STALL=$STALL \
STALL_P=$STALL_P DEADLINE=$DEADLINE HEDGE=$HEDGE SEEDS=$SEEDS REASONING=$REASONING \
REVISION=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown) \
python3 - "$RUNS" "${SWEEP[@]}" <<'PY' >"$OUT"
import json, os, sys
runs, sweep = sys.argv[1], sys.argv[2:]
env = os.environ
seeds = env["SEEDS"].split()

def load(name, seed):
    return json.load(open(f"{runs}/{name}.seed{seed}.json"))["runs"][0]

def contenders(names, header, cells):
    """A table of seed 1's runs `names`, each row `cells(name, run, first run)`."""
    print("| " + " | ".join(header) + " |")
    print("| --- |" + " ---: |" * (len(header) - 1))
    first = load(names[0], 1)
    for c in names:
        print("| " + " | ".join(cells(c, load(c, 1), first)) + " |")

print("# Stall faults offline: `pronto evaluate` with failover and hedging\n")
print(f"{env['BACKENDS']} × sim {env['PROFILE']} ({env['KV_BLOCKS']} KV blocks each); each "
      f"backend stalls its first token {env['STALL']} with probability {env['STALL_P']} "
      f"(except `nofault`); policy `predicted_ttft`; the generated chat workload (seed 1, the "
      f"workload of the live bench) at load {env['LOAD']}. failover: `--first-token-deadline "
      f"'{env['DEADLINE']}'`; hedge: `--hedge '{env['HEDGE']}'`. Produced by "
      f"`scripts/failover-eval.sh` at {env['REVISION']}; one run each, deterministic.\n")
contenders(
    ["nofault", "fault", "failover", "hedge", "bound"],
    ["contender", "requests", "TTFT mean (ms)", "p50 (ms)", "p99 (ms)", "p99 vs nofault",
     "stalled", "failovers (won)", "hedges (won)", "extra prefill"],
    lambda c, r, base: [
        c, f"{r['requests']}", f"{r['ttft_mean_ms']:.0f}", f"{r['ttft_p50_ms']:.0f}",
        f"{r['ttft_p99_ms']:.0f}", f"{r['ttft_p99_ms'] / base['ttft_p99_ms']:.2f}×",
        f"{r['stalled']}", f"{r['failovers']} ({r['failovers_won']})",
        f"{r['hedges']} ({r['hedges_won']})", f"{100 * r['extra_prefill']:.1f} %"])

print(f"\n## Deadline sweep, seeds {', '.join(seeds)}\n")
print("Per seed, p99 TTFT with the fault and the deadline over the same seed's no-fault p99; "
      "the target is ≤ 1.2× with ≤ 5 % extra prefill.\n")
print("| deadline | p99 vs nofault, mean (min–max) | extra prefill, mean (max) "
      "| failovers (won) per run | target met |")
print("| --- | ---: | ---: | ---: | :---: |")
def label(s):
    a, b = s.split("/")
    return f"after {b}" if a == "after" else f"factor {a}, floor {b}"
rows = [("none (fault)", "fault"), ("bound: `--failover-oracle`", "bound")] + [(label(s), f"sweep-{s.replace('/', '-')}") for s in sweep]
for label, name in rows:
    ratios, extras, fo, won = [], [], 0, 0
    for seed in seeds:
        r = load(name, seed)
        ratios.append(r["ttft_p99_ms"] / load("nofault", seed)["ttft_p99_ms"])
        extras.append(r["extra_prefill"])
        fo += r["failovers"]
        won += r["failovers_won"]
    mean = sum(ratios) / len(ratios)
    met = all(x <= 1.2 for x in ratios) and all(e <= 0.05 for e in extras)
    print(f"| {label} | {mean:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) "
          f"| {100 * sum(extras) / len(extras):.1f} % ({100 * max(extras):.1f} %) "
          f"| {fo / len(seeds):.0f} ({won / len(seeds):.0f}) | {'yes' if met else 'no'} |")
print("\nExtra prefill: prompt tokens the engines had prefilled for the copies that lost a race "
      "and were aborted, over the uncached prompt tokens of the relayed first tokens. "
      "`stalled`: copies whose first token the fault held. `bound`: `--failover-oracle`, "
      "each stalled copy failed over the instant its engine made the first token the stall "
      "holds, and no healthy copy — the earliest any deadline can tell a stall from a slow "
      "start, without a false alarm: one that fires sooner fires on healthy copies in the same "
      "state too (more prefill), one that fires later waits longer. Its extra prefill is what "
      "the stalled copies had prefilled, the floor of every rule.")

print(f"\n## A reasoning model: racing on the first answer, seed 1\n")
print(f"The same fleet serving a model that reasons first (`reasoning: {env['REASONING']}`). "
      f"failover: `--first-token-deadline '{env['DEADLINE']}'` raced on the first token; "
      f"failover-ttfa: the same deadline with `--race-on ttfa` — it scales the predicted TTFA, "
      f"each copy's reasoning is held until its first answer token, which decides the race, so "
      f"a raced stream's client TTFT is its TTFA.\n")
contenders(
    ["r-nofault", "r-fault", "r-failover", "r-failover-ttfa"],
    ["contender", "TTFT p99 (ms)", "TTFA mean (ms)", "TTFA p99 (ms)", "TTFA p99 vs nofault",
     "reasoning tokens (mean)", "failovers (won)", "extra prefill"],
    lambda c, r, base: [
        c[2:], f"{r['ttft_p99_ms']:.0f}", f"{r['ttfa_mean_ms']:.0f}", f"{r['ttfa_p99_ms']:.0f}",
        f"{r['ttfa_p99_ms'] / base['ttfa_p99_ms']:.2f}×", f"{r['reasoning_tokens_mean']:.0f}",
        f"{r['failovers']} ({r['failovers_won']})", f"{100 * r['extra_prefill']:.1f} %"])
PY
cat "$OUT"
