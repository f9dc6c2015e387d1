#!/usr/bin/env bash
# The hostile-input and fault report (docs/reliability.md): a release gateway in front of
# simulated fleets — a healthy one, a fast one (time scale 0.01) for the slow-reader case, one
# at time scale 0.0001 for the upload case, and one per backend fault (crash mid-stream, 5xx
# burst, flapping, all down), a nats-server with authorization and a replica, and (started by
# scripts/hostile_edge.py) two gateways with API keys, rate limits and SLO routes in front of
# recording backends — driven by scripts/hostile.py through every case; prints one
# Markdown table (case, expected, seen, requests lost, peak RSS) and exits non-zero when a
# case is unexpected or a request is lost.
#   scripts/hostile.sh            env: PRONTO (default target/release/pronto), OUT
set -euo pipefail
cd "$(dirname "$0")/.."
pronto="${PRONTO:-target/release/pronto}"
[ -x "$pronto" ] || { echo "hostile: $pronto not built (cargo build --release --bin pronto)" >&2; exit 2; }
out="${OUT:-$(mktemp -d /tmp/pronto-hostile.XXXX)}"
mkdir -p "$out"
port=$((20000 + RANDOM % 20000))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# fleet NAME MODEL SCALE FIRST_PORT "FAULTS0" "FAULTS1" [KV_BLOCKS]: a two-backend fleet file.
fleet() {
  local name=$1 model=$2 first=$4 f0=$5 f1=$6 blocks=${7:-}
  {
    echo "model: $model"
    echo "backends:"
    for i in 0 1; do
      local f extra=""
      f=$([ $i = 0 ] && echo "$f0" || echo "$f1")
      [ -n "$blocks" ] && extra="$extra, num_kv_blocks: $blocks"
      [ -n "$f" ] && extra="$extra, faults: {$f}"
      echo "  - {name: $name-b$i, profile: h100-llama3-8b, port: $((first + i))$extra}"
    done
  } > "$out/fleet-$name.yaml"
}
fleet main sim-model 1 $((port + 10)) "" ""
fleet fast fast-model 0.01 $((port + 20)) "" ""
fleet upload upload-model 0.0001 $((port + 70)) "" "" 400000
fleet crash crash-model 1 $((port + 30)) "crash_after: 3s, crash_every: 3s, restart_after: 1s" ""
fleet errors errors-model 1 $((port + 40)) "error_rate: 1.0" ""
fleet flap flap-model 1 $((port + 50)) "crash_after: 1s, crash_every: 3s, restart_after: 1s" ""
fleet down down-model 1 $((port + 60)) "" ""
for f in main crash errors flap; do
  "$pronto" sim-fleet --config "$out/fleet-$f.yaml" >"$out/fleet-$f.log" 2>&1 & pids+=($!)
done
"$pronto" sim-fleet --config "$out/fleet-fast.yaml" --time-scale 0.01 >"$out/fleet-fast.log" 2>&1 & pids+=($!)
# 2 MiB prompts (~500k tokens) prefill in milliseconds: the upload case is about memory.
"$pronto" sim-fleet --config "$out/fleet-upload.yaml" --time-scale 0.0001 >"$out/fleet-upload.log" 2>&1 & pids+=($!)

{
  echo "listen: 127.0.0.1:$port"
  echo "admin_listen: 127.0.0.1:$((port + 1))"
  echo "threads: 2"
  echo "limits:"
  echo "  max_body_bytes: 4MiB"
  echo "  header_timeout: 1s"
  echo "  body_timeout: 2s"
  echo "  write_timeout: 1s"
  echo "  keepalive_timeout: 2s"
  echo "  request_timeout: 2s"
  echo "  max_connections: 64"
  echo "  max_buffered_bytes: 8MiB"
  echo "retry: {max_retries: 2}"
  echo "health: {interval: 500ms, timeout: 400ms, eject_after_failures: 2, readmit_after: 2s}"
  echo "pools:"
  for f in main fast upload crash errors flap down; do
    model=$(awk '/^model:/ {print $2}' "$out/fleet-$f.yaml")
    echo "  $model:"
    echo "    policy: least_inflight"
    echo "    backends:"
    for i in 0 1; do
      p=$(grep -o "port: [0-9]*" "$out/fleet-$f.yaml" | sed -n "$((i + 1))p" | cut -d' ' -f2)
      # The fast fleet's first backend is the one the slow-reader case watches.
      name=$([ "$f" = main ] && echo "b$i" || echo "$f-b$i")
      echo "      - {name: $name, url: 'http://127.0.0.1:$p'}"
    done
  done
} > "$out/pronto.yaml"
# Every fleet up before the gateway starts (the down fleet is started by the case itself).
for f in main fast upload crash errors flap; do
  p=$(grep -o "port: [0-9]*" "$out/fleet-$f.yaml" | sed -n 2p | cut -d' ' -f2)
  for _ in $(seq 150); do curl -sf "http://127.0.0.1:$p/health" >/dev/null && break; sleep 0.2; done
  curl -sf "http://127.0.0.1:$p/health" >/dev/null || { echo "hostile: fleet $f did not start:" >&2; cat "$out/fleet-$f.log" >&2; exit 2; }
done
"$pronto" serve --config "$out/pronto.yaml" >"$out/gateway.log" 2>&1 & gw=$!; pids+=($gw)
for _ in $(seq 150); do curl -sf "http://127.0.0.1:$((port + 1))/readyz" >/dev/null && break; sleep 0.2; done
sleep 1

# === The replica channel (issue 42): a NATS that admits only the replicas, and one replica ===
# nats-server with one user (a fresh password, only the cluster's subjects) and a second
# gateway that syncs through it; hostile.py's "replica channel" cases read $out/nats.json.
nats_bin=$(command -v nats-server || { [ -x /usr/sbin/nats-server ] && echo /usr/sbin/nats-server; } || true)
if [ -n "$nats_bin" ]; then
  nats_port=$((port + 80)) replica_port=$((port + 90))
  echo "replica-$RANDOM$RANDOM$RANDOM" > "$out/nats-password"
  cat > "$out/nats.conf" <<NATS
authorization {
  users = [
    { user: pronto, password: "$(cat "$out/nats-password")",
      permissions: { publish: "pronto.cluster.*", subscribe: "pronto.cluster.*" } }
  ]
}
NATS
  "$nats_bin" -c "$out/nats.conf" -a 127.0.0.1 -p "$nats_port" >"$out/nats.log" 2>&1 & pids+=($!)
  {
    echo "listen: 127.0.0.1:$replica_port"
    echo "admin_listen: 127.0.0.1:$((replica_port + 1))"
    echo "cluster:"
    echo "  nats: nats://127.0.0.1:$nats_port"
    echo "  replica: hostile-replica"
    echo "  auth: {user: pronto, password: {file: $out/nats-password}}"
    echo "pools:"
    echo "  sim-model:"
    echo "    backends: [{name: b0, url: 'http://127.0.0.1:$((port + 10))'}]"
  } > "$out/replica.yaml"
  "$pronto" serve --config "$out/replica.yaml" >"$out/replica.log" 2>&1 & pids+=($!)
  for _ in $(seq 150); do curl -sf "http://127.0.0.1:$((replica_port + 1))/readyz" >/dev/null && break; sleep 0.2; done
  echo "{\"nats_port\": $nats_port, \"replica_admin_port\": $((replica_port + 1))}" > "$out/nats.json"
fi

python3 - "$out" "$port" "$gw" "$pronto" <<'PY' > "$out/config.json"
import json, sys
out, port, gw, pronto = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print(json.dumps({
    "port": port, "admin_port": port + 1, "pid": gw,
    "model": "sim-model", "fast_model": "fast-model", "upload_model": "upload-model",
    "crash_model": "crash-model",
    "errors_model": "errors-model", "flap_model": "flap-model", "down_model": "down-model",
    "down_fleet_cmd": [pronto, "sim-fleet", "--config", f"{out}/fleet-down.yaml"],
    "pronto": pronto, "out": out,
    "limits": {"write_timeout": "1s", "header_timeout": "1s", "body_timeout": "2s", "keepalive_timeout": "2s",
               "request_timeout": "2s", "max_connections": 64, "max_buffered_bytes": "8MiB"},
}))
PY
echo "hostile: $("$pronto" --version) against simulated fleets; output in $out"
status=0
python3 scripts/hostile.py "$out/config.json" | tee "$out/report.md" || status=$?
kill -0 "$gw" 2>/dev/null && echo "the gateway is still up (pid $gw)" || { echo "the gateway died"; status=1; }
exit $status
