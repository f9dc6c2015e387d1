#!/usr/bin/env bash
# Stream migration's fault tables, with and without migration (docs/benchmarks/migration/crash.md):
#  1. live: tests/migration.rs — the gateway in front of the simulated fleet (3 backends, b0
#     crashing every second, 36 streams of 160 tokens, 9 at a time), run with migration on and
#     off; the streams that ended with an error event, the continuations, and the prefill paid
#     again (the continuations' prompt tokens) over the clients' prompt tokens;
#  2. offline: `pronto evaluate` on the generated chat workload at 0.6 × capacity, over a
#     fleet of 3 H100 backends whose first crashes every 3 s (down 1 s), `--migration 1` and
#     `--migration 0`: cut requests, retries, continuations, errors, re-prefilled tokens.
#
#   scripts/migration-table.sh            # writes docs/benchmarks/migration/crash.md
#   OUT=FILE scripts/migration-table.sh   # elsewhere
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$repo/docs/benchmarks/migration/crash.md}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$repo"

echo "== live: tests/migration.rs" >&2
cargo test --quiet --locked --test migration -- --nocapture >"$tmp/live.log" 2>&1 || {
  cat "$tmp/live.log" >&2
  exit 1
}
cargo build --quiet --locked --bin pronto
pronto=${CARGO_TARGET_DIR:-$repo/target}/debug/pronto

cat >"$tmp/fleet.yaml" <<'EOF'
model: sim-model
backends:
  - {name: b0, profile: h100-llama3-8b, faults: {crash_after: 3s, crash_every: 3s, restart_after: 1s}}
  - {name: b1, profile: h100-llama3-8b}
  - {name: b2, profile: h100-llama3-8b}
EOF
for m in 1 0; do
  echo "== offline: --migration $m" >&2
  "$pronto" evaluate --fleet "$tmp/fleet.yaml" --load 0.6 --policy least_inflight \
    --policy predicted_ttft --migration "$m" --json >"$tmp/offline-$m.json"
done

python3 - "$tmp" "$(git rev-parse --short HEAD)" >"$out" <<'PY'
import json, re, sys
tmp, rev = sys.argv[1], sys.argv[2]
print("# Stream migration: a backend crashing mid-stream\n")
print(f"Made by `scripts/migration-table.sh` at revision {rev}.\n")
print("## Live: the gateway in front of the simulated fleet (`tests/migration.rs`)\n")
print("Three sim backends (h100-llama3-8b, time scale 1), `b0` crashing every second (down "
      "300 ms); 36 streamed requests (chat and completions) of 160 tokens, 9 at a time, "
      "`least_inflight`. With migration every stream's text equals the fault-free run's byte "
      "for byte (the test asserts it).\n")
print("| migration | streams | ended with an error event | continued on another backend "
      "| prompt tokens re-prefilled | client prompt tokens | re-prefilled / prompt |")
print("|---|---:|---:|---:|---:|---:|---:|")
for line in open(f"{tmp}/live.log"):
    if not line.startswith("MIGRATION "):
        continue
    kv = dict(re.findall(r"(\w+)=([\d.]+)", line))
    mode = line.split()[1]
    print(f"| {mode} | {kv['streams']} | {kv['errors']} | {float(kv['continued']):.0f} "
          f"| {float(kv['reprefill_tokens']):.0f} | {kv['prompt_tokens']} | {float(kv['reprefill_ratio']):.3f} |")
print("\nWithout migration the streams that ended with an error event are missing from the "
      "prompt-token column (they never got a usage chunk).\n")
print("## Offline: `pronto evaluate` (the evaluator's crash model, `--migration`)\n")
print("Generated chat workload at 0.6 × fleet capacity, three H100 backends, `b0` crashing "
      "at 3 s and every 3 s after (down 1 s). A continuation pays a new prefill of prompt + "
      "tokens generated on the backend that takes it.\n")
print("| policy | migration | requests | completed | crashes | requests cut | retried before "
      "the first token | continued | errors | re-prefilled tokens | prompt tokens | "
      "re-prefilled / prompt |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for m in ("1", "0"):
    runs = json.load(open(f"{tmp}/offline-{m}.json"))["runs"]
    for r in runs:
        c = r["crashes"]
        print(f"| {r['policy']} | {m} | {r['requests']} | {r['completed']} | {c['crashes']} "
              f"| {c['cut']} | {c['retries']} | {c['migrations']} | {c['errors']} "
              f"| {c['reprefill_tokens']} | {c['prompt_tokens']} "
              f"| {c['reprefill_tokens'] / max(c['prompt_tokens'], 1):.4f} |")
PY
echo "wrote $out" >&2
