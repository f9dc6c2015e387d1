#!/usr/bin/env python3
"""Plot a soak run (`scripts/soak.sh`): gateway RSS, p99 TTFT and error rate per minute; on
the RSS panel, a mark at each stalled-reader batch (orange) and hostile pass (purple).

Usage: soak_plot.py OUT_DIR  → writes OUT_DIR/soak.svg (hand-written SVG, no dependencies).
"""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
rss = []
if (out / "rss.txt").exists():
    for line in (out / "rss.txt").read_text().split("\n"):
        parts = line.split()
        if len(parts) == 2:
            rss.append((int(parts[0]) / 60.0, int(parts[1]) / 1024.0))
minutes = {}
for line in (out / "replay" / "results.jsonl").read_text().split("\n"):
    if not line.strip():
        continue
    r = json.loads(line)
    m = int(r["scheduled_s"] // 60)
    ok = r.get("status") == 200 and r.get("error") is None
    minutes.setdefault(m, []).append((ok, r.get("ttft_ms")))
def events(name):
    path = out / name
    if not path.exists():
        return []
    return sorted({json.loads(l)["t"] / 60.0 for l in path.read_text().split("\n") if l.strip()})


stalls = events("stalled.jsonl")
hostile = events("hostile.jsonl")
p99 = []
err = []
for m in sorted(minutes):
    rs = minutes[m]
    t = sorted(x for ok, x in rs if ok and x is not None)
    if t:
        p99.append((m + 0.5, t[min(len(t) - 1, int(0.99 * len(t)))]))
    err.append((m + 0.5, 100.0 * sum(1 for ok, _ in rs if not ok) / len(rs)))

W, H, PAD = 720, 200, 50


def panel(y0, series, title, unit, color, marks=()):
    xs = [x for x, _ in series] or [0, 1]
    ys = [y for _, y in series] or [0, 1]
    xmax = max(max(xs), 1.0)
    ymax = max(ys) * 1.1 or 1.0
    sx = lambda x: PAD + (W - 2 * PAD) * x / xmax
    sy = lambda y: y0 + H - 30 - (H - 50) * y / ymax
    pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in series)
    g = [f'<text x="{PAD}" y="{y0 + 15}" font-size="13">{title}</text>',
         f'<line x1="{PAD}" y1="{y0 + H - 30}" x2="{W - PAD}" y2="{y0 + H - 30}" stroke="#888"/>',
         f'<line x1="{PAD}" y1="{y0 + 20}" x2="{PAD}" y2="{y0 + H - 30}" stroke="#888"/>']
    for k in range(5):
        v = ymax * k / 4
        label = f"{v:.0f}" if ymax >= 10 else f"{v:.2f}"
        g.append(f'<text x="{PAD - 5}" y="{sy(v) + 4:.1f}" font-size="10" text-anchor="end">{label}</text>')
    for k in range(0, int(xmax) + 1, max(1, int(xmax) // 6)):
        g.append(f'<text x="{sx(k):.1f}" y="{y0 + H - 15}" font-size="10" text-anchor="middle">{k} min</text>')
    g.append(f'<text x="{W - PAD}" y="{y0 + 15}" font-size="10" text-anchor="end">{unit}</text>')
    for t, mark_color, dy in marks:
        g.append(f'<line x1="{sx(t):.1f}" y1="{y0 + H - 30 - dy}" x2="{sx(t):.1f}" '
                 f'y2="{y0 + H - 40 - dy}" stroke="{mark_color}" stroke-width="2"/>')
    if series:
        g.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
    return "\n".join(g)


svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{3 * H}" font-family="sans-serif">',
       '<rect width="100%" height="100%" fill="white"/>',
       panel(0, rss, "Gateway RSS (marks: stalled-reader batches orange, hostile passes purple)",
             "MiB", "#1f77b4", [(t, "#ff7f0e", 0) for t in stalls] + [(t, "#9467bd", 12) for t in hostile]),
       panel(H, p99, "p99 TTFT per minute", "ms", "#d62728"),
       panel(2 * H, err, "Errors per minute", "%", "#2ca02c"),
       "</svg>"]
(out / "soak.svg").write_text("\n".join(svg))
print(f"soak: wrote {out / 'soak.svg'}")
