#!/usr/bin/env bash
# A CPU flame graph of Pronto proxying the instant SSE backend at 64 concurrent streams (the
# overhead example's setup, Pronto only), for issue 20: perf record (Debian's linux-perf) on the
# gateway over the measured rounds, folded and drawn with inferno.
#
# Usage: scripts/flamegraph.sh OUT.svg [extra example flags]
# Env: SKIP_BUILD=1, LEVEL (default 64), REQUESTS (default 40000).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/flamegraph.sh OUT.svg}
shift
command -v perf >/dev/null || { echo "flamegraph: perf not installed (apt-get install linux-perf)" >&2; exit 1; }
if ! command -v inferno-flamegraph >/dev/null; then
    cargo install --locked inferno >/dev/null
fi
if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --profile profiling --locked --bin pronto --example overhead
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${CARGO_TARGET_DIR:-target}"/profiling/examples/overhead --levels "${LEVEL:-64}" --rounds 1 --requests "${REQUESTS:-40000}" \
    --idle-streams 0 --nginx /nonexistent --smg /nonexistent --perf "$tmp/perf.data" "$@"
perf script -i "$tmp/perf.data" 2>/dev/null | inferno-collapse-perf >"$tmp/folded"
inferno-flamegraph --title "pronto, ${LEVEL:-64} streams, instant SSE backend ($(git rev-parse --short HEAD))" \
    <"$tmp/folded" >"$out"
echo "flamegraph: wrote $out ($(wc -l <"$tmp/folded") stacks)"
