#!/usr/bin/env python3
"""Compare two eval-matrix output directories cell by cell (TTFT mean and p99 per policy):
scripts/eval-matrix-compare.py BEFORE_DIR AFTER_DIR prints a Markdown table."""
import json, glob, os, sys
before_dir, after_dir = sys.argv[1], sys.argv[2]
print("| cell | policy | mean before → after | p99 before → after | moved >10 % |")
print("|---|---|---|---|---|")
for a in sorted(glob.glob(f"{after_dir}/*.json")):
    name = os.path.basename(a)[:-5]
    b = f"{before_dir}/{name}.json"
    if not os.path.exists(b): continue
    A = {r["policy"]: r for r in json.load(open(a))["runs"]}
    B = {r["policy"]: r for r in json.load(open(b))["runs"]}
    for p in ["round_robin", "least_inflight", "cache_aware", "predicted_ttft", "oracle"]:
        if p not in A or p not in B: continue
        k = [x for x in A[p] if x.startswith("ttft_mean")][0]; k99 = [x for x in A[p] if x.startswith("ttft_p99")][0]
        bm, am, b9, a9 = B[p][k], A[p][k], B[p][k99], A[p][k99]
        moved = "yes" if abs(am / bm - 1) > 0.1 or abs(a9 / b9 - 1) > 0.1 else ""
        print(f"| {name} | {p} | {bm:.0f} → {am:.0f} ({am/bm:.2f}) | {b9:.0f} → {a9:.0f} ({a9/b9:.2f}) | {moved} |")
