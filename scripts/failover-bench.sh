#!/usr/bin/env bash
# Stall faults with and without first-token failover and hedging (issue 17, item 5).
#
# A simulated fleet whose every backend stalls its first token STALL (2 s) with probability
# STALL_P (5 %), the gateway in front of it (predicted_ttft), and `pronto replay` sending the
# seeded synthetic workload at LOAD of the fleet's capacity. One fresh fleet and gateway per
# contender:
#   nofault      the same fleet without the fault (the reference)
#   fault        the fault, no race
#   failover     the fault, route first_token_deadline: $DEADLINE
#   hedge        the fault, route hedge: $HEDGE
# Writes $OUT/<contender>/ (the replay's files, the gateway's /metrics) and the table
# $OUT/README.md: TTFT p50/p99 and its ratio to `nofault`, the races, and the extra prefill
# work: prompt tokens sent to cancelled copies (pronto_race_wasted_prompt_tokens_total) over
# the uncached prompt tokens of the relayed responses (from their `usage`).
#
# Usage: ./scripts/failover-bench.sh
# Environment (all optional):
#   DURATION=60s LOAD=0.5 BACKENDS=4 PROFILE=h100-llama3-8b KV_BLOCKS=8000 TIME_SCALE=1
#   STALL=2s STALL_P=0.05
#   DEADLINE="{factor: 2, floor: 150ms}"   HEDGE="{quantile: 0.95, budget: 0.1}"
#   CONTENDERS="nofault fault failover hedge"
#   OUT=DIR        (default target/failover-bench/<UTC time>)
#   BIN=PATH       pronto binary (default $CARGO_TARGET_DIR/debug/pronto, built unless SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60s}
LOAD=${LOAD:-0.5}
BACKENDS=${BACKENDS:-4}
PROFILE=${PROFILE:-h100-llama3-8b}
KV_BLOCKS=${KV_BLOCKS:-8000}
TIME_SCALE=${TIME_SCALE:-1}
STALL=${STALL:-2s}
STALL_P=${STALL_P:-0.05}
DEADLINE=${DEADLINE:-"{factor: 2, floor: 150ms}"}
HEDGE=${HEDGE:-"{quantile: 0.95, budget: 0.1}"}
CONTENDERS=${CONTENDERS:-nofault fault failover hedge}
OUT=${OUT:-target/failover-bench/$(date -u +%Y%m%dT%H%M%SZ)}
MODEL=sim-llama
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug/pronto}

if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --locked --bin pronto
fi
[[ -x "$BIN" ]] || { echo "failover-bench: $BIN not found" >&2; exit 1; }
mkdir -p "$OUT"

source scripts/lib/live.sh
live_init failover-bench

fleet_file() { # $1: faults flow mapping (may be empty)
    echo "model: $MODEL"
    echo "backends:"
    for i in $(seq 0 $((BACKENDS - 1))); do
        echo "  - { name: b$i, profile: $PROFILE, num_kv_blocks: $KV_BLOCKS, port: 0, faults: {$1 seed: $i} }"
    done
}

gateway_yaml() { # $1: port, $2: admin port; the route's extra keys in ROUTE_EXTRA
    cat <<EOF
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
threads: 2
explain_headers: true
routes:
  - { name: chat, pool: $MODEL$ROUTE_EXTRA }
pools:
  $MODEL:
    policy: predicted_ttft
    backends:
$FLEET_BACKENDS
EOF
}

run() { # $1: contender name, $2: faults, $3: route extra
    local name=$1 dir="$OUT/$1"
    fleet_file "$2" >"$TMP/fleet.yaml"
    start_fleet "$TMP/fleet.log" "$BACKENDS" --config "$TMP/fleet.yaml" --time-scale "$TIME_SCALE"
    ROUTE_EXTRA=$3 start_gateway gateway_yaml
    local port=$GW_PORT admin=$GW_ADMIN
    echo "failover-bench: $name: replaying $DURATION at load $LOAD" >&2
    mkdir -p "$dir"
    "$BIN" replay --target "http://127.0.0.1:$port" --duration "$DURATION" \
        --model "$MODEL" --load "$LOAD" --fleet "$TMP/fleet.yaml" --out "$dir" >"$TMP/replay.log" 2>&1 \
        || { cp "$TMP"/*.log "$dir/"; exit 1; }
    cp "$TMP/pronto.yaml" "$dir/pronto.yaml"
    cp "$TMP/fleet.yaml" "$dir/fleet.yaml"
    admin_get "$admin" /metrics >"$dir/metrics.txt"
    stop_all
}

for c in $CONTENDERS; do
    case $c in
        nofault) run nofault "" "" ;;
        fault) run fault "stall_first_token: $STALL, stall_probability: $STALL_P," "" ;;
        failover) run failover "stall_first_token: $STALL, stall_probability: $STALL_P," \
            ", first_token_deadline: $DEADLINE" ;;
        hedge) run hedge "stall_first_token: $STALL, stall_probability: $STALL_P," \
            ", hedge: $HEDGE" ;;
        *) echo "failover-bench: unknown contender $c" >&2; exit 1 ;;
    esac
done

python3 - "$OUT" "$CONTENDERS" <<'PY' >"$OUT/README.md"
import json, os, re, sys
out, contenders = sys.argv[1], sys.argv[2].split()
env = {k: os.environ.get(k, d) for k, d in [
    ("DURATION", "60s"), ("LOAD", "0.5"), ("BACKENDS", "4"), ("PROFILE", "h100-llama3-8b"),
    ("STALL", "2s"), ("STALL_P", "0.05"), ("DEADLINE", "{factor: 2, floor: 150ms}"),
    ("HEDGE", "{quantile: 0.95, budget: 0.1}")]}

def pct(v, p):
    v = sorted(v)
    if not v:
        return None
    k = max(1, -(-len(v) * p // 100))
    return v[int(k) - 1]

def metric(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total

rows = {}
for c in contenders:
    recs = [json.loads(l) for l in open(f"{out}/{c}/results.jsonl")]
    ok = [r for r in recs if r.get("error") is None]
    ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
    uncached = sum((r.get("prompt_tokens") or 0) - (r.get("cached_tokens") or 0) for r in ok)
    m = open(f"{out}/{c}/metrics.txt").read()
    wasted = metric(m, "pronto_race_wasted_prompt_tokens_total")
    rows[c] = dict(n=len(recs), errors=len(recs) - len(ok), p50=pct(ttft, 50), p99=pct(ttft, 99),
                   mean=sum(ttft) / len(ttft) if ttft else None,
                   failovers=metric(m, "pronto_failovers_total"),
                   failovers_won=metric(m, "pronto_failovers_won_total"),
                   hedges=metric(m, "pronto_hedges_sent_total"),
                   hedges_won=metric(m, "pronto_hedges_won_total"),
                   extra=wasted / uncached if uncached else None)

base = rows.get("nofault", {}).get("p99")
f = lambda x, d=0: "-" if x is None else f"{x:.{d}f}"
print("# Stall faults: p99 TTFT with and without failover\n")
print(f"{env['BACKENDS']} × sim-fleet {env['PROFILE']}; each backend stalls its first token "
      f"{env['STALL']} with probability {env['STALL_P']} (except `nofault`); gateway "
      f"`predicted_ttft`; the seeded synthetic workload for {env['DURATION']} at load "
      f"{env['LOAD']}. failover: `first_token_deadline: {env['DEADLINE']}`; hedge: "
      f"`hedge: {env['HEDGE']}`. Produced by `scripts/failover-bench.sh`.\n")
print("| contender | requests | errors | TTFT mean (ms) | p50 (ms) | p99 (ms) | p99 vs nofault "
      "| failovers (won) | hedges (won) | extra prefill |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for c, r in rows.items():
    ratio = f"{r['p99'] / base:.2f}×" if base and r["p99"] else "-"
    extra = "-" if r["extra"] is None else f"{100 * r['extra']:.1f} %"
    print(f"| {c} | {r['n']} | {r['errors']} | {f(r['mean'])} | {f(r['p50'])} | {f(r['p99'])} "
          f"| {ratio} | {f(r['failovers'])} ({f(r['failovers_won'])}) "
          f"| {f(r['hedges'])} ({f(r['hedges_won'])}) | {extra} |")
print("\nExtra prefill: prompt tokens sent to the copies that lost a race and were cancelled "
      "(`pronto_race_wasted_prompt_tokens_total`, uncached tokens as the decision saw them) "
      "over the uncached prompt tokens of the relayed responses (`usage`).")
PY
cat "$OUT/README.md"
