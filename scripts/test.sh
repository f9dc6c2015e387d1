#!/usr/bin/env bash
# Builds Pronto and runs its test suite (what CI runs). Usage: ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
cargo build --locked --all-targets
cargo test --locked --all-targets
cargo test --locked --doc
