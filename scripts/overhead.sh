#!/usr/bin/env bash
# Proxy overhead side by side (issue 6 item 3): an instant backend hit directly and through
# Pronto, nginx (plain proxy_pass) and the SGLang router, at 1, 64 and 512 concurrent streams,
# then Pronto's RSS with 10,000 idle open streams. Writes docs/benchmarks/overhead.md.
#
# Usage: scripts/overhead.sh [extra example flags, e.g. --requests 20000]
# Env: OUT (default docs/benchmarks/overhead.md), SKIP_BUILD=1, PEERS (peer venvs).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/benchmarks/overhead.md}
if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --release --locked --bin pronto --example overhead
fi
if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        apt-get install -y -qq nginx-light >/dev/null 2>&1 || echo "overhead: nginx install failed; its rows are skipped" >&2
    else
        echo "overhead: nginx not installed (apt-get install nginx-light); its rows are skipped" >&2
    fi
fi
PEERS=${PEERS:-$HOME/.cache/pronto-peers}
if [[ ! -x "$PEERS/sglang-router/bin/smg" && -x ../shared/peers/install-routers.sh ]]; then
    PEERS="$PEERS" ../shared/peers/install-routers.sh >/dev/null 2>&1 || echo "overhead: SGLang router install failed; its rows are skipped" >&2
fi
# 10,000 idle streams need ~10,000 sockets in the gateway and in the backend.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
started=$(date +%s)
PEERS="$PEERS" "${CARGO_TARGET_DIR:-target}"/release/examples/overhead "$@" | tee "$tmp"
{
    echo "# Proxy overhead: Pronto vs nginx vs the SGLang router"
    echo
    echo "Written by \`scripts/overhead.sh $*\` on $(date -u +%Y-%m-%d) in $(( $(date +%s) - started )) s."
    echo "Machine: $(nproc) vCPUs ($(lscpu | sed -n 's/^Model name: *//p' | head -1)), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, $(uname -sr)."
    echo "Load generator, instant backend and proxy share these cores; Pronto runs 2 worker threads,"
    echo "nginx 2 worker processes. Latency is request sent → last byte of a 4-event SSE stream."
    echo "\`added\` columns are the path's percentile minus the direct path's in the same round."
    echo
    cat "$tmp"
} >"$OUT"
echo "overhead: wrote $OUT"
