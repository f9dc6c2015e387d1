#!/usr/bin/env bash
# Where an idle open stream's memory goes (issue 20, item 3): runs the release gateway under
# heaptrack, opens N idle streams through it with the overhead example (HTTP/2 from the client,
# one upstream HTTP/1.1 connection per stream to an instant backend that sends one event and
# holds the stream), then prints each allocation site that allocates about once per stream
# with its peak heap per stream. Writes docs/benchmarks/idle-stream-heap.md.
#
# Usage: scripts/idle-stream-heap.sh [N]   (default 2000 streams)
# Env: OUT (default docs/benchmarks/idle-stream-heap.md), SKIP_BUILD=1.
# Needs heaptrack (Debian: apt-get install heaptrack).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
OUT=${OUT:-docs/benchmarks/idle-stream-heap.md}
command -v heaptrack >/dev/null && command -v heaptrack_print >/dev/null ||
    { echo "error: heaptrack is required (apt-get install heaptrack)" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-target}
if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --release --locked --bin pronto --example overhead
fi
bin=$(realpath "$target/release/pronto")
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The example starts the gateway through this wrapper; heaptrack traces it to $tmp/pronto.zst.
cat >"$tmp/wrap.sh" <<EOF
#!/usr/bin/env bash
exec heaptrack -o "$tmp/pronto" "$bin" "\$@" >"$tmp/heaptrack.log" 2>&1
EOF
chmod +x "$tmp/wrap.sh"
started=$(date +%s)
"$target/release/examples/overhead" --pronto "$tmp/wrap.sh" --levels 1 --requests 50 --rounds 1 \
    --idle-streams "$N" --nginx /nonexistent --smg /nonexistent >"$tmp/overhead.txt"
grep -q "| pronto | $N | $N |" "$tmp/overhead.txt" ||
    { cat "$tmp/overhead.txt" >&2; echo "error: not every stream opened" >&2; exit 1; }
# The example stops the wrapper, not the traced gateway under it (by then a child of init):
# stop that one, so heaptrack writes its data. Exactly one gateway of this binary may run.
gw=$(pgrep -f "^$bin serve" || true)
[[ $(wc -w <<<"$gw") -eq 1 ]] ||
    { echo "error: expected one traced gateway, found: ${gw:-none}" >&2; exit 1; }
kill -TERM "$gw"
# Done when the gateway has exited, heaptrack's interpreter too, and the file stopped growing.
size=-1
for _ in $(seq 180); do
    sleep 1
    if ! kill -0 "$gw" 2>/dev/null && ! pgrep -f heaptrack_interpret >/dev/null; then
        now=$(stat -c %s "$tmp/pronto.zst" 2>/dev/null || echo 0)
        [[ "$now" -gt 0 && "$now" == "$size" ]] && break
        size=$now
    fi
done
[[ -s "$tmp/pronto.zst" ]] || { echo "error: heaptrack wrote no data" >&2; exit 1; }
heaptrack_print -f "$tmp/pronto.zst" --print-peaks 1 --print-allocators 0 --print-temporary 0 \
    --print-leaks 0 --merge-backtraces 0 -n 60 >"$tmp/peaks.txt" 2>/dev/null
{
    echo "# Heap per idle open stream, by allocation site"
    echo
    echo "Written by \`scripts/idle-stream-heap.sh $N\` on $(date -u +%Y-%m-%d) in $(( $(date +%s) - started )) s"
    echo "(the release gateway under heaptrack; $N idle streams over HTTP/2 from the client, one"
    echo "upstream HTTP/1.1 connection each). Sites that allocate about once or twice per stream, with"
    echo "the site's peak heap divided by the $N streams. Heap is not RSS: a buffer's untouched pages are not"
    echo "resident (\`docs/benchmarks/overhead.md\` has the RSS per stream). A relative path is relative"
    echo "to its own crate, which the debug info does not name (\`src/proxy/…\` is Pronto's)."
    echo
    python3 - "$tmp/peaks.txt" "$N" <<'PY'
import re, sys
path, n = sys.argv[1], int(sys.argv[2])
unit = {"B": 1, "K": 1e3, "M": 1e6, "G": 1e9}
head = re.compile(r"^([0-9.]+)([BKMG]?)B? peak memory consumed over (\d+) calls from")
site = re.compile(r"^\s+at (\S+):(\d+)")
skip = ("/rustc/", "/bytes-", "/alloc/src/")
blocks, cur = [], None
for line in open(path):
    m = head.match(line)
    if m:
        cur = [float(m[1]) * unit[m[2] or "B"], int(m[3]), []]
        blocks.append(cur)
    elif cur is not None and (s := site.match(line)):
        # A registry path as `crate-version/src/file.rs`.
        file = re.sub(r"^.*/registry/src/[^/]+/", "", s[1])
        cur[2].append(f"{file}:{s[2]}")
rows = []
for size, calls, frames in blocks:
    if not 0.9 * n <= calls <= 2.1 * n:
        continue
    frames = [f for f in frames if not any(k in f for k in skip)]
    # Consecutive duplicates are inlined frames of one call.
    chain = [f for i, f in enumerate(frames) if i == 0 or f != frames[i - 1]][:3]
    rows.append((size / n, calls / n, " ← ".join(f"`{f}`" for f in chain) or "?"))
total = sum(r[0] for r in rows)
print("| bytes per stream | allocations per stream | allocated at ← called from |")
print("|---:|---:|---|")
for per, calls, chain in sorted(rows, reverse=True)[:20]:
    print(f"| {per:,.0f} | {calls:.2f} | {chain} |")
print(f"| **{total:,.0f}** | | all {len(rows)} per-stream sites |")
PY
} >"$OUT"
echo "idle-stream-heap: wrote $OUT"
