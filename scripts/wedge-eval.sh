#!/usr/bin/env bash
# A wedged engine offline (issue 44, item 4): `pronto evaluate` on a fleet of BACKENDS
# H100s whose first engine wedges WEDGE_AFTER into the run for WEDGE_FOR (alive, accepting
# requests, producing nothing: the fleet file's `wedge_after` / `wedge_for`), the seeded chat
# workload at LOAD of capacity, LIMIT requests, the route deadline DEADLINE — with the
# gateway's progress rule (`health.stall` defaults: --stall-floor 10s --stall-factor 4) and
# without it (--no-stall). Prints both tables; docs/reliability.md records one run.
#
# Usage: ./scripts/wedge-eval.sh
# Environment (all optional): BACKENDS=4 LOAD=0.25 LIMIT=5000 WEDGE_AFTER=10s WEDGE_FOR=20s
#   DEADLINE="{after: 2s}" POLICIES="round_robin predicted_ttft"
#   BIN=PATH  pronto binary (default $CARGO_TARGET_DIR/debug/pronto, built unless SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."

BACKENDS=${BACKENDS:-4}
LOAD=${LOAD:-0.25}
LIMIT=${LIMIT:-5000}
WEDGE_AFTER=${WEDGE_AFTER:-10s}
WEDGE_FOR=${WEDGE_FOR:-20s}
DEADLINE=${DEADLINE:-"{after: 2s}"}
POLICIES=${POLICIES:-round_robin predicted_ttft}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug/pronto}
if [[ -z ${SKIP_BUILD:-} ]]; then
    cargo build --locked --bin pronto >&2
fi
[[ -x "$BIN" ]] || { echo "wedge-eval: $BIN not found" >&2; exit 1; }
TMP=$(mktemp -d -t pronto-wedge-eval.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

{
    echo "model: llama-3-8b"
    echo "backends:"
    for i in $(seq 0 $((BACKENDS - 1))); do
        faults=""
        [[ $i -eq 0 ]] && faults=", faults: { wedge_after: $WEDGE_AFTER, wedge_for: $WEDGE_FOR }"
        echo "  - { name: h100-$i, profile: h100-llama3-8b, num_kv_blocks: 24000$faults }"
    done
} >"$TMP/fleet.yaml"

policy_args=()
for p in $POLICIES; do policy_args+=(--policy "$p"); done
for rule in on off; do
    extra=()
    [[ $rule == off ]] && extra=(--no-stall)
    echo "### health.stall $rule (backend h100-0 wedged from $WEDGE_AFTER for $WEDGE_FOR; first_token_deadline $DEADLINE; load $LOAD, $LIMIT requests)"
    echo
    echo '```'
    "$BIN" evaluate --fleet "$TMP/fleet.yaml" --load "$LOAD" --limit "$LIMIT" \
        --first-token-deadline "$DEADLINE" "${policy_args[@]}" "${extra[@]}" 2>/dev/null
    echo '```'
    echo
done
