#!/usr/bin/env bash
# Does `pronto evaluate` describe the router that ships? One seeded trace slice (a) through the
# offline evaluator and (b) live: the gateway in front of `pronto sim-fleet` with the same fleet
# file (scripts/compare-routers.sh, a fresh fleet per policy). Prints, per policy, TTFT mean
# and p90 offline and live and their ratio, and whether the orderings agree.
#
# Usage: ./scripts/live-vs-offline.sh
# Environment (all optional):
#   FLEET=config/sim/fleet.yaml   the fleet file (both sides)
#   TRACE=../shared/traces/mooncake/conversation_trace.jsonl
#   LIMIT=480 LOAD=0.8            the slice and the offered load (× calibrated capacity)
#   POLICIES="predicted_ttft cache_aware round_robin"
#   OUT=DIR                       default target/live-vs-offline/<UTC time>
#   BIN=PATH                      pronto (default target/release/pronto, built unless SKIP_BUILD=1)
# Bounds checked (exit 1 when missed): live/offline mean within 15 %, p90 within 25 %, the
# same ordering by mean.
set -euo pipefail
cd "$(dirname "$0")/.."
FLEET=${FLEET:-config/sim/fleet.yaml}
TRACE=${TRACE:-../shared/traces/mooncake/conversation_trace.jsonl}
LIMIT=${LIMIT:-480}
LOAD=${LOAD:-0.8}
POLICIES=${POLICIES:-predicted_ttft cache_aware round_robin}
BIN=${BIN:-target/release/pronto}
OUT=${OUT:-target/live-vs-offline/$(date -u +%Y%m%dT%H%M%SZ)}
[[ -f $TRACE ]] || { echo "live-vs-offline: $TRACE not found" >&2; exit 1; }
if [[ -z "${SKIP_BUILD:-}" ]]; then cargo build --release --locked --bin pronto; fi
mkdir -p "$OUT"

args=()
for p in $POLICIES; do args+=(--policy "$p"); done
"$BIN" evaluate --trace "$TRACE" --fleet "$FLEET" --limit "$LIMIT" --load "$LOAD" "${args[@]}" \
    --json >"$OUT/offline.json"

contenders=""
for p in $POLICIES; do contenders+="pronto:$p "; done
FLEET=$FLEET TRACE=$TRACE LIMIT=$LIMIT LOAD=$LOAD CONTENDERS=$contenders BIN=$BIN SKIP_BUILD=1 \
    OUT="$OUT/live" BASELINE="pronto round_robin" ./scripts/compare-routers.sh >"$OUT/live.log" 2>&1 ||
    { echo "live-vs-offline: compare-routers failed (see $OUT/live.log)" >&2; exit 1; }

python3 - "$OUT" "$FLEET" "$LIMIT" "$LOAD" $POLICIES <<'PY'
import json, sys
out, fleet, limit, load, *policies = sys.argv[1:]
offline = {r["policy"]: r for r in json.load(open(f"{out}/offline.json"))["runs"]}
rows, ok = [], True
for p in policies:
    live = json.load(open(f"{out}/live/pronto-{p}/summary.json"))
    o = offline[p]
    rm = live["ttft_mean_ms"] / o["ttft_mean_ms"]
    r9 = live["ttft_p90_ms"] / o["ttft_p90_ms"]
    good = abs(rm - 1) <= 0.15 and abs(r9 - 1) <= 0.25
    ok &= good
    rows.append((p, o["ttft_mean_ms"], o["ttft_p90_ms"], live["ttft_mean_ms"], live["ttft_p90_ms"],
                 rm, r9, live["errors"], good))
order_off = sorted(policies, key=lambda p: offline[p]["ttft_mean_ms"])
order_live = sorted(policies, key=lambda p: [r for r in rows if r[0] == p][0][3])
ok &= order_off == order_live
print(f"Live vs offline: first {limit} requests of the Mooncake conversation trace at "
      f"{load} × capacity on {fleet}; TTFT mean / p90 ms.\n")
print("| policy | offline | live | live ÷ offline | live errors | within bounds |")
print("| --- | --- | --- | --- | ---: | --- |")
for p, om, o9, lm, l9, rm, r9, err, good in rows:
    print(f"| {p} | {om:.0f} / {o9:.0f} | {lm:.0f} / {l9:.0f} | {rm:.2f} / {r9:.2f} | {err} | "
          f"{'yes' if good else 'NO'} |")
print(f"\nOrdering by mean: offline {' < '.join(order_off)}; live {' < '.join(order_live)}"
      f" ({'same' if order_off == order_live else 'DIFFERENT'}).")
sys.exit(0 if ok else 1)
PY
