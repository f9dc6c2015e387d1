#!/usr/bin/env bash
# Builds Pronto and runs its test suite (what CI runs). Usage: ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
# CI builds once from a clean clone: incremental state (several GB across ~50 test binaries)
# buys nothing there and has filled a CI machine's disk (a linker bus error, then ENOSPC).
if [[ -n ${CI:-} ]]; then
  export CARGO_INCREMENTAL=0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Style first: it is the cheapest failure.
cargo fmt --all -- --check
cargo clippy --locked --workspace --all-targets -- -D warnings
# Dependencies: licenses, bans (duplicate versions warn) and sources (deny.toml); advisories
# when the RustSec database can be fetched (it cannot offline: deny.toml says why). Unused
# dependencies: cargo-machete. Both are installed by bootstrap.sh.
cargo deny --locked check licenses bans sources
if cargo deny fetch db >/dev/null 2>&1; then
  cargo deny --locked --offline check advisories
else
  echo "test.sh: the RustSec advisory database cannot be fetched (offline): advisories not checked" >&2
fi
cargo machete
# No import cycle between the gateway's top-level modules (the layers of docs/architecture.md).
python3 scripts/code-facts.py --cycles
# The alerting rules load and pass their unit tests (seconds; tests/deploy.rs runs them as
# well, and the deployment tests need the tools bootstrap installed: under CI a missing one
# fails its test instead of skipping it).
(cd deploy/prometheus && promtool check rules pronto-rules.yaml && promtool test rules pronto-rules.test.yaml)
cargo build --locked --workspace --all-targets
# The gateway without the tools (what the container image ships) builds too.
cargo build --locked --bin pronto --no-default-features
cargo test --locked --workspace --all-targets 2>&1 | tee -a "$log"
cargo test --locked --workspace --doc 2>&1 | tee -a "$log"
# The fuzz targets' bodies on stable (they are behind the `fuzzing` feature).
cargo test --locked -p pronto-core --features fuzzing --test fuzz_smoke 2>&1 | tee -a "$log"
cargo test --locked --features fuzzing --test fuzz_smoke 2>&1 | tee -a "$log"
# The criterion benches compile (dev profile: the release build alone would take most of CI's
# budget on two cores; `cargo bench` builds them optimised).
cargo bench --locked --workspace --no-run --profile dev
# One minute of the synthetic workload through the gateway in front of a simulated fleet.
SKIP_BUILD=1 DURATION=${REPLAY_SMOKE_DURATION:-60s} ./scripts/replay-smoke.sh
# One closing line over every test binary (each prints its own `test result:` line).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "Total: %d passed, %d failed\n", p, f }' "$log"
