#!/usr/bin/env bash
# Runs Pronto's demo: the same seeded workload through the gateway once per routing policy, in
# front of a built-in simulated fleet; one table and a TTFT CDF; then the gateway stays up.
# Usage: ./scripts/demo.sh [pronto demo options, e.g. --compare-only]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec cargo run --locked --release -- demo "$@"
