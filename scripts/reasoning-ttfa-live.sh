#!/usr/bin/env bash
# A reasoning workload live (issue 17, item 5): time to first answer through the gateway by
# routing objective. The simulated 4×H100 + 4×A100 fleet serving a reasoning model
# (config/sim/fleet-hetero-reasoning.yaml, ports rewritten to ephemeral ones), the gateway in
# front of it, and `pronto replay` sending the seeded synthetic workload for DURATION at LOAD
# of the fleet's capacity (reasoning counted as generated work). One fresh fleet and gateway
# per contender:
#   ttft         predicted_ttft, route objective: ttft (the default)
#   ttfa         predicted_ttft, route objective: ttfa
#   cache_aware  SGLang's cache_aware policy
# Writes $OUT/<contender>/ (the replay's files, the gateway's /metrics) and the table
# $OUT/README.md: TTFT and TTFA mean/p99 per contender, TTFA p99 against `ttft`.
#
# Usage: ./scripts/reasoning-ttfa-live.sh
# Environment (all optional):
#   DURATION=60s LOAD=0.8 TIME_SCALE=1 FLEET=config/sim/fleet-hetero-reasoning.yaml
#   CONTENDERS="ttft ttfa cache_aware"
#   OUT=DIR        (default target/reasoning-ttfa-live/<UTC time>)
#   BIN=PATH       pronto binary (default $CARGO_TARGET_DIR/debug/pronto, built unless SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60s}
LOAD=${LOAD:-0.8}
TIME_SCALE=${TIME_SCALE:-1}
FLEET=${FLEET:-config/sim/fleet-hetero-reasoning.yaml}
CONTENDERS=${CONTENDERS:-ttft ttfa cache_aware}
OUT=${OUT:-target/reasoning-ttfa-live/$(date -u +%Y%m%dT%H%M%SZ)}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug/pronto}

if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --locked --bin pronto
fi
[[ -x "$BIN" ]] || { echo "reasoning-ttfa-live: $BIN not found" >&2; exit 1; }
[[ -f "$FLEET" ]] || { echo "reasoning-ttfa-live: $FLEET not found" >&2; exit 1; }
mkdir -p "$OUT"
MODEL=$(sed -n 's/^model: *//p' "$FLEET" | head -n1)
BACKENDS=$(grep -c 'profile:' "$FLEET")

source scripts/lib/live.sh
live_init reasoning-live

gateway_yaml() { # $1: port, $2: admin port; POLICY and ROUTE_EXTRA
    cat <<EOF
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
threads: 2
routes:
  - { name: chat, pool: $MODEL$ROUTE_EXTRA }
pools:
  $MODEL:
    policy: $POLICY
    backends:
$FLEET_BACKENDS
EOF
}

run() { # $1: contender name, $2: policy, $3: route extra
    local name=$1 dir="$OUT/$1"
    sed -E 's/port: *[0-9]+/port: 0/' "$FLEET" >"$TMP/fleet.yaml"
    start_fleet "$TMP/fleet.log" "$BACKENDS" --config "$TMP/fleet.yaml" --time-scale "$TIME_SCALE"
    POLICY=$2 ROUTE_EXTRA=$3 start_gateway gateway_yaml
    local port=$GW_PORT admin=$GW_ADMIN
    echo "reasoning-ttfa-live: $name: replaying $DURATION at load $LOAD" >&2
    mkdir -p "$dir"
    "$BIN" replay --target "http://127.0.0.1:$port" --duration "$DURATION" \
        --model "$MODEL" --load "$LOAD" --fleet "$TMP/fleet.yaml" --out "$dir" >"$TMP/replay.log" 2>&1 \
        || { cp "$TMP"/*.log "$dir/"; exit 1; }
    cp "$TMP/pronto.yaml" "$dir/pronto.yaml"
    admin_get "$admin" /metrics >"$dir/metrics.txt"
    stop_all
}

for c in $CONTENDERS; do
    case $c in
        ttft) run ttft predicted_ttft "" ;;
        ttfa) run ttfa predicted_ttft ", objective: ttfa" ;;
        cache_aware) run cache_aware cache_aware "" ;;
        *) echo "reasoning-ttfa-live: unknown contender $c" >&2; exit 1 ;;
    esac
done

python3 - "$OUT" "$CONTENDERS" "$FLEET" "$DURATION" "$LOAD" <<'PY' >"$OUT/README.md"
import json, sys
out, contenders, fleet, duration, load = sys.argv[1], sys.argv[2].split(), *sys.argv[3:]

def pct(v, p):
    v = sorted(v)
    if not v:
        return None
    k = max(1, -(-len(v) * p // 100))
    return v[int(k) - 1]

rows = {}
for c in contenders:
    recs = [json.loads(l) for l in open(f"{out}/{c}/results.jsonl")]
    ok = [r for r in recs if r.get("error") is None]
    col = lambda k: [r[k] for r in ok if r.get(k) is not None]
    ttft, ttfa = col("ttft_ms"), col("ttfa_ms")
    mean = lambda v: sum(v) / len(v) if v else None
    rows[c] = dict(n=len(recs), errors=len(recs) - len(ok), ttft_mean=mean(ttft),
                   ttft_p99=pct(ttft, 99), ttfa_mean=mean(ttfa), ttfa_p99=pct(ttfa, 99))
base = rows.get("ttft", {}).get("ttfa_p99")
f = lambda x: "-" if x is None else f"{x:.0f}"
print("# A reasoning workload live: time to first answer by routing objective\n")
print(f"`{fleet}` as `pronto sim-fleet`, the gateway in front of it, `pronto replay` sending the "
      f"seeded synthetic workload for {duration} at load {load} of the fleet's capacity "
      "(reasoning counted as generated work). `ttft` and `ttfa`: `predicted_ttft` with the "
      "route's `objective:`; `cache_aware`: SGLang's policy. "
      "Produced by `scripts/reasoning-ttfa-live.sh`.\n")
print("| contender | requests | errors | TTFT mean (ms) | TTFT p99 (ms) | TTFA mean (ms) "
      "| TTFA p99 (ms) | TTFA p99 vs ttft |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for c, r in rows.items():
    ratio = f"{r['ttfa_p99'] / base:.2f}×" if base and r["ttfa_p99"] else "-"
    print(f"| {c} | {r['n']} | {r['errors']} | {f(r['ttft_mean'])} | {f(r['ttft_p99'])} "
          f"| {f(r['ttfa_mean'])} | {f(r['ttfa_p99'])} | {ratio} |")
PY
cat "$OUT/README.md"
