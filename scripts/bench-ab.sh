#!/usr/bin/env bash
# Two builds of one criterion bench, side by side on a noisy host: runs them alternately,
# REPS times each, and prints every run's median and the median of those per binary and
# benchmark, and their ratio. Usage:
#   scripts/bench-ab.sh BEFORE_BIN AFTER_BIN [BENCH_FILTER ...]
#   REPS=10 TIME=1.5 scripts/bench-ab.sh /tmp/routing-before /tmp/routing-after 8_backends 64_backends
# Build each binary with `cargo bench --bench NAME --no-run` at the two commits and copy it.
# Check the noise floor first by passing one binary twice: on the project's 2-core host the
# routing bench's 64-backend median of one binary against itself read 0.83 and 0.99 in two
# REPS=7 TIME=3 runs (2026-12-03), so a ratio within about ±20 % is not a measured change.
set -euo pipefail
before=$1 after=$2; shift 2
filters=("$@"); ((${#filters[@]})) || filters=("")
REPS=${REPS:-10} TIME=${TIME:-1.5}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
one() { # BIN FILTER -> the run's median in microseconds
  "$1" --bench "$2" --warm-up-time 0.5 --measurement-time "$TIME" 2>/dev/null |
    awk '/time:/ { v=$4; u=$5; if (u=="ns") v/=1000; if (u=="ms") v*=1000; print v; exit }'
}
for f in "${filters[@]}"; do
  b=() a=()
  for _ in $(seq "$REPS"); do
    b+=("$(one "$before" "$f")"); a+=("$(one "$after" "$f")")
  done
  mb=$(printf '%s\n' "${b[@]}" | median) ma=$(printf '%s\n' "${a[@]}" | median)
  echo "${f:-all}: before ${b[*]} us"
  echo "${f:-all}: after  ${a[*]} us"
  awk -v f="${f:-all}" -v b="$mb" -v a="$ma" 'BEGIN { printf "%s: median before %.2f us, after %.2f us, after/before %.2f\n", f, b, a, a/b }'
done
