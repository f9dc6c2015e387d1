#!/usr/bin/env bash
# Runs Pronto's demo: the gateway in front of a built-in simulated fleet. Usage: ./scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec cargo run --locked --release -- demo "$@"
