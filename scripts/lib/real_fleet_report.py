"""Tables and plots of scripts/real-fleet-bench.sh (imported by real_fleet.py `report`).

Reads every OUT/runs/<setup>/<workload>@<load>/<contender>/rep<k>/run.json and writes OUT/report/:
  tables.md                  one table per set-up x workload x load (AIPerf as the client), each
                             value the mean over repetitions with (min-max) when there are several;
                             then the `pronto replay` rows, if any, and the capacities
  ttft-cdf-<group>.svg       every contender's TTFT CDF (repetitions pooled), drawn by
                             `pronto compare-report` (crates/pronto-bench/src/svg.rs)
  knee.svg                   TTFT p99 against offered load, multi-turn, homo set-up, one curve per
                             router that ran at two or more loads
"""
import glob
import json
import os
import shutil
import statistics
import subprocess

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]


def load_runs(out):
    runs = []
    for p in sorted(glob.glob(os.path.join(out, "runs", "*", "*", "*", "rep*", "run.json"))):
        runs.append(json.load(open(p)))
    return runs


def agg(vals, fmt="{:.0f}"):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "n/a", None
    m = statistics.mean(vals)
    if len(vals) == 1:
        return fmt.format(m), m
    return f"{fmt.format(m)} ({fmt.format(min(vals))}–{fmt.format(max(vals))})", m


def group_key(r):
    return (r["setup"], r["workload"], r["load"])


def table(rows_by_contender, order, lines):
    lines.append("| router | TTFT mean ms | p50 | p90 | p99 | mean / p99 ÷ best peer | goodput req/s "
                 "| throughput req/s | prefix-hit share (vLLM) | vLLM TTFT mean / p99 ms | vLLM queue mean ms "
                 "| requests per server | router CPU s | router RSS MiB | errors |")
    lines.append("|" + "---|" * 15)
    means = {}
    for c in order:
        rs = [r for r in rows_by_contender.get(c, []) if not r.get("skipped")]
        if rs:
            means[c] = (statistics.mean(r["ttft_mean_ms"] for r in rs if r.get("ttft_mean_ms") is not None),
                        statistics.mean(r["ttft_p99_ms"] for r in rs if r.get("ttft_p99_ms") is not None))
    peers = [m for c, m in means.items() if not c.startswith("pronto:") and "round_robin" not in c]
    best = (min(m[0] for m in peers), min(m[1] for m in peers)) if peers else None
    for c in order:
        rs = rows_by_contender.get(c, [])
        if not rs:
            continue
        live = [r for r in rs if not r.get("skipped")]
        if not live:
            lines.append(f"| {c} | skipped: {rs[0]['skipped']} |" + " |" * 13)
            continue
        f = lambda k, fmt="{:.0f}": agg([r.get(k) for r in live], fmt)[0]  # noqa: E731
        ratio = "n/a"
        if best and c in means:
            ratio = f"{means[c][0] / best[0]:.2f}× / {means[c][1] / best[1]:.2f}×"
        per = [r["engine_requests_per_server"] for r in live if r.get("engine_requests_per_server")]
        per_s = " / ".join(f"{statistics.mean(p[i] for p in per):.0f}" for i in range(len(per[0]))) if per else "n/a"
        hit = agg([100 * r["engine_prefix_hit_share"] if r.get("engine_prefix_hit_share") is not None else None
                   for r in live], "{:.0f}")[0]
        lines.append(
            f"| {c} | {f('ttft_mean_ms')} | {f('ttft_p50_ms')} | {f('ttft_p90_ms')} | {f('ttft_p99_ms')} | {ratio} "
            f"| {f('goodput_rps', '{:.2f}')} | {f('throughput_rps', '{:.2f}')} | {hit} % "
            f"| {f('engine_ttft_mean_ms')} / {f('engine_ttft_p99_ms')} | {f('engine_queue_mean_ms')} "
            f"| {per_s} | {f('router_cpu_s', '{:.1f}')} | {f('router_peak_rss_mib', '{:.0f}')} "
            f"| {sum(r.get('errors') or 0 for r in live)}/{sum(r.get('requests') or 0 for r in live)} |")
    return means


def pooled_cdf(out, pronto, key, rows_by_contender, order, slo):
    """Pool each contender's repetitions into one results.jsonl and let `pronto compare-report`
    draw the CDF (and its own comparison table, kept beside the raw results)."""
    setup, wl, load = key
    name = f"{setup}-{wl}-{int(round(load * 100))}"
    base = os.path.join(out, "report", "pooled", name)
    args = []
    for c in order:
        live = [r for r in rows_by_contender.get(c, []) if not r.get("skipped")]
        if not live:
            continue
        d = os.path.join(base, c.replace(":", "-"))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "results.jsonl"), "w") as f:
            i = 0
            for r in live:
                for line in open(os.path.join(r["dir"], "results.jsonl")):
                    if line.strip():
                        rec = json.loads(line)
                        rec["index"] = i
                        i += 1
                        f.write(json.dumps(rec) + "\n")
        shutil.copy(os.path.join(live[0]["dir"], "router.json"), os.path.join(d, "router.json"))
        args += ["--run", f"{c}={d}"]
    if not args:
        return None
    cmp_out = os.path.join(base, "compare")
    subprocess.run([pronto, "compare-report", *args, "--out", cmp_out, "--title",
                    f"{wl} at {load:.0%} of capacity, {setup} set-up (AIPerf, repetitions pooled)",
                    "--ttft-slo", f"{slo[0]:g}ms", "--tpot-slo", f"{slo[1]:g}ms"],
                   check=True, stdout=subprocess.DEVNULL)
    svg = f"ttft-cdf-{name}.svg"
    shutil.copy(os.path.join(cmp_out, "ttft_cdf.svg"), os.path.join(out, "report", svg))
    return svg


def knee_svg(series, title):
    """TTFT p99 (log axis) against offered load (linear, %), one polyline per router."""
    import math
    w, h, x0, x1, y0, y1 = 820, 460, 80, 560, 50, 400
    pts = [v for s in series.values() for _, v in s if v and v > 0]
    if not pts:
        return None
    lo, hi = math.floor(math.log10(min(pts))), math.ceil(math.log10(max(pts)))
    hi = max(hi, lo + 1)
    loads = [l for s in series.values() for l, _ in s]
    lmin, lmax = min(40, min(loads) * 100), max(100, max(loads) * 100)
    X = lambda l: x0 + (l * 100 - lmin) / (lmax - lmin) * (x1 - x0)  # noqa: E731
    Y = lambda v: y1 - (math.log10(v) - lo) / (hi - lo) * (y1 - y0)  # noqa: E731
    esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # noqa: E731
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="15">{esc(title)}</text>',
         f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="black"/>',
         f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>']
    for d in range(lo, hi + 1):
        v = 10 ** d
        for m in ([1, 2, 5] if d < hi else [1]):
            y = Y(v * m)
            label = f"{v * m / 1000:g} s" if v * m >= 1000 else f"{v * m:g} ms"
            o.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#ddd"/>')
            o.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for l in range(int(lmin), int(lmax) + 1, 10):
        x = X(l / 100)
        o.append(f'<line x1="{x:.1f}" y1="{y1}" x2="{x:.1f}" y2="{y1 + 5}" stroke="black"/>')
        o.append(f'<text x="{x:.1f}" y="{y1 + 20}" text-anchor="middle">{l} %</text>')
    o.append(f'<text x="{(x0 + x1) / 2}" y="{h - 20}" text-anchor="middle">offered load (% of the measured capacity)</text>')
    o.append(f'<text x="20" y="{(y0 + y1) / 2}" transform="rotate(-90 20 {(y0 + y1) / 2})" text-anchor="middle">TTFT p99 (AIPerf)</text>')
    for i, (name, s) in enumerate(series.items()):
        col = COLOURS[i % len(COLOURS)]
        s = sorted((l, v) for l, v in s if v and v > 0)
        path = " ".join(f"{X(l):.1f},{Y(v):.1f}" for l, v in s)
        o.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="2"/>')
        for l, v in s:
            o.append(f'<circle cx="{X(l):.1f}" cy="{Y(v):.1f}" r="3.5" fill="{col}"/>')
        ly = y0 + 10 + 20 * i
        o.append(f'<line x1="{x1 + 20}" y1="{ly}" x2="{x1 + 45}" y2="{ly}" stroke="{col}" stroke-width="2"/>')
        o.append(f'<text x="{x1 + 50}" y="{ly + 4}">{esc(name)}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def report(a):
    out = a.out
    os.makedirs(os.path.join(out, "report"), exist_ok=True)
    runs = load_runs(out)
    env = open(os.path.join(out, "env.txt")).read() if os.path.exists(os.path.join(out, "env.txt")) else ""
    lines = ["# Real-fleet benchmark: routers in front of two vLLM CPU servers", "",
             "Generated by `scripts/real-fleet-bench.sh` (see README.md in this directory for the method",
             "and the columns). Every value is the mean over the repetitions, with (min–max) when there are",
             f"several. Goodput: requests per second with TTFT ≤ {a.ttft_slo_ms:g} ms and TPOT ≤ {a.tpot_slo_ms:g} ms.",
             "", "```", env.strip(), "```", ""]
    lines += ["## Capacity of the fleet (measured)", "",
              "| set-up | workload | capacity req/s | engines |", "|---|---|---|---|"]
    for p in sorted(glob.glob(os.path.join(out, "*", "capacity-*", "capacity.json"))):
        setup = p.split(os.sep)[-3]
        wl = p.split(os.sep)[-2].removeprefix("capacity-")
        eng = open(os.path.join(out, setup, "engines.txt")).read().strip().replace("\n", "; ") \
            if os.path.exists(os.path.join(out, setup, "engines.txt")) else ""
        lines.append(f"| {setup} | {wl} | {json.load(open(p))['capacity_rps']:.3f} | {eng} |")
    lines.append("")
    groups = {}
    for r in runs:
        groups.setdefault(group_key(r), []).append(r)
    contenders = []
    for r in runs:
        if r["contender"] not in contenders:
            contenders.append(r["contender"])
    knee = {}
    for key in sorted(groups, key=lambda k: (k[0] != "homo", k[0], k[1], k[2])):
        setup, wl, load = key
        for client in ("aiperf", "replay"):
            by = {}
            for r in groups[key]:
                if r["client"] == client:
                    by.setdefault(r["contender"], []).append(r)
            if not by:
                continue
            rates = [r["offered_rps"] for r in groups[key] if r.get("offered_rps")]
            offered = f" ({statistics.mean(rates):.3f} req/s offered)" if rates else ""
            lines.append(f"## {setup} set-up, {wl} at {load:.0%} of capacity"
                         + (" — client `pronto replay`" if client == "replay" else " — client AIPerf") + offered)
            lines.append("")
            means = table(by, contenders, lines)
            lines.append("")
            if client == "aiperf":
                svg = pooled_cdf(out, a.pronto, key, by, contenders, (a.ttft_slo_ms, a.tpot_slo_ms))
                if svg:
                    lines += [f"![TTFT CDF]({svg})", ""]
                if setup == "homo" and wl == "multiturn":
                    for c, rs in by.items():
                        p99 = [r["ttft_p99_ms"] for r in rs if r.get("ttft_p99_ms") is not None]
                        if p99:
                            knee.setdefault(c, []).append((load, statistics.mean(p99)))
    knee = {c: s for c, s in knee.items() if len(s) >= 2}
    if knee:
        svg = knee_svg(knee, "TTFT p99 against offered load: multi-turn, homo set-up")
        open(os.path.join(out, "report", "knee.svg"), "w").write(svg)
        lines += ["## Knee: TTFT p99 against offered load (multi-turn, homo set-up)", "",
                  "| router | " + " | ".join(f"{l:.0%}" for l in sorted({l for s in knee.values() for l, _ in s})) + " |",
                  "|---|" + "---|" * len({l for s in knee.values() for l, _ in s})]
        loads = sorted({l for s in knee.values() for l, _ in s})
        for c, s in knee.items():
            d = dict(s)
            lines.append(f"| {c} | " + " | ".join(f"{d[l]:.0f}" if l in d else "" for l in loads) + " |")
        lines += ["", "![knee](knee.svg)", ""]
    pred = [r for r in runs if r.get("pronto_prediction_abs_error_ms")]
    if pred:
        lines += ["## Pronto's TTFT prediction error (mean |predicted − actual| per backend, ms)", "",
                  "| set-up | workload | load | rep | contender | client | per backend |", "|---|---|---|---|---|---|---|"]
        for r in pred:
            lines.append(f"| {r['setup']} | {r['workload']} | {r['load']:.0%} | {r['rep']} | {r['contender']} | {r['client']} | "
                         + ", ".join(f"{b}: {v}" for b, v in sorted(r["pronto_prediction_abs_error_ms"].items())) + " |")
        lines.append("")
    open(os.path.join(out, "report", "tables.md"), "w").write("\n".join(lines) + "\n")
    print(f"report: {len(runs)} runs -> {os.path.join(out, 'report', 'tables.md')}")
