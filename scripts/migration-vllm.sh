#!/usr/bin/env bash
# Stream migration against two REAL vLLM CPU servers (not CI: ~3 minutes, ~8 GB of RAM, two cores).
#
#   scripts/migration-vllm.sh           # uses $PEERS (default ~/.cache/pronto-peers)
#   PRONTO=BIN                          # this gateway binary (default: target/debug/pronto, built)
#   OUT=DIR                             # logs (default target/migration-vllm/<UTC time>)
#
# What it does: starts two vLLM servers on the tiny model (one core each), Pronto in front of
# both (migration on by default), then with the OpenAI Python SDK:
#  1. a reference: the same long greedy chat stream straight from the first server, untouched;
#  2. the same stream through Pronto; after 40 chunks the server relaying it (named by
#     `x-pronto-backend`) is killed with SIGKILL; the stream must go on through the SDK, ending
#     with exactly one `data: [DONE]` (the raw bytes are teed from the SDK's HTTP transport),
#     one `id`, one role chunk, and `usage.completion_tokens` = max_tokens.
# It prints what the client saw (and whether the text equals the reference: greedy decoding
# continues a re-tokenized prefix, which a random-weight model may not reproduce token for
# token) and Pronto's migration counters. Both servers and Pronto are stopped on exit.
set -euo pipefail
source "$(dirname "$0")/lib/peers.sh"
OUT=${OUT:-$repo/target/migration-vllm/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
model=tiny-llama
ports=(8231 8232)
gw_port=8240
admin_port=8241
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 5   # a vLLM still starting up ignores SIGTERM
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

ensure_vllm "$model"
if [[ -n ${PRONTO:-} ]]; then
  pronto=$PRONTO
else
  (cd "$repo" && cargo build --quiet --locked --bin pronto)
  pronto=${CARGO_TARGET_DIR:-$repo/target}/debug/pronto
fi

for i in 0 1; do
  VLLM_CPU_OMP_THREADS_BIND=$i "$shared/peers/serve-vllm-cpu.sh" "${ports[$i]}" "$PEERS/$model" \
    >"$OUT/vllm-$i.log" 2>&1 &
  pids+=($!)
done
vllm_pids=("${pids[@]}")
cat >"$OUT/pronto.yaml" <<EOF
listen: 127.0.0.1:$gw_port
admin_listen: 127.0.0.1:$admin_port
explain_headers: true
limits: {idle_timeout: 5s}
health: {interval: 500ms, eject_after_failures: 1}
pools:
  $model:
    policy: least_inflight
    backends:
      - {name: vllm-a, url: "http://127.0.0.1:${ports[0]}"}
      - {name: vllm-b, url: "http://127.0.0.1:${ports[1]}"}
EOF
echo "== waiting for vLLM (45-95 s on an idle machine; up to 15 min allowed)"
for port in "${ports[@]}"; do
  for _ in $(seq 1 900); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 1
  done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { tail -n 30 "$OUT"/vllm-*.log; exit 1; }
done
"$pronto" serve --config "$OUT/pronto.yaml" >"$OUT/pronto.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$admin_port/health" >/dev/null && break
  sleep 0.2
done

"$py" - "$model" "$gw_port" "${ports[0]}" "${vllm_pids[0]}" "${ports[1]}" "${vllm_pids[1]}" <<'PY'
import os, signal, sys, json
import httpx, openai

model, gw = sys.argv[1], sys.argv[2]
servers = {"vllm-a": (sys.argv[3], int(sys.argv[4])), "vllm-b": (sys.argv[5], int(sys.argv[6]))}
MAX_TOKENS = 600
messages = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]
args = dict(model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})

raw = bytearray()

class Tee(httpx.SyncByteStream):
    def __init__(self, inner):
        self.inner = inner
    def __iter__(self):
        for b in self.inner:
            raw.extend(b)
            yield b
    def close(self):
        self.inner.close()

class TeeTransport(httpx.HTTPTransport):
    def handle_request(self, request):
        r = super().handle_request(request)
        return httpx.Response(r.status_code, headers=r.headers, stream=Tee(r.stream),
                              extensions=r.extensions)

def text_of(stream):
    text, ids, roles, usage, chunks, finish = "", set(), 0, None, 0, None
    for c in stream:
        chunks += 1
        ids.add(c.id)
        if c.usage:
            usage = c.usage
        if c.choices:
            d = c.choices[0].delta
            if d.role:
                roles += 1
            text += d.content or ""
            finish = c.choices[0].finish_reason or finish
        yield chunks
    text_of.result = dict(text=text, ids=ids, roles=roles, usage=usage, chunks=chunks, finish=finish)

# 1. The reference, straight from a server.
ref_port = servers["vllm-b"][0]
direct = openai.OpenAI(base_url=f"http://127.0.0.1:{ref_port}/v1", api_key="none")
for _ in text_of(direct.chat.completions.create(**args)):
    pass
reference = text_of.result

# 2. Through Pronto, killing the relaying server mid-stream.
client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key="none",
                       http_client=httpx.Client(transport=TeeTransport(), timeout=120))
resp = client.chat.completions.with_raw_response.create(**args)
backend = resp.headers.get("x-pronto-backend")
print(f"first backend: {backend}  x-pronto-migration-max-attempts: "
      f"{resp.headers.get('x-pronto-migration-max-attempts')}")
killed_at = None
try:
    for n in text_of(resp.parse()):
        if n == 40 and killed_at is None:
            port, pid = servers[backend]
            os.kill(pid, signal.SIGKILL)
            killed_at = n
            print(f"SIGKILL {backend} (pid {pid}, port {port}) after {n} chunks")
    error = None
except Exception as e:  # what a client without migration would see
    error = repr(e)
r = text_of.result
body = raw.decode()
dones = body.count("data: [DONE]")
print(f"SDK stream ended without an exception: {error is None}" + (f" ({error})" if error else ""))
print(f"chunks: {r['chunks']}, ids: {len(r['ids'])}, role chunks: {r['roles']}, "
      f"finish_reason: {r['finish']}, data: [DONE] events: {dones}, "
      f"ends with [DONE]: {body.rstrip().endswith('data: [DONE]')}")
print(f"usage: {r['usage'].model_dump_json() if r['usage'] else None}")
print(f"answer chars: {len(r['text'])} (reference {len(reference['text'])}); "
      f"equal to the reference: {r['text'] == reference['text']}; "
      f"common prefix chars: {len(os.path.commonprefix([r['text'], reference['text']]))}")
ok = (error is None and dones == 1 and len(r["ids"]) == 1 and r["roles"] == 1
      and r["usage"] is not None and r["usage"].completion_tokens == MAX_TOKENS
      and killed_at is not None)
print("RESULT:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
rc=$?
echo "== pronto"
curl -s "http://127.0.0.1:$admin_port/metrics" | grep -E '^pronto_stream_migration' || true
grep -E 'continuing the stream|backend failed|"access"|migration' "$OUT/pronto.log" | tail -5 || true
exit $rc
