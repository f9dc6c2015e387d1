#!/usr/bin/env python3
"""Fit the simulator's step-time coefficients (config/sim/*.yaml) from the calibration data.

Usage: scripts/fit_profiles.py [CALIBRATION_DIR]   (default ../shared/calibration)

Linear ops (Vidur mlp.csv, TP1): per-layer sum of median times of every operator except `emb`,
times the layer count. floor = that sum at num_tokens <= 32 (memory-bound weight streaming);
prefill_ms_per_token = least-squares slope over 1024..8192 tokens.
Llama-3-8B on H100 has no Vidur file: it is Llama-2-7B on H100 scaled by the Llama-3-8B /
Llama-2-7B ratio measured on A100 (slope and floor separately).
Llama-2-70B TP8 on H100: SplitwiseSim perf_model.csv medians: prefill = a + b*T at batch 1,
decode step = c + d*B at prompt 512.
Attention terms are analytic (see calibration README section 4), printed for reference.
"""
import csv, statistics, sys, os
from collections import defaultdict

root = sys.argv[1] if len(sys.argv) > 1 else "../shared/calibration"
OPS = ["input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
       "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]

def linear_ops(path, layers=32, tp=1):
    per = defaultdict(list)
    for r in csv.DictReader(open(path)):
        if int(r["num_tensor_parallel_workers"]) != tp:
            continue
        s = sum(float(r[f"time_stats.{op}.median"]) for op in OPS if f"time_stats.{op}.median" in r)
        per[int(r["num_tokens"])].append(s * layers)
    per = {n: statistics.median(v) for n, v in per.items()}
    floor = statistics.median([v for n, v in per.items() if n <= 32])
    xs = [n for n in per if 1024 <= n <= 8192]
    ys = [per[n] for n in xs]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return floor, slope, my - slope * mx

def fit(xs, ys):
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b

v = os.path.join(root, "vidur/compute")
a8 = linear_ops(f"{v}/a100/meta-llama/Meta-Llama-3-8B/mlp.csv")
a7 = linear_ops(f"{v}/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
h7 = linear_ops(f"{v}/h100/meta-llama/Llama-2-7b-hf/mlp.csv")
print("linear ops (floor ms, ms/token, intercept ms):")
for name, f in [("a100 llama3-8b", a8), ("a100 llama2-7b", a7), ("h100 llama2-7b", h7)]:
    print(f"  {name:16} floor {f[0]:.2f}  slope {f[1]*1e3:.2f} us/token ({1/f[1]:.1f}k tok/s)  intercept {f[2]:.2f}")
h8 = (h7[0] * a8[0] / a7[0], h7[1] * a8[1] / a7[1])
print(f"  h100 llama3-8b (scaled) floor {h8[0]:.2f}  slope {h8[1]*1e3:.2f} us/token ({1/h8[1]:.1f}k tok/s)")

# Analytic attention: 4 * L * d_model FLOPs per causal pair, at ~50 % of peak bf16.
for gpu, peak in [("h100", 989e12), ("a100", 312e12)]:
    per_pair_s = 4 * 32 * 4096 / (0.5 * peak)
    print(f"  {gpu} llama3-8b attention: {per_pair_s*1e9:.2f} ms per million pairs")
# Decode attention: KV bytes read / (~60 % of HBM bandwidth); 128 KiB/token for Llama-3-8B.
for gpu, bw in [("h100", 3.35e12), ("a100", 2.0e12)]:
    print(f"  {gpu} llama3-8b decode attention: {1000*131072/(0.6*bw)*1e3:.4f} ms per 1k context tokens")

rows = list(csv.DictReader(open(os.path.join(root, "splitwise-sim/perf_model.csv"))))
sel = [r for r in rows if r["model"] == "llama2-70b" and r["hardware"] == "h100-80gb" and r["tensor_parallel"] == "8"]
pre = defaultdict(list); dec = defaultdict(list)
for r in sel:
    if int(r["batch_size"]) == 1:
        pre[int(r["prompt_size"])].append(float(r["prompt_time"]))
    if int(r["prompt_size"]) == 512:
        dec[int(r["batch_size"])].append(float(r["token_time"]))
pa, pb = fit(sorted(pre), [statistics.median(pre[k]) for k in sorted(pre)])
da, db = fit(sorted(dec), [statistics.median(dec[k]) for k in sorted(dec)])
print(f"llama2-70b h100 tp8: prefill {pa:.1f} + {pb:.4f}*T ms; decode {da:.1f} + {db:.3f}*B ms")
print("  prefill points:", {k: round(statistics.median(v), 1) for k, v in sorted(pre.items())})
