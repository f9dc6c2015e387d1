#!/usr/bin/env bash
# A stalled reader against a REAL vLLM on CPU (issue 42, item 2): Pronto (write_timeout 2s) in
# front of one vLLM server; a raw-socket client (4 KiB receive buffer, 536-byte MSS) opens a
# long stream and never reads it. Checks that the gateway releases it
# (`pronto_client_stalled_total` 1), that the client's connection is reset, and that vLLM's
# `vllm:num_requests_running` is back to 0 within one second of the release — while the request
# would have generated for much longer (its max_tokens at vLLM's measured rate). Not part of
# CI (vLLM on CPU starts in 45-95 s); docs/reliability.md records one run.
#
#   scripts/stalled-vllm.sh        env: PRONTO (default target/release/pronto), PEERS,
#                                  VLLM_PORT (default 8131), OUT
set -euo pipefail
source "$(dirname "$0")/lib/peers.sh"
pronto=${PRONTO:-$repo/target/release/pronto}
[[ -x $pronto ]] || { echo "stalled-vllm: $pronto not built (cargo build --release --bin pronto)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/pronto-stalled-vllm.XXXX)}
mkdir -p "$OUT"
model=tiny-llama
vport=${VLLM_PORT:-8131}
port=$((20000 + RANDOM % 20000))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

ensure_vllm "$model"
"$shared/peers/serve-vllm-cpu.sh" "$vport" "$PEERS/$model" >"$OUT/vllm.log" 2>&1 & pids+=($!)
echo "== waiting for vLLM on :$vport (45-95 s)"
for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$vport/health" >/dev/null && break; sleep 1; done
curl -sf "http://127.0.0.1:$vport/health" >/dev/null || { tail -30 "$OUT/vllm.log"; exit 1; }

cat >"$OUT/pronto.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$((port + 1))
threads: 2
limits: {write_timeout: 2s}
retry: {max_retries: 0}
pools:
  $model:
    policy: least_inflight
    backends:
      - {name: vllm0, url: 'http://127.0.0.1:$vport'}
EOF
RUST_LOG=info "$pronto" serve --config "$OUT/pronto.yaml" >"$OUT/gateway.log" 2>&1 & pids+=($!)
for _ in $(seq 150); do curl -sf "http://127.0.0.1:$((port + 1))/readyz" >/dev/null && break; sleep 0.2; done

python3 - "$port" "$vport" "$model" <<'PY' | tee "$OUT/report.md"
import http.client, json, socket, sys, time

port, vport, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
MAX_TOKENS = 3500  # under --max-model-len 4096 with the short prompt


def metric(p, name, path="/metrics"):
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=10)
    c.request("GET", path)
    text = c.getresponse().read().decode()
    c.close()
    return sum(float(l.rpartition(" ")[2]) for l in text.splitlines()
               if l.startswith(name + "{") or l.startswith(name + " "))


def chat(max_tokens, stream):
    return json.dumps({"model": model, "max_tokens": max_tokens, "stream": stream,
                       "ignore_eos": True, "temperature": 0,
                       "messages": [{"role": "user", "content": "Tell me everything."}]}).encode()


# vLLM's decode rate here, from a short direct request: how long the long one would run.
c = http.client.HTTPConnection("127.0.0.1", vport, timeout=120)
t = time.monotonic()
c.request("POST", "/v1/chat/completions", body=chat(200, False), headers={"content-type": "application/json"})
r = json.loads(c.getresponse().read())
rate = r["usage"]["completion_tokens"] / (time.monotonic() - t)
would_run = MAX_TOKENS / rate

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
# A small MSS keeps the gateway's send buffer for this connection small (Linux sizes it from
# the MSS and the congestion window): the reader stalls within tens of KB, long before the
# generation could end, instead of after the ~3 MB a loopback connection buffers.
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
s.connect(("127.0.0.1", port))
body = chat(MAX_TOKENS, True)
s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
opened = time.monotonic()
# Never read. Poll the gateway's stall counter and vLLM's running count every 50 ms.
running_seen = stalled_at = zero_at = None
while time.monotonic() - opened < would_run + 30:
    now = time.monotonic()
    running = metric(vport, "vllm:num_requests_running")
    if running >= 1 and running_seen is None:
        running_seen = now
    if stalled_at is None and metric(port + 1, "pronto_client_stalled_total") >= 1:
        stalled_at = now
    if stalled_at is not None and running == 0:
        zero_at = now
        break
    time.sleep(0.05)
s.settimeout(5)
try:
    while s.recv(1 << 20):
        pass
    seen = "closed"
except ConnectionResetError:
    seen = "reset"
except socket.timeout:
    seen = "still open"
lag = None if zero_at is None else zero_at - stalled_at
ok = running_seen is not None and lag is not None and lag <= 1.0 and seen == "reset" \
    and zero_at - opened < would_run
print("| measure | value |")
print("|---|---|")
print(f"| vLLM decode rate (direct, 200 tokens) | {rate:.1f} tokens/s: {MAX_TOKENS} tokens would take {would_run:.0f} s |")
released = "never" if stalled_at is None else f"{stalled_at - opened:.1f} s"
print(f"| stream opened → gateway released the stalled reader | {released} |")
print(f"| release → `vllm:num_requests_running` 0 | {'never' if lag is None else f'{lag:.2f} s'} (bound: 1 s) |")
print(f"| the reader's connection | {seen} |")
print(f"\n{'as expected' if ok else 'NOT as expected'}")
sys.exit(0 if ok else 1)
PY
status=${PIPESTATUS[0]}
grep -m1 'client_stalled' "$OUT/gateway.log" | sed 's/\x1b\[[0-9;]*m//g' || true
echo "stalled-vllm: $("$pronto" --version), output in $OUT"
exit "$status"
