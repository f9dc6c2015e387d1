#!/usr/bin/env bash
# Run each cargo-fuzz target for a bounded time (default 60 s each): scripts/fuzz.sh [SECONDS]
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain. Crashes land in
# fuzz/artifacts/<target>/; turn each into a regression unit test next to the code it broke.
#
# scripts/fuzz.sh --check: on stable, without cargo-fuzz: the targets compile, and their
# bodies pass the seeded smoke tests (a few thousand random and mutated inputs each; these
# also run with the rest of the test suite).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(parse_request sse_scanner kv_decode config_loader)
if [[ "${1:-}" == "--check" ]]; then
  cargo check --manifest-path fuzz/Cargo.toml --bins
  cargo test -p pronto-core --features fuzzing --test fuzz_smoke
  cargo test --features fuzzing --test fuzz_smoke
  exit 0
fi
secs="${1:-60}"
if ! cargo fuzz --help >/dev/null 2>&1; then
  echo "fuzz.sh: cargo-fuzz is not installed (cargo install cargo-fuzz); nothing run" >&2
  echo "fuzz.sh: scripts/fuzz.sh --check compiles the targets and runs their smoke tests" >&2
  exit 2
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: no nightly toolchain (rustup toolchain install nightly); nothing run" >&2
  exit 2
fi
status=0
for target in "${targets[@]}"; do
  echo "== $target: ${secs}s"
  mkdir -p "fuzz/corpus/$target"
  if ! cargo +nightly fuzz run "$target" "fuzz/corpus/$target" -- \
      -max_total_time="$secs" -max_len=65536 -print_final_stats=1 2>&1 | tail -n 25; then
    echo "== $target: CRASH (see fuzz/artifacts/$target/)"
    status=1
  fi
done
exit $status
