#!/usr/bin/env bash
# Small-request latency while 10 MiB prompts arrive: does a huge body stall the proxy thread
# that parses it? For each binary given (default: the release build), starts a simulated fleet
# and the gateway (2 proxy threads), sends LARGE_CLIENTS loops of 10 MiB chat prompts, and
# meanwhile SMALL sequential small requests; prints p50 / p99 / max of the small requests'
# latency with and without the large ones, one row per binary, side by side in one run.
#   scripts/large-prompts.sh [BINARY...]   env: SMALL (400), LARGE_CLIENTS (2), LARGE_MIB (10)
# Compare a build from before a change with the current one:
#   scripts/large-prompts.sh /tmp/pronto-before target/release/pronto
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -eq 0 ] && bins=(target/release/pronto)
small="${SMALL:-400}"
large_clients="${LARGE_CLIENTS:-2}"
large_mib="${LARGE_MIB:-10}"
out="$(mktemp -d /tmp/pronto-large.XXXX)"
python3 - "$out/large.json" "$large_mib" <<'PY'
import json, sys, random
random.seed(7)
words = [f"w{i}" for i in range(5000)]
n = int(sys.argv[2]) << 20
text = []
size = 0
while size < n - 200:
    w = random.choice(words)
    text.append(w)
    size += len(w) + 1
body = {"model": "sim-model", "max_tokens": 1, "messages": [{"role": "user", "content": " ".join(text)}]}
open(sys.argv[1], "w").write(json.dumps(body))
PY
cat > "$out/small.py" <<'PY'
import http.client, json, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = http.client.HTTPConnection(host, port, timeout=60)
lat, errors = [], 0
for i in range(n):
    body = json.dumps({"model": "sim-model", "max_tokens": 1, "stream": False,
                       "messages": [{"role": "user", "content": f"small request {i}"}]})
    t = time.perf_counter()
    try:
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        r = conn.getresponse(); r.read()
        if r.status != 200:
            errors += 1
    except Exception:
        errors += 1
        conn = http.client.HTTPConnection(host, port, timeout=60)
    lat.append((time.perf_counter() - t) * 1000)
    time.sleep(0.02)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print(f"{q(0.5):.1f} {q(0.99):.1f} {lat[-1]:.1f} {errors}")
PY
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))
{
  echo "model: sim-model"
  echo "backends:"
  for i in 0 1; do echo "  - {name: b$i, profile: h100-llama3-8b, port: $((port + 10 + i))}"; done
} > "$out/fleet.yaml"
"${bins[0]}" sim-fleet --config "$out/fleet.yaml" >"$out/fleet.log" 2>&1 & pids+=($!)
{
  echo "listen: 127.0.0.1:$port"
  echo "admin_listen: 127.0.0.1:$((port + 1))"
  echo "threads: 2"
  echo "limits: {max_body_bytes: 64MiB}"
  echo "pools:"
  echo "  sim-model:"
  echo "    backends:"
  for i in 0 1; do echo "      - {name: b$i, url: 'http://127.0.0.1:$((port + 10 + i))'}"; done
} > "$out/pronto.yaml"
printf "%-36s %-12s %9s %9s %9s %7s %s\n" binary large small_p50 small_p99 small_max errors large_sent
for bin in "${bins[@]}"; do
  "$bin" serve --config "$out/pronto.yaml" >"$out/gateway.log" 2>&1 & gw=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((port + 1))/readyz" >/dev/null && break; sleep 0.2; done
  for mode in none "$large_clients"; do
    loops=()
    if [ "$mode" != none ]; then
      : > "$out/large-count"
      for _ in $(seq "$mode"); do
        ( while true; do
            curl -s -o /dev/null -H 'content-type: application/json' \
              --data-binary @"$out/large.json" "http://127.0.0.1:$port/v1/chat/completions" || true
            echo . >> "$out/large-count"
          done ) & loops+=($!)
      done
      sleep 1
    fi
    read -r p50 p99 max errors < <(python3 "$out/small.py" 127.0.0.1 "$port" "$small")
    for l in "${loops[@]}"; do kill "$l" 2>/dev/null || true; done
    sent=$([ "$mode" = none ] && echo 0 || wc -l < "$out/large-count")
    label=$([ "$mode" = none ] && echo none || echo "${mode}x${large_mib}MiB")
    printf "%-36s %-12s %9s %9s %9s %7s %s\n" "$bin" "$label" "$p50" "$p99" "$max" "$errors" "$sent"
  done
  kill "$gw" 2>/dev/null || true
  wait "$gw" 2>/dev/null || true
done
echo "(latency in ms of sequential small non-streamed requests, 1 output token; output in $out)"
