#!/usr/bin/env bash
# Soak: the gateway in front of a simulated fleet for MINUTES (default 30) under the synthetic
# workload, with periodic backend crashes (the fleet's crash_after/crash_every knobs) and a
# config reload (POST /admin/reload) every RELOAD_EVERY seconds. Samples the gateway's RSS
# every 10 s; prints the error rate and p99 TTFT per 5-minute window and RSS over time.
#   scripts/soak.sh [MINUTES]      env: PRONTO (binary), LOAD (default 0.8: the fraction of the
#   fleet's calibrated capacity offered, see `pronto replay --load`), LOAD_SCALE (overrides LOAD
#   with a fixed `--load-scale`), BACKENDS (4), RELOAD_EVERY (60), OUT
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-30}"
pronto="${PRONTO:-target/debug/pronto}"
load="${LOAD:-0.8}"
n="${BACKENDS:-4}"
reload_every="${RELOAD_EVERY:-60}"
out="${OUT:-$(mktemp -d /tmp/pronto-soak.XXXX)}"
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))
{
  echo "model: sim-model"
  echo "backends:"
  for i in $(seq 0 $((n - 1))); do
    faults=""
    [ "$i" = 0 ] && faults=", faults: {crash_after: 60s, crash_every: 120s, restart_after: 5s}"
    echo "  - {name: b$i, profile: h100-llama3-8b, port: $((port + 10 + i))$faults}"
  done
} > "$out/fleet.yaml"
{
  echo "listen: 127.0.0.1:$port"
  echo "admin_listen: 127.0.0.1:$((port + 1))"
  echo "threads: 2"
  echo "health: {interval: 1s, eject_after_failures: 3, readmit_after: 5s}"
  echo "pools:"
  echo "  sim-model:"
  echo "    backends:"
  for i in $(seq 0 $((n - 1))); do
    echo "      - {name: b$i, url: 'http://127.0.0.1:$((port + 10 + i))'}"
  done
} > "$out/pronto.yaml"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"$pronto" sim-fleet --config "$out/fleet.yaml" >"$out/fleet.log" 2>&1 & pids+=($!)
"$pronto" serve --config "$out/pronto.yaml" >"$out/gateway.log" 2>&1 & gw=$!; pids+=($gw)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((port + 1))/readyz" >/dev/null && break; sleep 0.2; done
start=$(date +%s)
( while sleep 10; do
    echo "$(( $(date +%s) - start )) $(awk '/VmRSS/ {print $2}' /proc/$gw/status)" >> "$out/rss.txt"
  done ) & pids+=($!)
( while sleep "$reload_every"; do
    touch "$out/pronto.yaml"
    curl -s -o /dev/null -w "reload %{http_code}\n" -X POST "http://127.0.0.1:$((port + 1))/admin/reload" >> "$out/reloads.txt"
  done ) & pids+=($!)
if [ -n "${LOAD_SCALE:-}" ]; then rate=(--load-scale "$LOAD_SCALE"); else rate=(--load "$load" --fleet "$out/fleet.yaml"); fi
echo "soak: ${minutes} min at ${rate[*]} against $n backends; output in $out"
"$pronto" replay --target "http://127.0.0.1:$port" --model sim-model "${rate[@]}" \
  --conversations 100000 --duration "${minutes}m" --out "$out/replay" > "$out/replay.log" 2>&1 || true
python3 - "$out" <<'PY'
import json, sys, collections
out = sys.argv[1]
win = collections.defaultdict(list)
for line in open(f"{out}/replay/results.jsonl"):
    r = json.loads(line)
    win[int(r["scheduled_s"] // 300)].append(r)
print("window  requests  errors  error%   p99 TTFT ms")
for w in sorted(win):
    rs = win[w]
    errs = sum(1 for r in rs if r.get("status") != 200)
    t = sorted(r["ttft_ms"] for r in rs if r.get("ttft_ms") is not None)
    p99 = t[min(len(t) - 1, int(0.99 * len(t)))] if t else float("nan")
    print(f"{w*5:>3}-{w*5+5:<3} {len(rs):>9} {errs:>7} {100*errs/max(1,len(rs)):6.2f}  {p99:10.1f}")
rss = [l.split() for l in open(f"{out}/rss.txt")] if __import__("os").path.exists(f"{out}/rss.txt") else []
print("RSS (s: KiB):", " ".join(f"{s}:{k}" for s, k in rss))
if rss:
    ks = [int(k) for _, k in rss]
    print(f"RSS first {ks[0]} KiB, max {max(ks)} KiB, last {ks[-1]} KiB")
try:
    print(open(f"{out}/reloads.txt").read().count("reload 200"), "reloads OK")
except OSError:
    print("0 reloads")
PY
python3 scripts/soak_plot.py "$out" || true
