#!/usr/bin/env python3
"""Markdown tables from the JSON cells `scripts/eval-matrix.sh` writes (one per trace × fleet × load)."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
cells = sorted(out.glob("*.json"))
print("# Offline routing evaluation (`pronto evaluate`)\n")
print("Written by `scripts/eval-matrix.sh`. TTFT in ms on the simulated fleet (virtual clock,")
print("deterministic). `pt/ca` and `pt/oracle` are predicted_ttft's ratio to cache_aware's and the")
print("oracle's (targets at 80 % load: p99 ≤ 0.7 and mean ≤ 0.8 × cache_aware, p99 ≤ 1.25 × oracle).\n")


def ratios(runs):
    pt, ca, orc = runs.get("predicted_ttft"), runs.get("cache_aware"), runs.get("oracle")
    if not (pt and ca and orc):
        return None
    return (pt["ttft_mean_ms"] / ca["ttft_mean_ms"], pt["ttft_p99_ms"] / ca["ttft_p99_ms"],
            pt["ttft_p99_ms"] / orc["ttft_p99_ms"])


summary = []
for cell in cells:
    parts = cell.stem.split("-")
    r = ratios({x["policy"]: x for x in json.loads(cell.read_text())["runs"]})
    if r:
        summary.append((parts[0], "-".join(parts[1:-1]), float(parts[-1]), r))
if summary:
    print("## predicted_ttft against the targets\n")
    print("| trace | fleet | load | pt/ca mean (≤ 0.8) | pt/ca p99 (≤ 0.7) | pt/oracle p99 (≤ 1.25) | targets met |")
    print("|---|---|---:|---:|---:|---:|---|")
    for trace, fleet, load, (m, p, o) in summary:
        met = "yes" if m <= 0.8 and p <= 0.7 and o <= 1.25 else "no"
        print(f"| {trace} | {fleet} | {load:.0%} | {m:.2f} | {p:.2f} | {o:.2f} | "
              f"{met if abs(load - 0.8) < 1e-9 else '(' + met + ')'} |")
    print("\nThe targets are set at 80 % load; other loads in parentheses.\n")
for cell in cells:
    t, fleet, load = cell.stem.rsplit("-", 2)[0], None, None
    parts = cell.stem.split("-")
    load = parts[-1]
    trace = parts[0]
    fleet = "-".join(parts[1:-1])
    data = json.loads(cell.read_text())
    runs = {r["policy"]: r for r in data["runs"]}
    cap = data.get("capacity_rps")
    print(f"## {trace} trace, {fleet}, load {float(load):.0%}" + (f" (capacity {cap:.2f} req/s)" if cap else ""))
    print()
    print("| policy | mean | p50 | p90 | p99 | hit % | preemptions | requests per backend |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for p, r in runs.items():
        per = "/".join(str(b["requests"]) for b in r["per_backend"])
        print(f"| {p} | {r['ttft_mean_ms']:.0f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p90_ms']:.0f} | "
              f"{r['ttft_p99_ms']:.0f} | {100 * r['prefix_hit_rate']:.1f} | {r['preemptions']} | {per} |")
    pt, ca, orc = runs.get("predicted_ttft"), runs.get("cache_aware"), runs.get("oracle")
    if pt and ca:
        line = (f"\npt/ca: mean {pt['ttft_mean_ms'] / ca['ttft_mean_ms']:.2f}, "
                f"p99 {pt['ttft_p99_ms'] / ca['ttft_p99_ms']:.2f}")
        if orc:
            line += f"; pt/oracle: mean {pt['ttft_mean_ms'] / orc['ttft_mean_ms']:.2f}, p99 {pt['ttft_p99_ms'] / orc['ttft_p99_ms']:.2f}"
        print(line)
    print()
