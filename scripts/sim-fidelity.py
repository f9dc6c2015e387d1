#!/usr/bin/env python3
"""Simulator fidelity helpers: compare measurements of a real server and of the simulator.

Not part of CI. Standard library only. Measuring and fitting are `pronto calibrate` (Rust, in
crates/pronto-sim/src/calibrate/): `pronto calibrate --backend URL --model NAME --out P.yaml
--measurements REAL.json` measures an engine and fits a profile; with `--measure-only` it only
measures (e.g. `pronto sim-fleet` running that profile). `scripts/fidelity.sh` runs the whole
check. The JSON files are `pronto calibrate --measurements` output (older files written by this
script's former `measure` mode have the same shape).

Modes
-----
compare  REAL.json SIM.json [--stat median|quiet] [--targets]
    Prints a markdown table: shape, real ms, sim ms, relative error (sim - real) / real, and the
    median and worst absolute relative error of the TTFT and the ITL shapes. `--targets` adds
    one line per target of issue 21 (TTFT median <= 10 %, worst <= 30 %; ITL within 20 %) with
    `met` / `MISSED`.

profiles A.yaml B.yaml...
    The timing terms of several profiles side by side (a markdown table), e.g. two calibrations
    of the same engine, and the largest relative difference of each term.

split    --base-url URL --model NAME   (a real vLLM only)
    Sequential requests of 128/1000/4000 tokens; prints the client's mean TTFT next to the
    means of vLLM's own histograms over the same requests (time_to_first_token, queue,
    prefill = first token - scheduled, decode per token): what is engine step time and what
    is per-request work outside the engine.

merge    OUT.json IN.json...
    Pools the samples of several runs against the same server, shape by shape (the medians
    of a loaded host move by +-20 % between runs; pooling narrows that).
"""

import argparse
import http.client
import json
import math
import random
import socket
import statistics
import sys
import time
import urllib.parse
import uuid

LENGTHS = [128, 512, 1000, 2000, 4000]
CONCURRENCY = [1, 8]
KINDS = ["cold", "prefix-hit"]

# Words the tiny model's tokenizer (trained on Python sources) and any BPE split in varied ways.
WORDS = (
    "def class return import from self None True False if elif else for while in not and or "
    "with as try except finally raise yield lambda pass break continue global assert del "
    "value result index buffer stream token prefix cache block request server engine batch "
    "queue thread lock event handler config parser module object string number list dict "
    "tuple set length offset count total first last next prev node tree path file line "
    "data error state start stop open close read write send recv name type args kwargs"
).split()


# ---------------------------------------------------------------------------------- HTTP


class Server:
    """A base URL; one fresh connection per request (loopback, so the connect is ~0.1 ms)."""

    def __init__(self, base_url, model, timeout=120.0):
        u = urllib.parse.urlparse(base_url)
        self.host = u.hostname
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        if self.prefix.endswith("/v1"):
            self.prefix = self.prefix[:-3]
        self.model = model
        self.timeout = timeout

    def conn(self):
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        c.connect()
        # http.client sends a body over 2920 bytes in a second write: without TCP_NODELAY,
        # Nagle holds it until the server ACKs the headers, which a delayed ACK can put off
        # by 40 ms — a client artefact that would land in every long prompt's TTFT.
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def post_json(self, path, body):
        c = self.conn()
        try:
            data = json.dumps(body).encode()
            c.request("POST", self.prefix + path, data, {"Content-Type": "application/json"})
            r = c.getresponse()
            text = r.read()
            return r.status, text
        finally:
            c.close()

    def tokenize(self, text):
        """Token count of a completions prompt, or None when the server has no /tokenize."""
        status, text_ = self.post_json("/tokenize", {"model": self.model, "prompt": text})
        if status != 200:
            return None
        return json.loads(text_)["count"]

    def stream_ttft(self, prompt, max_tokens, start_barrier=None):
        """Send one streaming completion; return (ttft_s, itl_s or None, usage dict or None).

        `itl_s` is the mean inter-token latency, (last token - first token) / (tokens - 1).
        """
        body = json.dumps(
            {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        c = self.conn()
        try:
            if start_barrier is not None:
                start_barrier.wait()
            t0 = time.perf_counter()
            c.request(
                "POST", self.prefix + "/v1/completions", body, {"Content-Type": "application/json"}
            )
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
            ttft = None
            usage = None
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("choices"):
                    last = time.perf_counter() - t0
                    if ttft is None:
                        ttft = last
                if chunk.get("usage"):
                    usage = chunk["usage"]
            if ttft is None:
                raise RuntimeError("stream ended without a token")
            ntok = (usage or {}).get("completion_tokens") or max_tokens
            itl = (last - ttft) / (ntok - 1) if ntok > 1 else None
            return ttft, itl, usage
        finally:
            c.close()


# ------------------------------------------------------------------------------ prompts


class PromptMaker:
    """Builds prompts of a target token count, each with a unique leading nonce."""

    def __init__(self, server, seed):
        self.server = server
        self.rng = random.Random(seed)
        self.has_tokenize = server.tokenize("hello world") is not None
        # chars per token, refined as prompts are measured
        self.cpt = 3.0

    def count(self, text):
        if self.has_tokenize:
            return self.server.tokenize(text)
        return max(1, round(len(text) / 4))

    def text(self, nchars, tag):
        words = [f"# {tag} {uuid.uuid4().hex}\n"]
        n = len(words[0])
        while n < nchars:
            w = self.rng.choice(WORDS)
            sep = "\n" if self.rng.random() < 0.08 else " "
            words.append(w + sep)
            n += len(w) + 1
        return "".join(words)

    def make(self, target, tag):
        """A unique prompt within 1% (or 2 tokens) of `target` tokens: (text, tokens)."""
        best = None
        base = self.text(int(target * self.cpt * 1.5) + 64, tag)
        lo, hi = 16, len(base)
        for _ in range(24):
            mid = (lo + hi) // 2
            n = self.count(base[:mid])
            if best is None or abs(n - target) < abs(best[1] - target):
                best = (base[:mid], n)
            if abs(n - target) <= max(2, target // 100):
                break
            if n < target:
                lo = mid + 1
            else:
                hi = mid - 1
            if lo > hi:
                break
        self.cpt = 0.8 * self.cpt + 0.2 * (len(best[0]) / max(1, best[1]))
        return best


# ---------------------------------------------------------------------------- measuring


def quantile(xs, q):
    """Linear-interpolated quantile of a non-empty list."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ---------------------------------------------------------------------------- comparing


def load(path):
    with open(path) as f:
        return json.load(f)


def compare_rows(real, sim, stat="median"):
    sim_by = {r["shape"]: r for r in sim["results"]}
    rows = []
    for r in real["results"]:
        s = sim_by.get(r["shape"])
        if s is None:
            continue
        a, b = r["ms_" + stat], s["ms_" + stat]
        rows.append((r["shape"], r.get("metric", "ttft"), a, b, (b - a) / a))
    return rows


def compare(args):
    real, sim = load(args.real), load(args.sim)
    rows = compare_rows(real, sim, args.stat)
    if not rows:
        sys.exit("no shape in common")
    print("| shape | real ms | sim ms | rel. error |")
    print("|---|---:|---:|---:|")
    for shape, _, a, b, e in rows:
        print(f"| {shape} | {a:.2f} | {b:.2f} | {e * 100:+.1f} % |")
    print()
    summary = {}
    for metric, label in (("ttft", "TTFT"), ("itl", "ITL")):
        sel = [r for r in rows if r[1] == metric]
        if not sel:
            continue
        errs = [abs(r[4]) for r in sel]
        worst = max(sel, key=lambda r: abs(r[4]))
        summary[metric] = (statistics.median(errs), abs(worst[4]))
        print(f"{label} ({len(sel)} shapes): median |relative error| "
              f"{statistics.median(errs) * 100:.1f} %, worst {abs(worst[4]) * 100:.1f} % "
              f"({worst[0]})")
    if args.targets:
        print()
        checks = []
        if "ttft" in summary:
            checks.append(("TTFT median |error| <= 10 %", summary["ttft"][0] <= 0.10))
            checks.append(("TTFT worst |error| <= 30 %", summary["ttft"][1] <= 0.30))
        if "itl" in summary:
            checks.append(("ITL |error| <= 20 % (every ITL shape)", summary["itl"][1] <= 0.20))
        for what, ok in checks:
            print(f"- {what}: {'met' if ok else 'MISSED'}")


PROFILE_SECTIONS = ("step", "frontend")


def read_profile_terms(path):
    """{"section.name": value} of a profile's timing sections (the flat YAML `pronto calibrate`
    and the committed profiles use; no YAML library needed)."""
    terms, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].rstrip()
            if not line:
                continue
            if not line.startswith(" "):
                key = line.split(":", 1)[0]
                section = key if key in PROFILE_SECTIONS else None
                continue
            if section:
                k, v = line.strip().split(":", 1)
                terms[f"{section}.{k.strip()}"] = float(v)
    return terms


def profiles(args):
    docs = [read_profile_terms(p) for p in args.profiles]
    keys = []
    for d in docs:
        keys += [k for k in d if k not in keys]
    print("| term | " + " | ".join(args.profiles) + " | max rel. diff |")
    print("|---|" + "---:|" * (len(docs) + 1))
    for k in keys:
        vals = [d.get(k, 0.0) for d in docs]
        hi, lo = max(vals), min(vals)
        diff = (hi - lo) / hi if hi > 0 else 0.0
        print(f"| {k} | " + " | ".join(f"{v:.6g}" for v in vals) + f" | {diff * 100:.1f} % |")


SPLIT_METRICS = [
    "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
]


def scrape_sums(server):
    """{histogram: (sum, count)} from a vLLM /metrics page (summed over label sets)."""
    c = server.conn()
    try:
        c.request("GET", server.prefix + "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    out = {}
    for line in text.splitlines():
        for m in SPLIT_METRICS:
            for suffix, k in (("_sum", 0), ("_count", 1)):
                if line.startswith(m + suffix + "{") or line.startswith(m + suffix + " "):
                    v = out.setdefault(m, [0.0, 0.0])
                    v[k] += float(line.rsplit(" ", 1)[1])
    return out


def split(args):
    """Where a real vLLM's TTFT goes: client TTFT vs the engine's own queue/prefill times."""
    server = Server(args.base_url, args.model)
    maker = PromptMaker(server, args.seed)
    for n in (128, 1000, 4000):  # warm-up
        server.stream_ttft(maker.make(n, "warmup")[0], 2)
    print("| prompt tokens | client TTFT ms | vLLM TTFT ms | queue ms | prefill ms "
          "| decode ms/token | outside the engine ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(x) for x in args.lengths.split(",")]:
        before = scrape_sums(server)
        ttfts = []
        for rep in range(args.reps):
            p, _ = maker.make(n, f"split-{n}-{rep}")
            ttfts.append(server.stream_ttft(p, args.decode_tokens)[0] * 1e3)
            time.sleep(args.pause)
        after = scrape_sums(server)
        mean = {}
        for m in SPLIT_METRICS:
            ds = after.get(m, [0, 0])[0] - before.get(m, [0, 0])[0]
            dc = after.get(m, [0, 0])[1] - before.get(m, [0, 0])[1]
            mean[m] = 1e3 * ds / dc if dc else float("nan")
        client = statistics.fmean(ttfts)
        q = mean["vllm:request_queue_time_seconds"]
        pf = mean["vllm:request_prefill_time_seconds"]
        dec = mean["vllm:request_decode_time_seconds"] / max(1, args.decode_tokens - 1)
        print(f"| {n} | {client:.2f} | {mean['vllm:time_to_first_token_seconds']:.2f} | "
              f"{q:.2f} | {pf:.2f} | {dec:.2f} | {client - q - pf:.2f} |")


def merge(args):
    """Pool the samples of several measurement files of the same server, shape by shape."""
    docs = [load(p) for p in args.inputs]
    order, pooled = [], {}
    for d in docs:
        for r in d["results"]:
            if r["shape"] not in pooled:
                order.append(r["shape"])
                pooled[r["shape"]] = dict(r, samples_ms=[], rep_medians_ms=[], _tok=0.0)
            p = pooled[r["shape"]]
            p["_tok"] += r["prompt_tokens_mean"] * len(r["samples_ms"])
            p["samples_ms"] += r["samples_ms"]
            p["rep_medians_ms"] += r["rep_medians_ms"]
    results = []
    for shape in order:
        p = pooled[shape]
        xs = p["samples_ms"]
        p["prompt_tokens_mean"] = p.pop("_tok") / len(xs)
        p.update(
            ms_median=statistics.median(xs),
            ms_quiet=quantile(p["rep_medians_ms"], 0.25),
            ms_mean=statistics.fmean(xs),
            ms_min=min(xs),
            ms_max=max(xs),
        )
        results.append(p)
    out = {k: v for k, v in docs[0].items() if k not in ("results", "note", "when")}
    out["merged_from"] = [
        {"file": f, "when": d.get("when"), "reps": d.get("reps")} for f, d in zip(args.inputs, docs)
    ]
    out["reps"] = sum(d.get("reps", 0) for d in docs)
    out["results"] = results
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(results)} shapes from {len(docs)} files", file=sys.stderr)


# --------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("compare", help="markdown table of real vs simulated medians")
    c.add_argument("real")
    c.add_argument("sim")
    c.add_argument("--stat", choices=["median", "quiet"], default="median")
    c.add_argument("--targets", action="store_true", help="print whether issue 21's targets are met")
    pr = sub.add_parser("profiles", help="timing terms of several profiles side by side")
    pr.add_argument("profiles", nargs="+")
    sp = sub.add_parser("split", help="real vLLM only: TTFT vs the engine's queue/prefill times")
    sp.add_argument("--base-url", required=True)
    sp.add_argument("--model", required=True)
    sp.add_argument("--lengths", default="128,1000,4000")
    sp.add_argument("--reps", type=int, default=20)
    sp.add_argument("--decode-tokens", type=int, default=32)
    sp.add_argument("--pause", type=float, default=0.05)
    sp.add_argument("--seed", type=int, default=7)
    g = sub.add_parser("merge", help="pool several measurement files of one server")
    g.add_argument("out")
    g.add_argument("inputs", nargs="+")
    args = ap.parse_args()
    modes = {"compare": compare, "profiles": profiles, "merge": merge, "split": split}
    modes[args.mode](args)


if __name__ == "__main__":
    main()
