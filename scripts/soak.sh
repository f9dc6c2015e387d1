#!/usr/bin/env bash
# Soak: the gateway in front of a simulated fleet for MINUTES (default 30) under the synthetic
# workload, with periodic backend crashes (the fleet's crash_after/crash_every knobs), a
# config reload (POST /admin/reload) every RELOAD_EVERY seconds, and, mixed into the normal
# traffic for the whole run, hostile clients (scripts/soak_hostile.py: the framing suite and a
# few malformed requests every HOSTILE_EVERY seconds) and stalled readers
# (scripts/soak_stalled.py: STALL_READERS clients that never read their stream, every
# STALL_EVERY seconds). Samples the gateway's RSS every 10 s; scripts/soak_summary.py prints
# (and writes to OUT/summary.md) the normal requests and errors per 5-minute window, every
# hostile case and how it ended, the stalled readers released, RSS start/peak/end;
# scripts/soak_plot.py draws OUT/soak.svg. Exits non-zero when a normal request was lost, a
# hostile case ended otherwise than expected, a stalled reader was not released, or the
# gateway died.
#   scripts/soak.sh [MINUTES]      env: PRONTO (binary), LOAD (default 0.8: the fraction of the
#   fleet's calibrated capacity offered, see `pronto replay --load`), LOAD_SCALE (overrides LOAD
#   with a fixed `--load-scale`), BACKENDS (4), RELOAD_EVERY (60), HOSTILE_EVERY (60),
#   STALL_EVERY (120), STALL_READERS (20; 0: none), OUT
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-30}"
pronto="${PRONTO:-target/debug/pronto}"
load="${LOAD:-0.8}"
n="${BACKENDS:-4}"
reload_every="${RELOAD_EVERY:-60}"
hostile_every="${HOSTILE_EVERY:-60}"
stall_every="${STALL_EVERY:-120}"
stall_readers="${STALL_READERS:-20}"
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
curl -sf "http://127.0.0.1:$((port + 1))/readyz" >/dev/null || { echo "soak: the gateway did not start" >&2; cat "$out/gateway.log" >&2; exit 2; }
start=$(date +%s)
until=$((start + minutes * 60))
echo "0 $(awk '/VmRSS/ {print $2}' /proc/$gw/status)" > "$out/rss.txt"
( while sleep 10; do
    echo "$(( $(date +%s) - start )) $(awk '/VmRSS/ {print $2}' /proc/$gw/status)" >> "$out/rss.txt"
  done ) & pids+=($!)
mixed=()
if [ "$hostile_every" != 0 ]; then
  python3 scripts/soak_hostile.py --target "127.0.0.1:$port" --model sim-model --start "$start" \
    --until "$until" --every "$hostile_every" --out "$out/hostile.jsonl" >"$out/hostile.log" 2>&1 & mixed+=($!); pids+=($!)
fi
if [ "$stall_readers" != 0 ]; then
  python3 scripts/soak_stalled.py --target "127.0.0.1:$port" --admin "127.0.0.1:$((port + 1))" \
    --model sim-model --start "$start" --until "$until" --every "$stall_every" \
    --readers "$stall_readers" --out "$out/stalled.jsonl" >"$out/stalled.log" 2>&1 & mixed+=($!); pids+=($!)
fi
( while sleep "$reload_every"; do
    touch "$out/pronto.yaml"
    curl -s -o /dev/null -w "reload %{http_code}\n" -X POST "http://127.0.0.1:$((port + 1))/admin/reload" >> "$out/reloads.txt"
  done ) & pids+=($!)
if [ -n "${LOAD_SCALE:-}" ]; then rate=(--load-scale "$LOAD_SCALE"); else rate=(--load "$load" --fleet "$out/fleet.yaml"); fi
echo "soak: ${minutes} min at ${rate[*]} against $n backends; output in $out"
"$pronto" replay --target "http://127.0.0.1:$port" --model sim-model "${rate[@]}" \
  --conversations 100000 --duration "${minutes}m" --out "$out/replay" > "$out/replay.log" 2>&1 || true
# The mixed-in clients stop starting passes and batches before the end; let the last finish.
for p in "${mixed[@]}"; do wait "$p" || echo "soak: a mixed-in client exited with $?" >&2; done
awk '/VmHWM/ {print $2}' /proc/$gw/status > "$out/vmhwm.txt"
curl -s "http://127.0.0.1:$((port + 1))/metrics" > "$out/metrics-end.txt" || true
kill -0 "$gw" 2>/dev/null && echo up > "$out/gateway-state.txt" || echo died > "$out/gateway-state.txt"
status=0
python3 scripts/soak_summary.py "$out" | tee "$out/summary.md" || status=1
python3 scripts/soak_plot.py "$out" || true
exit $status
