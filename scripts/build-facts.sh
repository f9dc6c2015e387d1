#!/usr/bin/env bash
# Build facts, measured on this machine: the release binary's size with the tools (the default
# features) and without them (the container image's build), and the build times of the core
# crate and of the gateway — clean (a fresh target directory, dependencies included) and
# incremental (after touching one source file of the crate). Prints a Markdown table.
#   scripts/build-facts.sh            (about 10–15 min on 2 cores)
# Env: SKIP_CLEAN=1 skips the two clean builds (the slow part).
# The release builds use ./target (the binary is rebuilt with the default features at the end,
# so target/release/pronto is left as `cargo build --release` makes it).
set -euo pipefail
cd "$(dirname "$0")/.."

secs() { # COMMAND... -> wall seconds, the command's output to stderr
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >&2
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }'
}
mib() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
stripped() { # BIN -> size of a stripped copy
  local t
  t=$(mktemp)
  strip -o "$t" "$1"
  mib "$t"
  rm -f "$t"
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
rows=()
cargo build --release --locked --bin pronto --no-default-features >&2
rows+=("| release binary, \`--no-default-features\` (the gateway alone) | $(mib target/release/pronto) ($(stripped target/release/pronto) stripped) |")
cargo build --release --locked --bin pronto >&2
rows+=("| release binary, default features (with the tools) | $(mib target/release/pronto) ($(stripped target/release/pronto) stripped) |")

if [[ "${SKIP_CLEAN:-0}" != 1 ]]; then
  fresh=$(mktemp -d)
  trap 'rm -rf "$fresh"' EXIT
  rows+=("| clean build of the core crate (\`cargo build -p pronto-core\`, debug, fresh target dir) | $(CARGO_TARGET_DIR=$fresh/core secs cargo build --locked -p pronto-core) s |")
  rows+=("| clean build of the gateway (\`cargo build --bin pronto\`, debug, fresh target dir) | $(CARGO_TARGET_DIR=$fresh/gw secs cargo build --locked --bin pronto) s |")
fi
cargo build --locked --bin pronto >&2
touch crates/pronto-core/src/lib.rs
rows+=("| incremental gateway build after touching the core crate (\`crates/pronto-core/src/lib.rs\`) | $(secs cargo build --locked --bin pronto) s |")
touch src/lib.rs
rows+=("| incremental gateway build after touching the gateway crate (\`src/lib.rs\`) | $(secs cargo build --locked --bin pronto) s |")
touch crates/pronto-core/src/lib.rs
rows+=("| incremental core build after touching it (\`cargo build -p pronto-core\`) | $(secs cargo build --locked -p pronto-core) s |")

echo "Build facts at $(git rev-parse --short HEAD), $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), load average before: $load0"
echo
echo "| what | measured |"
echo "|---|---|"
printf '%s\n' "${rows[@]}"
