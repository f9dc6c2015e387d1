#!/usr/bin/env bash
# Builds the two release binaries, then prints their sizes, SHA-256 checksums and build times:
#   target/release/pronto   the full binary (gateway + simulator, evaluator, replay tools)
#   target/gateway/pronto   the gateway alone (`--no-default-features`), what the container ships
# Both are stripped (Cargo.toml's `release` profile; `profiling` keeps debug info for flame
# graphs). The two live in separate directories, so neither build overwrites the other.
#   scripts/release.sh            (a clean build is ~10 min per binary on 2 cores; see the README)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}

secs() { # COMMAND... -> runs it (output to stderr), prints its wall seconds
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >&2
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }'
}

full_s=$(secs cargo build --release --locked --bin pronto)
gw_s=$(secs cargo build --profile gateway --locked --bin pronto --no-default-features)

echo "Release binaries at $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores"
echo
echo "| binary | size | sha256 | build time |"
echo "|---|---:|---|---:|"
for row in "release:$full_s" "gateway:$gw_s"; do
  dir=${row%%:*} s=${row#*:}
  bin=$target/$dir/pronto
  size=$(awk -v b="$(stat -c %s "$bin")" 'BEGIN { printf "%.1f MiB", b / 1048576 }')
  sum=$(sha256sum "$bin" | cut -d' ' -f1)
  echo "| \`$bin\` | $size | \`$sum\` | ${s} s |"
done
echo
echo "(build time: this run's wall time, 0 s when the binary was already up to date)"
