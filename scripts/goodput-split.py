#!/usr/bin/env python3
"""Goodput split by backend class, from `pronto evaluate --requests-csv DIR` outcomes.

Usage: scripts/goodput-split.py [--ttft-slo S] [--tpot-slo S] DIR/POLICY.csv ...

A backend's class is its name up to the last `-` (`h100-2` → `h100`). For each file and class
it prints the requests served there, their share of all goodput (requests within both
objectives, as a share of every request of the run), and the shares of that class's requests
within the TTFT and within the TPOT objective, with their mean TTFT. It tells whether a
policy's goodput comes from serving every backend within the objectives or from keeping some
within them while others are sacrificed.
"""
import argparse
import csv
import pathlib
import statistics

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--ttft-slo", type=float, default=1.0, help="seconds (default 1)")
ap.add_argument("--tpot-slo", type=float, default=0.05, help="seconds (default 0.05)")
ap.add_argument("csv", nargs="+")
args = ap.parse_args()


def num(x):
    return float(x) if x not in ("", None) else None


print("| policy | class | requests | goodput (% of all) | within TTFT (% of class) "
      "| within TPOT (% of class) | TTFT mean (s) |")
print("|---|---|---:|---:|---:|---:|---:|")
for path in args.csv:
    rows = list(csv.DictReader(open(path)))
    classes = {}
    for r in rows:
        classes.setdefault(r["backend"].rsplit("-", 1)[0], []).append(r)
    for cls, rs in sorted(classes.items()):
        ttft = [num(r["ttft_s"]) for r in rs]
        tpot = [num(r["tpot_s"]) for r in rs]
        in_ttft = [t is not None and t <= args.ttft_slo for t in ttft]
        in_tpot = [t is not None and t <= args.tpot_slo for t in tpot]
        good = sum(a and b for a, b in zip(in_ttft, in_tpot))
        served = [t for t in ttft if t is not None]
        mean = f"{statistics.mean(served):.1f}" if served else "-"
        print(f"| {pathlib.Path(path).stem} | {cls} | {len(rs)} | {100 * good / len(rows):.1f} "
              f"| {100 * sum(in_ttft) / len(rs):.1f} | {100 * sum(in_tpot) / len(rs):.1f} "
              f"| {mean} |")
