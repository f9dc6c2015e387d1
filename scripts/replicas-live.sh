#!/usr/bin/env bash
# Several Pronto replicas live (issue 19): nats-server, a simulated fleet and Pronto replicas on
# loopback; one Mooncake trace slice spread round robin across the replicas (`pronto replay
# --target A,B,C`), in three scenarios, each in front of a FRESH fleet:
#   one              one replica
#   synced           REPLICAS replicas with `cluster:` over NATS (collision repair on: the default)
#   synced-norepair  the same with `cluster.collision_repair: off` (not in the default SCENARIOS)
#   unsynced         REPLICAS replicas, each on its own state
# Prints TTFT (mean / p90 / p99), errors and the prefix-cache hit ratio per scenario; for the
# synced one the sync traffic per request (pronto_cluster_bytes_total) and the CPU it costs
# (pronto_cluster_work_seconds_total, and each scenario's replica CPU from /proc).
#
# Usage: ./scripts/replicas-live.sh
# Environment (all optional):
#   TRACE=../shared/traces/mooncake/conversation_trace.jsonl   LIMIT=480   LOAD=0.8
#   REPLICAS=3  BACKENDS=8  PROFILE=h100-llama3-8b  KV_BLOCKS=24000  POLICY=predicted_ttft
#   SCENARIOS="one synced unsynced" (any of the four above, in order)
#   SYNC_DELAY=MS: each synced replica reaches NATS through its own relay delaying MS/2 each
#     way (scripts/lib/delay_relay.py), so replicas hear each other MS late (default 0: direct)
#   OUT=DIR (default target/replicas-live/<UTC time>)
#   BIN=PATH pronto (default target/release/pronto, built unless SKIP_BUILD=1)
#   SUMMARIZE=1: run nothing, print the summary of the runs already in OUT (with the same
#     SCENARIOS, TRACE and SYNC_DELAY)
#   NATS=PATH nats-server (default: on PATH, else /usr/sbin/nats-server)
set -euo pipefail
cd "$(dirname "$0")/.."
# Children never read the terminal (a background job that does is stopped by job control).
TRACE=${TRACE:-../shared/traces/mooncake/conversation_trace.jsonl}
LIMIT=${LIMIT:-480}
LOAD=${LOAD:-0.8}
REPLICAS=${REPLICAS:-3}
BACKENDS=${BACKENDS:-8}
PROFILE=${PROFILE:-h100-llama3-8b}
KV_BLOCKS=${KV_BLOCKS:-24000}
POLICY=${POLICY:-predicted_ttft}
SCENARIOS=${SCENARIOS:-one synced unsynced}
SYNC_DELAY=${SYNC_DELAY:-0}
MODEL=llama-3-8b
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/pronto}
OUT=${OUT:-target/replicas-live/$(date -u +%Y%m%dT%H%M%SZ)}
NATS=${NATS:-$(command -v nats-server || echo /usr/sbin/nats-server)}
CLK_TCK=$(getconf CLK_TCK)
[[ -f $TRACE ]] || { echo "replicas-live: $TRACE not found" >&2; exit 1; }
[[ -x $NATS ]] || { echo "replicas-live: nats-server not found (apt-get install nats-server)" >&2; exit 1; }
if [[ -z "${SKIP_BUILD:-}${SUMMARIZE:-}" ]]; then cargo build --release --locked --bin pronto; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

PIDS=()
stop_all() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
trap 'stop_all; [[ -n ${NATS_PID:-} ]] && kill "$NATS_PID" 2>/dev/null; true' EXIT
trap 'exit 130' INT TERM
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 20000))
        listening "$p" || { echo "$p"; return; }
    done
    echo "replicas-live: no free port" >&2; return 1
}
cpu_s() { awk -v hz="$CLK_TCK" '{ sub(/^.*\) /, ""); printf "%.2f\n", ($12 + $13) / hz }' "/proc/$1/stat"; }

# The fleet file the capacity calibration of `replay --load` reads (the same engines).
fleet_file=$OUT/fleet.yaml
{
    echo "model: $MODEL"
    echo "backends:"
    for i in $(seq 0 $((BACKENDS - 1))); do
        echo "  - { name: b$i, profile: $PROFILE, num_kv_blocks: $KV_BLOCKS, port: $((9000 + i)) }"
    done
} >"$fleet_file"

if [[ -z ${SUMMARIZE:-} ]]; then
    nats_port=$(free_port)
    "$NATS" -a 127.0.0.1 -p "$nats_port" </dev/null >"$OUT/nats.log" 2>&1 &
    NATS_PID=$!
    for _ in $(seq 100); do listening "$nats_port" && break; sleep 0.1; done
    listening "$nats_port" || { echo "replicas-live: nats-server did not start" >&2; exit 1; }
fi

run_scenario() { # name replicas synced(0/1) [cluster settings]
    local name=$1 n=$2 synced=$3 extra=${4:-} dir="$OUT/$1"
    mkdir -p "$dir"
    RUST_LOG=warn "$BIN" sim-fleet --backends "$BACKENDS" --profile "$PROFILE" --base-port 0 \
        --num-kv-blocks "$KV_BLOCKS" --model "$MODEL" </dev/null >"$dir/fleet.log" 2>&1 &
    local fleet_pid=$!
    PIDS+=("$fleet_pid")
    for _ in $(seq 300); do
        grep -E $'^[^\t]+\thttp://[^\t]+\t' "$dir/fleet.log" >"$dir/fleet.tsv" 2>/dev/null || true
        [[ $(wc -l <"$dir/fleet.tsv") -ge $BACKENDS ]] && break
        sleep 0.1
    done
    [[ $(wc -l <"$dir/fleet.tsv") -ge $BACKENDS ]] || { echo "replicas-live: sim-fleet not up" >&2; exit 1; }
    local backends=""
    while IFS=$'\t' read -r bname burl _; do
        backends+="      - { name: $bname, url: \"$burl\" }"$'\n'
    done <"$dir/fleet.tsv"
    local targets="" admins=() pids=()
    for r in $(seq 0 $((n - 1))); do
        local port admin cluster=""
        if [[ $synced == 1 ]]; then
            local via=$nats_port
            if [[ $SYNC_DELAY != 0 ]]; then
                # Listening before the replica's own ports are picked, so they differ.
                via=$(free_port)
                python3 scripts/lib/delay_relay.py "$via" "$nats_port" \
                    "$(awk -v d="$SYNC_DELAY" 'BEGIN { print d / 2 }')" </dev/null >"$dir/relay-$r.log" 2>&1 &
                PIDS+=($!)
                for _ in $(seq 100); do listening "$via" && break; sleep 0.1; done
            fi
            cluster="cluster: { nats: \"nats://127.0.0.1:$via\", subject: \"pronto.$name\", replica: r$r$extra }"
        fi
        port=$(free_port); admin=$(free_port)
        [[ $admin != "$port" ]] || admin=$(free_port)
        cat >"$dir/pronto-$r.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin
threads: 2
$cluster
pools:
  $MODEL:
    policy: $POLICY
    backends:
$backends
EOF
        RUST_LOG=warn "$BIN" serve --config "$dir/pronto-$r.yaml" </dev/null >"$dir/router-$r.log" 2>&1 &
        pids+=($!); PIDS+=($!)
        admins+=("$admin")
        targets+="${targets:+,}http://127.0.0.1:$port"
        for _ in $(seq 300); do
            curl -sf -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && break
            sleep 0.1
        done
        curl -sf -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 ||
            { echo "replicas-live: replica r$r did not start (see $dir/router-$r.log)" >&2; exit 1; }
    done
    if [[ $synced == 1 ]]; then
        # Every replica hears the others before the load starts.
        for a in "${admins[@]}"; do
            for _ in $(seq 100); do
                curl -s "http://127.0.0.1:$a/metrics" | grep -q "^pronto_cluster_peers $((n - 1))\$" && break
                sleep 0.1
            done
        done
    fi
    local cpu0=0 c
    for p in "${pids[@]}"; do c=$(cpu_s "$p"); cpu0=$(awk -v a="$cpu0" -v b="$c" 'BEGIN { print a + b }'); done
    echo "replicas-live: $name: $n replica(s) at $targets" >&2
    local sampler=""
    if [[ $synced == 1 ]]; then
        # What each replica has not heard of yet, sampled every 2 s while the load runs.
        (while :; do
            for a in "${admins[@]}"; do
                curl -s "http://127.0.0.1:$a/metrics" | awk '/^pronto_cluster_unseen_dispatches /{ print $2 }'
            done
            sleep 2
        done) >"$dir/unseen.txt" 2>/dev/null &
        sampler=$!; PIDS+=("$sampler")
    fi
    "$BIN" replay --target "$targets" --model "$MODEL" --trace "$TRACE" --spread --limit "$LIMIT" \
        --load "$LOAD" --fleet "$fleet_file" --seed 1 --out "$dir" </dev/null 2>"$dir/replay.log" ||
        echo "replicas-live: $name: replay exited non-zero (see replay.log)" >&2
    if [[ -n $sampler ]]; then kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; fi
    local cpu1=0
    for p in "${pids[@]}"; do c=$(cpu_s "$p"); cpu1=$(awk -v a="$cpu1" -v b="$c" 'BEGIN { print a + b }'); done
    : >"$dir/metrics.txt"
    for a in "${admins[@]}"; do curl -s "http://127.0.0.1:$a/metrics" | grep '^pronto_cluster' >>"$dir/metrics.txt" || true; done
    echo "{\"replicas\": $n, \"synced\": $synced, \"sync_delay_ms\": $((synced ? SYNC_DELAY : 0)), \"cpu_s\": $(awk -v a="$cpu1" -v b="$cpu0" 'BEGIN { printf "%.2f", a - b }')}" >"$dir/scenario.json"
    stop_all
}

for s in $SCENARIOS; do
    [[ -n ${SUMMARIZE:-} ]] && break
    case $s in
        one) run_scenario one 1 0 ;;
        synced) run_scenario synced "$REPLICAS" 1 ;;
        synced-norepair) run_scenario synced-norepair "$REPLICAS" 1 ", collision_repair: off" ;;
        unsynced) run_scenario unsynced "$REPLICAS" 0 ;;
        *) echo "replicas-live: unknown scenario $s" >&2; exit 2 ;;
    esac
done

python3 - "$OUT" "$LIMIT" "$LOAD" "$REPLICAS" "$BACKENDS" "$PROFILE" "$SCENARIOS" "$SYNC_DELAY" \
    "$(basename "$TRACE" .jsonl)" <<'PY'
import json, sys
out, limit, load, n, backends, profile, scenarios, delay_ms, trace = sys.argv[1:]
rows = {}
for s in scenarios.split():
    summ = json.load(open(f"{out}/{s}/summary.json"))
    scen = json.load(open(f"{out}/{s}/scenario.json"))
    metrics = {}
    for line in open(f"{out}/{s}/metrics.txt"):
        k, v = line.rsplit(" ", 1)
        metrics[k] = metrics.get(k, 0.0) + float(v)
    rows[s] = (summ, scen, metrics)
one = rows["one"][0] if "one" in rows else None
link = (f"; each synced replica reaches NATS through a relay delaying {float(delay_ms) / 2:g} ms "
        f"each way (replicas hear each other {delay_ms} ms late)" if delay_ms != "0" else "")
print(f"Live: {n} Pronto replicas vs one; first {limit} requests of {trace} "
      f"(ties spread), spread round robin across the replicas, at {load} × the capacity of "
      f"{backends} × sim-fleet {profile}; a fresh fleet per scenario{link}.\n")
print("| scenario | TTFT mean / p90 / p99 ms | mean × one | p99 × one | errors | cached token ratio | replicas' CPU s |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for s, (summ, scen, _) in rows.items():
    mean_x = f"{summ['ttft_mean_ms'] / one['ttft_mean_ms']:.2f}" if one else "—"
    p99_x = f"{summ['ttft_p99_ms'] / one['ttft_p99_ms']:.2f}" if one else "—"
    print(f"| {s} ({scen['replicas']}) | {summ['ttft_mean_ms']:.0f} / {summ['ttft_p90_ms']:.0f} / "
          f"{summ['ttft_p99_ms']:.0f} | {mean_x} | {p99_x} | {summ['errors']} | "
          f"{summ['cached_token_ratio'] or 0:.3f} | {scen['cpu_s']:.1f} |")
for s in ("synced", "synced-norepair"):
    if s not in rows:
        continue
    summ, scen, m = rows[s]
    reqs = summ["requests"]
    sent = m.get('pronto_cluster_bytes_total{direction="sent"}', 0.0)
    recv = m.get('pronto_cluster_bytes_total{direction="received"}', 0.0)
    msgs = m.get('pronto_cluster_messages_total{direction="sent"}', 0.0)
    work = (m.get('pronto_cluster_work_seconds_total{direction="sent"}', 0.0)
            + m.get('pronto_cluster_work_seconds_total{direction="received"}', 0.0))
    dropped = sum(v for k, v in m.items() if k.startswith("pronto_cluster_dropped_total"))
    versus = (f"; replicas' CPU {s} {scen['cpu_s']:.1f} s vs unsynced {rows['unsynced'][1]['cpu_s']:.1f} s"
              if "unsynced" in rows else "")
    print(f"\nSync traffic ({s}): {sent / reqs:.0f} bytes published per request ({msgs:.0f} messages, "
          f"{sent / max(msgs, 1):.0f} bytes each), {recv / reqs:.0f} bytes received per request over "
          f"all replicas; {dropped:.0f} events dropped or unapplied. Sync tasks' time: {work:.2f} s over "
          f"all replicas ({work / reqs * 1e6:.0f} µs per request){versus}.")
    # Gauges: the metrics file sums them over the replicas.
    delay = m.get('pronto_cluster_sync_delay_seconds', 0.0) / int(n)
    unseen = m.get('pronto_cluster_unseen_dispatches', 0.0) / int(n)
    samples = [float(v) for v in open(f"{out}/{s}/unseen.txt").read().split()]
    during = (f"mean {sum(samples) / len(samples):.4f}, max {max(samples):.4f} over {len(samples)} "
              f"samples" if samples else "no samples")
    print(f"\nSync delay ({s}; each replica timing its own messages back through NATS; the mean of "
          f"the replicas' moving averages as the run ended): {delay * 1e3:.3f} ms. The other "
          f"replicas' dispatches a decision had not heard of yet (pronto_cluster_unseen_dispatches), "
          f"each replica sampled every 2 s during the load: {during}; {unseen:.4f} as the run ended.")
    moved = m.get('pronto_cluster_collisions_total{outcome="moved"}', 0.0)
    stayed = m.get('pronto_cluster_collisions_total{outcome="stayed"}', 0.0)
    print(f"\nCollision repair ({s}; pronto_cluster_collisions_total over all replicas): "
          f"{moved:.0f} requests moved, {stayed:.0f} reconsidered and stayed.")
PY
