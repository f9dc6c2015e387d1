#!/usr/bin/env python3
"""Measurement helpers of scripts/real-fleet-bench.sh (standard library only).

  wait-idle URL...              wait until every vLLM engine has no running or waiting request
  engine-snapshot URL... --out  vLLM's own counters per engine (/metrics): TTFT and queue-time
                                histograms, prefix-cache hit / query tokens, finished requests
  proc-stats PID [--before S --router C --out F]
                                CPU seconds (utime+stime, the process and its descendants) and
                                summed peak RSS (VmHWM); with --out, router.json for the run
  aiperf-results DIR --trace T --out D
                                AIPerf's per-request export -> D/results.jsonl in `pronto
                                replay`'s record format (so `pronto compare-report` reads it)
  capacity DIR --out F          AIPerf's request throughput of a capacity run -> capacity.json
  words-ratio URL --model M     real tokens per `pronto replay` synthetic word (engine /tokenize)
  run-summary DIR ...           one run's row (client, engines, router) -> DIR/run.json
  best-peers DIR --contenders   the best Pronto contender and the two best peers in DIR's runs
  json-get FILE KEY             print one value
  report OUT --pronto BIN       tables (Markdown), TTFT CDFs (`pronto compare-report`) and the
                                knee plot, into OUT/report
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_fleet_report  # noqa: E402  (tables and the knee plot)


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def post_json(url, body, timeout=30):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def metrics(url):
    """Prometheus text -> {(name, labels-string): value}."""
    out = {}
    for line in get(f"{url}/metrics").splitlines():
        m = LINE.match(line)
        if m and not line.startswith("#"):
            try:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def total(m, name):
    return sum(v for (n, _), v in m.items() if n == name)


def histogram(m, name):
    buckets = {}
    for (n, labels), v in m.items():
        if n == f"{name}_bucket":
            le = re.search(r'le="([^"]+)"', labels).group(1)
            buckets[le] = buckets.get(le, 0.0) + v
    return {"sum": total(m, f"{name}_sum"), "count": total(m, f"{name}_count"), "buckets": buckets}


def cmd_wait_idle(a):
    deadline = time.time() + a.timeout
    while time.time() < deadline:
        busy = 0.0
        for u in a.urls:
            m = metrics(u)
            busy += total(m, "vllm:num_requests_running") + total(m, "vllm:num_requests_waiting")
        if busy == 0:
            return
        time.sleep(1)
    sys.exit(f"wait-idle: engines still busy after {a.timeout} s")


def cmd_engine_snapshot(a):
    snap = []
    for u in a.urls:
        m = metrics(u)
        snap.append({
            "url": u,
            "prefix_hits": total(m, "vllm:prefix_cache_hits_total"),
            "prefix_queries": total(m, "vllm:prefix_cache_queries_total"),
            "requests": total(m, "vllm:request_success_total"),
            "preemptions": total(m, "vllm:num_preemptions_total"),
            "prompt_tokens": total(m, "vllm:prompt_tokens_total"),
            "ttft": histogram(m, "vllm:time_to_first_token_seconds"),
            "queue": histogram(m, "vllm:request_queue_time_seconds"),
        })
    json.dump(snap, open(a.out, "w"), indent=1)


def proc_tree(pid):
    out = [pid]
    for kids in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            for c in open(kids).read().split():
                out += proc_tree(int(c))
        except OSError:
            pass
    return out


def cmd_proc_stats(a):
    hz = os.sysconf("SC_CLK_TCK")
    ticks, hwm = 0, 0
    for p in proc_tree(a.pid):
        try:
            stat = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            ticks += int(stat[11]) + int(stat[12])
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmHWM:"):
                    hwm += int(line.split()[1])
        except (OSError, IndexError):
            pass
    cpu = ticks / hz
    if not a.out:
        print(f"{cpu:.2f}")
        return
    before = float(a.before or 0)
    kind, policy = a.router.split(":", 1)
    json.dump({"router": kind, "policy": policy, "cpu_s": round(cpu - before, 2),
               "cpu_startup_s": round(before, 2), "peak_rss_kib": hwm, "skipped": None},
              open(a.out, "w"))


def aiperf_records(d):
    path = os.path.join(d, "profile_export.jsonl")
    recs = []
    for line in open(path):
        if line.strip():
            recs.append(json.loads(line))
    return recs


def metric(rec, name):
    v = rec.get("metrics", {}).get(name)
    if isinstance(v, dict):
        v = v.get("value")
    return v


def cmd_aiperf_results(a):
    recs = aiperf_records(a.dir)
    trace = [json.loads(l) for l in open(a.trace) if l.strip()]
    # Times from the first credit (AIPerf's scheduled send); the trace row from the session id
    # (`session_000012` is the trace's 13th row: one single-turn session per row).
    issued = [r["metadata"].get("credit_issued_ns") or r["metadata"].get("request_start_ns")
              for r in recs if r.get("metadata")]
    t0 = min(issued) if issued else 0
    rows = []
    for i, r in enumerate(recs):
        md = r.get("metadata", {})
        err = r.get("error")
        start = md.get("request_start_ns") or t0
        sched = md.get("credit_issued_ns") or start
        m = re.search(r"(\d+)$", str(md.get("conversation_id", "")))
        idx = int(m.group(1)) if m and int(m.group(1)) < len(trace) else i
        ttft = metric(r, "time_to_first_token")
        itl = metric(r, "inter_token_latency")
        e2e = metric(r, "request_latency")
        out_tok = metric(r, "usage_completion_tokens") or metric(r, "output_sequence_length")
        in_tok = metric(r, "usage_prompt_tokens") or metric(r, "input_sequence_length")
        rows.append({
            "index": idx, "scheduled_s": (sched - t0) / 1e9, "sent_s": (start - t0) / 1e9,
            "send_lag_ms": (start - sched) / 1e6, "input_tokens": int(trace[idx]["input_length"]) if idx < len(trace) else int(in_tok or 0),
            "max_tokens": int(trace[idx]["output_length"]) if idx < len(trace) else int(out_tok or 0),
            "status": None if err else 200,
            "ttft_ms": None if err else ttft, "ttfa_ms": None if err else ttft,
            "reasoning_events": 0, "tpot_ms": None if err else itl, "e2e_ms": e2e,
            "output_events": int(out_tok or 0), "completion_tokens": int(out_tok) if out_tok else None,
            "prompt_tokens": int(in_tok) if in_tok else None, "cached_tokens": None,
            "backend": None, "predicted_ttft_ms": None,
            "error": (err.get("message") or err.get("type") or "error") if isinstance(err, dict) else err,
        })
    rows.sort(key=lambda x: x["index"])
    with open(os.path.join(a.out, "results.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    if len(rows) != len(trace):
        print(f"aiperf-results: {len(rows)} records for {len(trace)} trace requests", file=sys.stderr)


def cmd_capacity(a):
    s = json.load(open(os.path.join(a.dir, "profile_export_aiperf.json")))
    rps = s["request_throughput"]["avg"]
    out = {"capacity_rps": rps, "how": "AIPerf request_throughput of the closed-loop capacity run",
           "requests": s.get("request_count", {}).get("avg")}
    json.dump(out, open(a.out, "w"))
    print(f"capacity: {rps:.3f} req/s")


def mix64(x):
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def cmd_words_ratio(a):
    """`pronto replay`'s synthetic words (crates/pronto-core/src/tokens.rs), tokenized by the
    engine: real tokens per word."""
    words, tokens = 0, 0
    for block in range(4):
        text = "".join(" " + "".join(chr(97 + ((mix64(((block * 0x100000001B3) & ((1 << 64) - 1)) ^ i) >> (8 * k)) & 0xFF) % 26)
                                     for k in range(3)) for i in range(512))
        r = post_json(f"{a.url}/tokenize", {"model": a.model, "prompt": text, "add_special_tokens": False})
        words += 512
        tokens += r["count"]
    print(f"{tokens / words:.3f}")


def pct(sorted_vals, q):
    if not sorted_vals:
        return None
    k = (len(sorted_vals) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def hist_quantile(h, q):
    """Quantile of a cumulative Prometheus histogram (linear within a bucket)."""
    edges = sorted(((math.inf if le == "+Inf" else float(le)), c) for le, c in h["buckets"].items())
    n = h["count"]
    if n <= 0:
        return None
    target, prev_edge, prev_c = q * n, 0.0, 0.0
    for edge, c in edges:
        if c >= target:
            if math.isinf(edge):
                return prev_edge
            return prev_edge + (edge - prev_edge) * ((target - prev_c) / max(c - prev_c, 1e-12))
        prev_edge, prev_c = edge, c
    return prev_edge


def hist_diff(a, b):
    return {"sum": b["sum"] - a["sum"], "count": b["count"] - a["count"],
            "buckets": {k: b["buckets"].get(k, 0) - a["buckets"].get(k, 0) for k in b["buckets"]}}


def cmd_run_summary(a):
    d = a.dir
    row = {"setup": a.setup, "workload": a.workload, "load": float(a.load), "rep": int(a.rep),
           "contender": a.contender, "client": a.client, "dir": d}
    trace = [json.loads(l) for l in open(a.trace) if l.strip()]
    if len(trace) > 1:
        # n arrivals spread over the trace's span plus one mean gap (as the generator plans them)
        span = trace[-1]["timestamp"] / 1000.0
        row["offered_rps"] = len(trace) / (span * len(trace) / (len(trace) - 1)) if span > 0 else None
    router = json.load(open(os.path.join(d, "router.json"))) if os.path.exists(os.path.join(d, "router.json")) else {}
    row["skipped"] = router.get("skipped")
    if router.get("skipped") or not os.path.exists(os.path.join(d, "results.jsonl")):
        json.dump(row, open(os.path.join(d, "run.json"), "w"), indent=1)
        return
    recs = [json.loads(l) for l in open(os.path.join(d, "results.jsonl")) if l.strip()]
    ok = [r for r in recs if not r.get("error") and r.get("ttft_ms") is not None]
    t = sorted(r["ttft_ms"] for r in ok)
    ends = [r["sent_s"] + (r["e2e_ms"] or 0) / 1000 for r in ok]
    window = (max(ends) - min(r["sent_s"] for r in recs)) if ok else 0
    good = [r for r in ok if r["ttft_ms"] <= a.ttft_slo_ms and (r.get("tpot_ms") is None or r["tpot_ms"] <= a.tpot_slo_ms)]
    row.update({
        "requests": len(recs), "errors": len(recs) - len(ok),
        "ttft_mean_ms": statistics.mean(t) if t else None, "ttft_p50_ms": pct(t, 0.5),
        "ttft_p90_ms": pct(t, 0.9), "ttft_p99_ms": pct(t, 0.99),
        "throughput_rps": len(ok) / window if window > 0 else None,
        "goodput_rps": len(good) / window if window > 0 else None,
        "goodput_share": len(good) / len(recs) if recs else None,
        "output_tps": sum(r.get("completion_tokens") or 0 for r in ok) / window if window > 0 else None,
        "ttft_ms_samples": len(t),
    })
    eb = json.load(open(os.path.join(d, "engines-before.json")))
    ea = json.load(open(os.path.join(d, "engines-after.json")))
    hits = sum(y["prefix_hits"] - x["prefix_hits"] for x, y in zip(eb, ea))
    queries = sum(y["prefix_queries"] - x["prefix_queries"] for x, y in zip(eb, ea))
    per_server = [int(y["requests"] - x["requests"]) for x, y in zip(eb, ea)]
    ttft_h = None
    queue = {"sum": 0.0, "count": 0.0}
    for x, y in zip(eb, ea):
        h = hist_diff(x["ttft"], y["ttft"])
        if ttft_h is None:
            ttft_h = h
        else:
            ttft_h = {"sum": ttft_h["sum"] + h["sum"], "count": ttft_h["count"] + h["count"],
                      "buckets": {k: ttft_h["buckets"].get(k, 0) + v for k, v in h["buckets"].items()}}
        q = hist_diff(x["queue"], y["queue"])
        queue["sum"] += q["sum"]
        queue["count"] += q["count"]
    row.update({
        "engine_prefix_hit_share": hits / queries if queries > 0 else None,
        "engine_requests_per_server": per_server,
        "engine_preemptions": sum(y["preemptions"] - x["preemptions"] for x, y in zip(eb, ea)),
        "engine_ttft_mean_ms": 1e3 * ttft_h["sum"] / ttft_h["count"] if ttft_h and ttft_h["count"] > 0 else None,
        "engine_ttft_p50_ms": 1e3 * (hist_quantile(ttft_h, 0.5) or 0) if ttft_h else None,
        "engine_ttft_p90_ms": 1e3 * (hist_quantile(ttft_h, 0.9) or 0) if ttft_h else None,
        "engine_ttft_p99_ms": 1e3 * (hist_quantile(ttft_h, 0.99) or 0) if ttft_h else None,
        "engine_queue_mean_ms": 1e3 * queue["sum"] / queue["count"] if queue["count"] > 0 else None,
        "router_cpu_s": router.get("cpu_s"), "router_peak_rss_mib": (router.get("peak_rss_kib") or 0) / 1024,
    })
    pm = os.path.join(d, "pronto-metrics.txt")
    if os.path.exists(pm):
        errs = {}
        for line in open(pm):
            m = re.match(r'pronto_ttft_prediction_abs_error_seconds_(sum|count)\{backend="([^"]+)"\}\s+(\S+)', line)
            if m:
                errs.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
        row["pronto_prediction_abs_error_ms"] = {
            b: round(1e3 * v["sum"] / v["count"], 1) for b, v in errs.items() if v.get("count")}
    json.dump(row, open(os.path.join(d, "run.json"), "w"), indent=1)


def cmd_best_peers(a):
    runs = [json.load(open(p)) for p in glob.glob(os.path.join(a.dir, "*", "rep*", "run.json"))]
    by = {}
    for r in runs:
        if r.get("client") == "aiperf" and r.get("ttft_mean_ms") is not None:
            by.setdefault(r["contender"], []).append(r["ttft_mean_ms"])
    contenders = a.contenders.split()
    rank = sorted((statistics.mean(v), c) for c, v in by.items())
    pronto = [c for _, c in rank if c.startswith("pronto:predicted_ttft")]
    peers = [c for _, c in rank if not c.startswith("pronto:")]
    # Without runs to rank (e.g. multiturn:0.8 not in WORKLOADS): the contenders' own order.
    pronto = pronto or [c for c in contenders if c.startswith("pronto:predicted_ttft")][:1] or contenders[:1]
    peers = peers or [c for c in contenders if not c.startswith("pronto:")]
    print(" ".join([pronto[0]] + peers[:2]))


def cmd_json_get(a):
    print(json.load(open(a.file))[a.key])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("wait-idle"); p.add_argument("urls", nargs="+"); p.add_argument("--timeout", type=float, default=900)
    p = sub.add_parser("engine-snapshot"); p.add_argument("urls", nargs="+"); p.add_argument("--out", required=True)
    p = sub.add_parser("proc-stats"); p.add_argument("pid", type=int)
    p.add_argument("--before"); p.add_argument("--router"); p.add_argument("--out")
    p = sub.add_parser("aiperf-results"); p.add_argument("dir"); p.add_argument("--trace", required=True); p.add_argument("--out", required=True)
    p = sub.add_parser("capacity"); p.add_argument("dir"); p.add_argument("--out", required=True)
    p = sub.add_parser("words-ratio"); p.add_argument("url"); p.add_argument("--model", required=True)
    p = sub.add_parser("run-summary"); p.add_argument("dir"); p.add_argument("--trace", required=True)
    for k in ("setup", "workload", "load", "rep", "contender", "client"):
        p.add_argument(f"--{k}", required=True)
    p.add_argument("--ttft-slo-ms", type=float, required=True); p.add_argument("--tpot-slo-ms", type=float, required=True)
    p = sub.add_parser("best-peers"); p.add_argument("dir"); p.add_argument("--contenders", required=True)
    p = sub.add_parser("json-get"); p.add_argument("file"); p.add_argument("key")
    p = sub.add_parser("report"); p.add_argument("out"); p.add_argument("--pronto", required=True)
    p.add_argument("--ttft-slo-ms", type=float, required=True); p.add_argument("--tpot-slo-ms", type=float, required=True)
    a = ap.parse_args()
    if a.cmd == "report":
        return real_fleet_report.report(a)
    {"wait-idle": cmd_wait_idle, "engine-snapshot": cmd_engine_snapshot, "proc-stats": cmd_proc_stats,
     "aiperf-results": cmd_aiperf_results, "capacity": cmd_capacity, "words-ratio": cmd_words_ratio,
     "run-summary": cmd_run_summary, "best-peers": cmd_best_peers, "json-get": cmd_json_get}[a.cmd](a)


if __name__ == "__main__":
    main()
