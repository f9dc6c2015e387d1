#!/usr/bin/env python3
"""The summary of a soak run (scripts/soak.sh), as Markdown on stdout:

- normal traffic (the replay's results.jsonl) per 5-minute window: requests, errors (no
  200, or an error recorded by the client), p99 TTFT; and in total. A *lost* request is a
  normal request that did not complete;
- the hostile clients (hostile.jsonl, scripts/soak_hostile.py): passes, cases run, how many
  ended as expected, and every case that did not (with what was seen);
- the stalled readers (stalled.jsonl, scripts/soak_stalled.py): batches, readers opened,
  counted by `pronto_client_stalled_total`, reset/closed by the gateway, still open;
- the gateway's RSS at start, its peak (sampled every 10 s, and VmHWM at the end) and at
  the end, and the RSS over the second half of the run (flat or not);
- reloads answered 200, backend ejections, stream migrations (metrics at the end).

Usage: soak_summary.py OUT_DIR
"""

import collections
import json
import os
import sys

out = sys.argv[1]


def jsonl(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def metric_sum(name):
    path = os.path.join(out, "metrics-end.txt")
    if not os.path.exists(path):
        return None
    total = 0.0
    for line in open(path):
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def failed(r):
    return r.get("status") != 200 or r.get("error") is not None


# === normal traffic ===
results = jsonl("replay/results.jsonl")
win = collections.defaultdict(list)
for r in results:
    win[int(r["scheduled_s"] // 300)].append(r)
print("## Normal traffic (pronto replay)\n")
print("| window (min) | requests | errors | error % | p99 TTFT ms |")
print("|---|---:|---:|---:|---:|")
for w in sorted(win):
    rs = win[w]
    errs = sum(1 for r in rs if failed(r))
    t = sorted(r["ttft_ms"] for r in rs if r.get("ttft_ms") is not None)
    p99 = f"{t[min(len(t) - 1, int(0.99 * len(t)))]:.1f}" if t else "-"
    print(f"| {w * 5}-{w * 5 + 5} | {len(rs)} | {errs} | {100 * errs / max(1, len(rs)):.2f} | {p99} |")
errors = [r for r in results if failed(r)]
print(f"| **all** | **{len(results)}** | **{len(errors)}** | "
      f"{100 * len(errors) / max(1, len(results)):.3f} | |")
if errors:
    kinds = collections.Counter(f"{r.get('status')} {(r.get('error') or '')[:80]}" for r in errors)
    print("\nErrors by kind: " + "; ".join(f"{n} × `{k}`" for k, n in kinds.most_common()))

# === hostile clients ===
hostile = jsonl("hostile.jsonl")
print("\n## Hostile clients (scripts/soak_hostile.py)\n")
if not hostile:
    print("none run")
else:
    passes = len({h["pass"] for h in hostile})
    ok = sum(1 for h in hostile if h["ok"])
    names = len({h["case"] for h in hostile})
    print(f"{passes} passes × {names} cases = {len(hostile)} cases run: {ok} as expected, "
          f"{len(hostile) - ok} not.\n")
    # The framing suite in one row per expected answer; every other case, and every case
    # that ended otherwise than expected, in a row of its own.
    by = collections.OrderedDict()
    for h in hostile:
        if h["case"].startswith("framing: "):
            key = ("framing suite", h["expected"])
        else:
            key = (h["case"], h["expected"])
        by.setdefault(key, []).append(h)
    print("| case | expected | runs | as expected | seen, when not as expected |")
    print("|---|---|---:|---:|---|")
    for (name, expected), hs in by.items():
        if name.startswith("framing suite"):
            name += f": the {len({h['case'] for h in hs})} cases expecting this"
        bad = collections.Counter(f"{h['case']}: {h['seen']}" if h["case"].startswith("framing: ")
                                  else h["seen"] for h in hs if not h["ok"])
        seen = "; ".join(f"{n} × {s}" for s, n in bad.items())
        print(f"| {name} | {expected} | {len(hs)} | {sum(1 for h in hs if h['ok'])} | {seen} |")

# === stalled readers ===
stalled = jsonl("stalled.jsonl")
print("\n## Stalled readers (scripts/soak_stalled.py)\n")
if not stalled:
    print("none run")
else:
    opened = sum(s["opened"] for s in stalled)
    counted = sum(s["counted"] for s in stalled)
    released = sum(s["reset"] + s["closed"] for s in stalled)
    still = sum(s["still_open"] for s in stalled)
    times = [s["released_s"] for s in stalled if s["released_s"] is not None]
    print(f"{len(stalled)} batches, {opened} readers opened ({sum(s['refused'] for s in stalled)} refused); "
          f"counted by pronto_client_stalled_total: {counted}; released by the gateway: {released} "
          f"({sum(s['reset'] for s in stalled)} reset, {sum(s['closed'] for s in stalled)} closed); "
          f"still open after their batch: {still}.")
    if times:
        print(f"A batch was counted in full {min(times):.0f}–{max(times):.0f} s after it opened "
              f"({len(times)} of {len(stalled)} batches within the bound).")

# === RSS ===
print("\n## Gateway RSS\n")
rss = []
path = os.path.join(out, "rss.txt")
if os.path.exists(path):
    rss = [(int(a), int(b)) for a, b in (l.split() for l in open(path) if len(l.split()) == 2)]
if rss:
    ks = [k for _, k in rss]
    hwm_path = os.path.join(out, "vmhwm.txt")
    hwm = open(hwm_path).read().strip() if os.path.exists(hwm_path) else ""
    hwm = f"{int(hwm) / 1024:.1f} MiB" if hwm.isdigit() else "unknown"
    half = [k for s, k in rss if s >= rss[-1][0] / 2]
    print(f"start {ks[0] / 1024:.1f} MiB, peak sampled {max(ks) / 1024:.1f} MiB "
          f"(VmHWM at the end {hwm}), end {ks[-1] / 1024:.1f} MiB; "
          f"over the second half: {min(half) / 1024:.1f}–{max(half) / 1024:.1f} MiB, "
          f"{(half[-1] - half[0]) / 1024:+.1f} MiB from its start to the end.")
state = os.path.join(out, "gateway-state.txt")
if os.path.exists(state):
    print(f"\nThe gateway at the end: {open(state).read().strip()}.")

# === the gateway's access log: how every request ended ===
log = os.path.join(out, "gateway.log")
if os.path.exists(log):
    ends, statuses, migrated = collections.Counter(), collections.Counter(), collections.Counter()
    for line in open(log, errors="replace"):
        if " access " not in line:
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        ends[fields.get("end", "(none)").strip('"')] += 1
        statuses[fields.get("status", "?")] += 1
        if fields.get("migrations", "0") != "0":
            migrated[fields.get("end", "(none)").strip('"')] += 1
    print("\nThe gateway's access log: status " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
          + "; end " + ", ".join(f"{k}: {v}" for k, v in ends.most_common())
          + "; of the migrated streams, end " + (", ".join(f"{k}: {v}" for k, v in migrated.most_common()) or "none")
          + ". (Requests answered without an `end` field are the refused ones: hostile cases, errors.)")

# === reloads and faults ===
try:
    reloads = open(os.path.join(out, "reloads.txt")).read().split("\n")
    reloads = [r for r in reloads if r.strip()]
except OSError:
    reloads = []
print(f"\nReloads: {sum(1 for r in reloads if r == 'reload 200')} of {len(reloads)} answered 200. "
      f"Backend ejections: {metric_sum('pronto_backend_ejections_total')}; stream migrations: "
      f"{metric_sum('pronto_stream_migrations_total')}; client stalls counted: "
      f"{metric_sum('pronto_client_stalled_total')}.")

# === the verdict: non-zero when a normal request was lost, a hostile case ended otherwise
# than expected, a stalled reader was left open, or the gateway died (RSS is for the reader) ===
problems = []
if errors:
    problems.append(f"{len(errors)} normal requests lost")
if any(not h["ok"] for h in hostile):
    problems.append(f"{sum(1 for h in hostile if not h['ok'])} hostile cases not as expected")
if stalled and any(s["still_open"] or s["counted"] < s["opened"] for s in stalled):
    problems.append("stalled readers not all released")
if os.path.exists(state) and open(state).read().strip() != "up":
    problems.append("the gateway died")
if not results:
    problems.append("no normal traffic recorded")
print("\nVerdict: " + ("; ".join(problems) if problems else
                       "0 lost requests, every hostile case as expected, every stalled reader released, the gateway up"))
sys.exit(1 if problems else 0)
