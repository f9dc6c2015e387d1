#!/usr/bin/env python3
"""Compare two eval-matrix output directories cell by cell (TTFT mean and p99 per policy).

Usage: scripts/eval-matrix-compare.py [--threshold T] [--policy P ...] [--step DIR ...]
           BEFORE_DIR AFTER_DIR

Prints a Markdown table of every cell present in both (cells are matched on workload, fleet,
load and seed, whichever naming each directory uses: `WORKLOAD--FLEET--LOAD--sSEED.json`, or the
older `TRACE-FLEET-LOAD.json`, seed 1; any other name, such as the replica table's
`TRACE-FLEET-rR-SYNC-SPREAD.json`, is matched on the file name alone). The last column says `worse` when the mean or p99 rose
by more than T (default 0.1 = 10 %), `better` when either fell by more than T and neither
rose by more than T. With `--step` (directories of the builds between BEFORE and AFTER, in
order), a second table follows for the rows that moved: mean / p99 at every step, so a move can
be put down to the change between two builds (a step without the cell or the policy shows `—`).
"""
import argparse
import glob
import json
import os

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--threshold", type=float, default=0.1)
ap.add_argument("--policy", action="append",
                help="policies to compare (default: round_robin, least_inflight, cache_aware, "
                     "predicted_ttft, oracle)")
ap.add_argument("--step", action="append", default=[], metavar="DIR", dest="steps",
                help="a directory of a build between BEFORE and AFTER (repeat, in order)")
ap.add_argument("before")
ap.add_argument("after")
args = ap.parse_args()
policies = args.policy or ["round_robin", "least_inflight", "cache_aware", "predicted_ttft",
                           "oracle"]


def key(path):
    """(workload, fleet, load, seed) from the name, or (name, "", 0, 0) for other names."""
    stem = os.path.basename(path)[:-5]
    if "--" in stem:
        w, fleet, load, seed = stem.split("--")
        return w, fleet, float(load), int(seed.lstrip("s"))
    parts = stem.split("-")
    try:
        return parts[0], "-".join(parts[1:-1]), float(parts[-1]), 1
    except ValueError:
        return stem, "", 0.0, 0


before = {key(p): p for p in glob.glob(f"{args.before}/*.json")}
t = args.threshold
moves = []
print(f"| cell | policy | mean before → after | p99 before → after | moved > {100 * t:.0f} % |")
print("|---|---|---|---|---|")
for a in sorted(glob.glob(f"{args.after}/*.json"), key=key):
    k = key(a)
    if k not in before:
        continue
    A = {r["policy"]: r for r in json.load(open(a))["runs"]}
    B = {r["policy"]: r for r in json.load(open(before[k]))["runs"]}
    w, fleet, load, seed = k
    name = f"{w} × {fleet} × {load:.0%} × s{seed}" if fleet else w
    for p in policies:
        if p not in A or p not in B:
            continue
        bm, am = B[p]["ttft_mean_ms"], A[p]["ttft_mean_ms"]
        b9, a9 = B[p]["ttft_p99_ms"], A[p]["ttft_p99_ms"]
        rm, r9 = am / bm, a9 / b9
        if rm > 1 + t or r9 > 1 + t:
            moved = "worse"
        elif rm < 1 - t or r9 < 1 - t:
            moved = "better"
        else:
            moved = ""
        print(f"| {name} | {p} | {bm:.0f} → {am:.0f} ({rm:.2f}) | {b9:.0f} → {a9:.0f} "
              f"({r9:.2f}) | {moved} |")
        if moved:
            moves.append((k, name, p))


def runs_of(directory, k):
    """The runs of cell `k` in `directory`, by policy (empty where the cell is absent)."""
    for path in glob.glob(f"{directory}/*.json"):
        if key(path) == k and os.path.getsize(path) > 0:
            return {r["policy"]: r for r in json.load(open(path))["runs"]}
    return {}


if args.steps and moves:
    dirs = [args.before, *args.steps, args.after]
    print(f"\nThe rows that moved, mean / p99 at each build ({', '.join(dirs)}):\n")
    print("| cell | policy | " + " | ".join(f"{i}" for i in range(len(dirs))) + " |")
    print("|---|---|" + "---|" * len(dirs))
    for k, name, p in moves:
        cols = []
        for d in dirs:
            r = runs_of(d, k).get(p)
            cols.append(f"{r['ttft_mean_ms']:.0f} / {r['ttft_p99_ms']:.0f}" if r else "—")
        print(f"| {name} | {p} | " + " | ".join(cols) + " |")
