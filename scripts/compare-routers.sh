#!/usr/bin/env bash
# Side-by-side router comparison: the same trace slice, at the same offered rate, through each
# contender in front of a FRESH simulated fleet; then one table and one TTFT CDF plot
# (`pronto compare-report`).
#
# Contenders (CONTENDERS, space-separated KIND:POLICY):
#   pronto:predicted_ttft pronto:cache_aware pronto:least_inflight pronto:round_robin
#   sglang:cache_aware sglang:power_of_two vllm:cache_aware
# and, opt-in, pronto:predicted_ttft+exact: the same policy with the exact prefix index, fed
# by KV-cache events the simulated engines publish (each backend gets a `kv_events` endpoint;
# the fleet is started with --kv-events-base-port). Compare it with pronto:predicted_ttft
# (the approximate index) in one run: CONTENDERS="pronto:predicted_ttft pronto:predicted_ttft+exact".
# A peer router that is not installed is installed with ../shared/peers/install-routers.sh
# into $PEERS (outside the repository); when that fails (no network) its rows say "skipped".
#
# Per contender: start `pronto sim-fleet` (BACKENDS backends, PROFILE, KV_BLOCKS KV blocks each,
# TIME_SCALE), start the router on free loopback ports, wait until it answers, run
# `pronto replay`, then read the router's CPU time (/proc/PID/stat utime+stime, children
# included; the seconds spent before it was ready are subtracted and recorded apart) and peak
# RSS (/proc/PID/status VmHWM) BEFORE stopping it, into DIR/router.json.
#
# Workload: the Mooncake conversation trace (TRACE), ties spread over their 3 s buckets, the
# first LIMIT requests, replayed at LOAD x the fleet's capacity. Capacity comes from
# `pronto evaluate --load` (a closed-loop calibration of the same engine model on this slice's
# request mix), divided by TIME_SCALE; LOAD_SCALE overrides the computed `--load-scale`.
# Without the trace file: the seeded synthetic workload at its own rate (said in the table).
#
# Usage: ./scripts/compare-routers.sh
# Environment (all optional):
#   OUT=DIR             results (default target/compare-routers/<UTC time>); one dir per contender
#   TRACE=FILE          default ../shared/traces/mooncake/conversation_trace.jsonl
#   LIMIT=480           trace requests (the default run: ~75 s of arrivals per contender)
#   LOAD=0.8            offered load as a fraction of fleet capacity
#   LOAD_SCALE=X        use this `pronto replay --load-scale` instead of the calibrated one
#   TIME_SCALE=1        simulated step-time multiplier
#   BACKENDS=8 PROFILE=h100-llama3-8b KV_BLOCKS=24000   the fleet
#   FLEET=FILE          a fleet file instead (e.g. config/sim/fleet-hetero.yaml: 4×H100 + 4×A100);
#                       its backends keep their profiles, KV blocks and ports
#   CONTENDERS="..."    subset / order of contenders (see above)
#   BASELINE="sglang cache_aware"   row the TTFT ratios are relative to
#   PEERS=DIR           peer venvs (default $HOME/.cache/pronto-peers)
#   BIN=PATH            pronto binary (default target/release/pronto, built unless SKIP_BUILD=1)
#   REPORT_BIN=PATH     binary with the `compare-report` subcommand (default: BIN)
#   REQUEST_TIMEOUT=5m  per-request limit of the replay
# Full size: LIMIT=12031 (the whole trace, ~1 h of arrivals at LOAD=0.8 per contender), or
# LIMIT=3000 for ~8 minutes each; see docs/benchmarks/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

TRACE=${TRACE:-../shared/traces/mooncake/conversation_trace.jsonl}
LIMIT=${LIMIT:-480}
LOAD=${LOAD:-0.8}
TIME_SCALE=${TIME_SCALE:-1}
BACKENDS=${BACKENDS:-8}
PROFILE=${PROFILE:-h100-llama3-8b}
KV_BLOCKS=${KV_BLOCKS:-24000}
CONTENDERS=${CONTENDERS:-pronto:predicted_ttft pronto:cache_aware pronto:least_inflight pronto:round_robin sglang:cache_aware sglang:power_of_two vllm:cache_aware}
BASELINE=${BASELINE:-sglang cache_aware}
PEERS=${PEERS:-$HOME/.cache/pronto-peers}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-5m}
MODEL=llama-3-8b
FLEET=${FLEET:-}
if [[ -n $FLEET ]]; then
    [[ -f $FLEET ]] || { echo "compare-routers: FLEET=$FLEET not found" >&2; exit 1; }
    BACKENDS=$(grep -cE '^ *- *\{ *name:' "$FLEET")
    FLEET_ARGS=(--config "$FLEET")
    FLEET_NOTE="$FLEET ($BACKENDS backends)"
else
    FLEET_ARGS=(--backends "$BACKENDS" --profile "$PROFILE" --base-port 0 --num-kv-blocks "$KV_BLOCKS")
    FLEET_NOTE="$BACKENDS × pronto sim-fleet $PROFILE, $KV_BLOCKS KV blocks of 16 tokens each"
fi
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/pronto}
REPORT_BIN=${REPORT_BIN:-$BIN}
OUT=${OUT:-target/compare-routers/$(date -u +%Y%m%dT%H%M%SZ)}
INSTALL_PEERS=../shared/peers/install-routers.sh
CLK_TCK=$(getconf CLK_TCK)

if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --release --locked --bin pronto
fi
[[ -x "$BIN" ]] || { echo "compare-routers: $BIN not found; run cargo build --release" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
[[ -x "$REPORT_BIN" ]] && REPORT_BIN=$(realpath "$REPORT_BIN")
START_S=$SECONDS

PIDS=()
stop_all() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
trap 'stop_all' EXIT
trap 'exit 130' INT TERM

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 20000))
        listening "$p" || { echo "$p"; return; }
    done
    echo "compare-routers: no free port" >&2; return 1
}

# --- the workload --------------------------------------------------------------------------
WORKLOAD_ARGS=()
if [[ -f "$TRACE" ]]; then
    WORKLOAD_ARGS=(--trace "$TRACE" --spread --limit "$LIMIT")
    if [[ -z "${LOAD_SCALE:-}" ]]; then
        fleet_file=${FLEET:-$OUT/fleet.yaml}
        [[ -n $FLEET ]] || {
            echo "model: $MODEL"
            echo "backends:"
            for i in $(seq 0 $((BACKENDS - 1))); do
                echo "  - { name: b$i, profile: $PROFILE, num_kv_blocks: $KV_BLOCKS, port: $((9000 + i)) }"
            done
        } >"$fleet_file"
        capacity=$("$BIN" evaluate --trace "$TRACE" --fleet "$fleet_file" --limit "$LIMIT" \
            --load "$LOAD" --policy round_robin --json |
            sed -n 's/.*"capacity_rps":\([0-9.e+-]*\).*/\1/p')
        [[ -n "$capacity" ]] || { echo "compare-routers: calibration failed" >&2; exit 1; }
        # The slice's span after spreading ties (as `pronto replay --spread` does): the last
        # request sits n/k of the way through its bucket of k equal timestamps.
        span=$(awk -v N="$LIMIT" '
            { match($0, /"timestamp": *[0-9]+/); t = substr($0, RSTART, RLENGTH)
              sub(/.*: */, "", t); ts[NR - 1] = t + 0 }
            NR > N && ts[NR - 1] > ts[N - 1] { next_t = ts[NR - 1]; exit }
            END {
              n = (N < NR ? N : NR); last = ts[n - 1]
              i = n - 1; while (i > 0 && ts[i - 1] == last) i--
              k = 0; for (j = i; (j in ts) && ts[j] == last; j++) k++
              gap = (next_t != "") ? next_t - last : (i > 0 ? last - ts[i - 1] : 0)
              printf "%.3f\n", (last + gap * (n - 1 - i) / k - ts[0]) / 1000 }' "$TRACE")
        LOAD_SCALE=$(awk -v c="$capacity" -v l="$LOAD" -v ts="$TIME_SCALE" -v s="$span" -v n="$LIMIT" \
            'BEGIN { printf "%.4f\n", l * c / ts * s / n }')
        rate=$(awk -v c="$capacity" -v l="$LOAD" -v ts="$TIME_SCALE" 'BEGIN { printf "%.2f", l * c / ts }')
        WORKLOAD_NOTE="Mooncake conversation trace, first $LIMIT requests (ties spread), offered $rate req/s = $LOAD × the fleet's calibrated capacity of $(awk -v c="$capacity" -v ts="$TIME_SCALE" 'BEGIN { printf "%.2f", c / ts }') req/s (--load-scale $LOAD_SCALE)"
    else
        WORKLOAD_NOTE="Mooncake conversation trace, first $LIMIT requests (ties spread), --load-scale $LOAD_SCALE"
    fi
else
    echo "compare-routers: $TRACE not found: using the seeded synthetic workload instead" >&2
    LOAD_SCALE=${LOAD_SCALE:-1}
    WORKLOAD_NOTE="SYNTHETIC workload (the trace file $TRACE was absent), seed 1, --load-scale $LOAD_SCALE (load not calibrated)"
fi
WORKLOAD_ARGS+=(--load-scale "$LOAD_SCALE" --seed 1)
NOTE="$WORKLOAD_NOTE. Fleet: $FLEET_NOTE, time scale $TIME_SCALE; a fresh fleet per router. Host: $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -1))."
echo "compare-routers: $NOTE"

# --- peers ---------------------------------------------------------------------------------
peer_bin() {
    case $1 in
        sglang) echo "$PEERS/sglang-router/bin/smg" ;;
        vllm) echo "$PEERS/vllm-router/bin/vllm-router" ;;
    esac
}
PEER_INSTALL_TRIED=""
PEER_INSTALL_ERROR=""
ensure_peer() {
    [[ -x $(peer_bin "$1") ]] && return 0
    if [[ -z "$PEER_INSTALL_TRIED" ]]; then
        PEER_INSTALL_TRIED=1
        echo "compare-routers: installing the peer routers into $PEERS" >&2
        if ! PEERS="$PEERS" "$INSTALL_PEERS" >"$OUT/install-routers.log" 2>&1; then
            PEER_INSTALL_ERROR="install-routers.sh failed (no network?), see install-routers.log"
        fi
    fi
    [[ -x $(peer_bin "$1") ]]
}
peer_version() {
    case $1 in
        sglang) "$PEERS/sglang-router/bin/pip" show sglang-router 2>/dev/null | sed -n 's/^Version: /sglang-router /p' ;;
        vllm) "$PEERS/vllm-router/bin/pip" show vllm-router 2>/dev/null | sed -n 's/^Version: /vllm-router /p' ;;
    esac
}

# CPU seconds (utime + stime of the process and its live descendants) and summed VmHWM (KiB).
proc_tree() {
    local pid=$1 c
    echo "$pid"
    for c in $(cat "/proc/$pid/task/"*/children 2>/dev/null); do proc_tree "$c"; done
}
measure() {
    local ticks=0 hwm=0 p t h
    for p in $(proc_tree "$1"); do
        t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null || echo 0)
        h=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$p/status" 2>/dev/null || echo 0)
        ticks=$((ticks + ${t:-0})); hwm=$((hwm + ${h:-0}))
    done
    awk -v t="$ticks" -v hz="$CLK_TCK" -v h="$hwm" 'BEGIN { printf "%.2f %d\n", t / hz, h }'
}

write_router_json() { # dir router policy cpu_s cpu_startup_s rss_kib skipped
    local skipped=null
    [[ -n "$7" ]] && skipped="\"$(printf '%s' "$7" | tr -d '\\"' | tr -cd '[:print:]')\""
    cat >"$1/router.json" <<EOF
{"router": "$2", "policy": "$3", "cpu_s": ${4:-null}, "cpu_startup_s": ${5:-null}, "peak_rss_kib": ${6:-null}, "skipped": $skipped}
EOF
}

# --- one contender -------------------------------------------------------------------------
RUN_ARGS=()
run_one() {
    local kind=$1 policy=$2 name dir router_pid="" port metrics url version
    name="$kind $policy"
    dir="$OUT/$kind-$policy"
    mkdir -p "$dir"
    RUN_ARGS+=(--run "$name=$kind-$policy")
    local t0=$SECONDS
    if [[ $kind != pronto ]] && ! ensure_peer "$kind"; then
        echo "compare-routers: $name: skipped (${PEER_INSTALL_ERROR:-not installed})" >&2
        write_router_json "$dir" "$kind" "$policy" "" "" "" "${PEER_INSTALL_ERROR:-not installed in $PEERS}"
        return
    fi

    # 1. A fresh fleet (publishing KV events for an `+exact` contender).
    local exact="" kv_args=()
    if [[ $policy == *+exact ]]; then
        exact=1
        policy=${policy%+exact}
        kv_args=(--kv-events-base-port "$(free_port)")
    fi
    RUST_LOG=warn "$BIN" sim-fleet "${FLEET_ARGS[@]}" \
        --time-scale "$TIME_SCALE" --model "$MODEL" "${kv_args[@]}" \
        >"$dir/fleet.log" 2>&1 &
    local fleet_pid=$!
    PIDS+=("$fleet_pid")
    for _ in $(seq 300); do
        grep -E $'^[^\t]+\thttp://[^\t]+\t' "$dir/fleet.log" >"$dir/fleet.tsv" 2>/dev/null || true
        [[ $(wc -l <"$dir/fleet.tsv") -ge $BACKENDS ]] && break
        kill -0 "$fleet_pid" 2>/dev/null || { echo "compare-routers: sim-fleet exited" >&2; exit 1; }
        sleep 0.1
    done
    [[ $(wc -l <"$dir/fleet.tsv") -ge $BACKENDS ]] || { echo "compare-routers: sim-fleet not up" >&2; exit 1; }
    local urls=() backends=""
    while IFS=$'\t' read -r bname burl _ kv_endpoint; do
        urls+=("$burl")
        if [[ -n $exact ]]; then
            [[ -n $kv_endpoint ]] || { echo "compare-routers: sim-fleet gave $bname no KV-event endpoint" >&2; exit 1; }
            backends+="      - { name: $bname, url: \"$burl\", kv_events: { endpoint: \"$kv_endpoint\", block_size: 16 } }"$'\n'
        else
            backends+="      - { name: $bname, url: \"$burl\" }"$'\n'
        fi
    done <"$dir/fleet.tsv"

    # 2. The router.
    port=$(free_port); metrics=$(free_port)
    case $kind in
        pronto)
            version="pronto $("$BIN" --version | awk '{ print $2 }')"
            cat >"$dir/pronto.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$metrics
threads: 2
explain_headers: true
pools:
  $MODEL:
    policy: $policy
    backends:
$backends
EOF
            RUST_LOG=warn "$BIN" serve --config "$dir/pronto.yaml" >"$dir/router.log" 2>&1 &
            ;;
        sglang | vllm)
            version=$(peer_version "$kind")
            # smg takes a `launch` subcommand and `warn`; vllm-router neither and `warning`.
            local sub=(launch) level=warn
            [[ $kind == vllm ]] && sub=() && level=warning
            "$(peer_bin "$kind")" "${sub[@]}" --host 127.0.0.1 --port "$port" \
                --worker-urls "${urls[@]}" --policy "$policy" \
                --prometheus-host 127.0.0.1 --prometheus-port "$metrics" --log-level "$level" \
                >"$dir/router.log" 2>&1 &
            ;;
    esac
    router_pid=$!
    PIDS+=("$router_pid")
    url="http://127.0.0.1:$port"
    local ready=""
    for _ in $(seq 600); do
        kill -0 "$router_pid" 2>/dev/null || break
        if curl -sf -m 2 "$url/v1/models" >/dev/null 2>&1; then ready=1; break; fi
        sleep 0.1
    done
    if [[ -z "$ready" ]]; then
        echo "compare-routers: $name did not become ready; router.log:" >&2
        tail -n 20 "$dir/router.log" >&2 || true
        write_router_json "$dir" "$version" "$policy" "" "" "" "did not start: $(tail -n 1 "$dir/router.log" | cut -c 1-160)"
        stop_all
        return
    fi

    local cpu0 _rss0
    read -r cpu0 _rss0 < <(measure "$router_pid")

    # 3. The replay (failed requests are recorded, not fatal).
    echo "compare-routers: $name ($version) at $url" >&2
    "$BIN" replay --target "$url" --model "$MODEL" "${WORKLOAD_ARGS[@]}" \
        --timeout "$REQUEST_TIMEOUT" --out "$dir" 2>"$dir/replay.log" ||
        echo "compare-routers: $name: replay exited non-zero (see replay.log)" >&2
    tail -n 1 "$dir/replay.log" >&2 || true

    # 4. The router's cost, then stop everything.
    local cpu_total cpu rss
    read -r cpu_total rss < <(measure "$router_pid")
    cpu=$(awk -v a="$cpu_total" -v b="$cpu0" 'BEGIN { printf "%.2f", a - b }')
    write_router_json "$dir" "$version" "$policy" "$cpu" "$cpu0" "$rss" ""
    stop_all
    echo "compare-routers: $name: router CPU ${cpu} s (+ ${cpu0} s start-up), peak RSS $((rss / 1024)) MiB, $((SECONDS - t0)) s wall" >&2
}

for c in $CONTENDERS; do
    run_one "${c%%:*}" "${c#*:}"
done

# --- the report ----------------------------------------------------------------------------
ELAPSED=$((SECONDS - START_S))
# Run directories are named relative to OUT, so comparison.json does not depend on where OUT is.
report=("$REPORT_BIN" compare-report "${RUN_ARGS[@]}" --out . --title "Router comparison"
    --note "$NOTE Run time: $((ELAPSED / 60)) min $((ELAPSED % 60)) s.")
case " $CONTENDERS " in *" ${BASELINE/ /:} "*) report+=(--baseline "$BASELINE") ;; esac
if ! "$REPORT_BIN" compare-report --help >/dev/null 2>&1; then
    echo "compare-routers: $REPORT_BIN has no compare-report subcommand; run by hand:" >&2
    echo "cd $(printf '%q' "$OUT") &&" >&2
    printf '%q ' "${report[@]}" >&2; echo >&2
    exit 1
fi
(cd "$OUT" && "${report[@]}")
echo "compare-routers: $OUT (comparison.md, comparison.json, ttft_cdf.svg) in $((ELAPSED / 60)) min $((ELAPSED % 60)) s" >&2
