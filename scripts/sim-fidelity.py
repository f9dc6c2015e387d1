#!/usr/bin/env python3
"""Simulator fidelity check: streaming TTFT of a real OpenAI-compatible server vs the simulator.

Not part of CI. Standard library only.

Modes
-----
measure  --base-url URL --model NAME --out FILE
    For prompts of about 128, 512, 1000, 2000, 4000 tokens (counted with the server's own
    `POST /tokenize`; by text length when the server has none) and concurrency 1 and 8, measures
    the time to the first streamed `/v1/completions` chunk:
      cold        every prompt starts with a unique prefix, so nothing is cached;
      prefix-hit  the same prompt is sent twice (the first, untimed, fills the prefix cache) and
                  the second is measured: every full KV block but the last token's is cached;
      decode      (ITL) a 128-token prompt generating 32 tokens: the mean inter-token latency
                  (last token - first) / 31, which pins the per-step floor and decode costs.
    At concurrency 8, eight different prompts of the shape are sent at once (released by a
    barrier); every one of their TTFTs is a sample. Each shape is repeated --reps times and
    summarised by the median of its samples (`ms_median`, the headline statistic) and by
    `ms_quiet`, the lower quartile of the per-repetition medians: on a shared, oversubscribed
    host CPU starvation only ever adds time, so the quiet statistic estimates the uncontended
    server. Shapes are interleaved within each repetition so a burst of host load hits all
    shapes alike. Writes a JSON file (all samples kept).

compare  REAL.json SIM.json
    Prints a markdown table: shape, real ms, sim ms, relative error (sim - real) / real, and the
    median and worst absolute relative error. `--stat quiet` compares the quiet statistic.

split    --base-url URL --model NAME   (a real vLLM only)
    Sequential requests of 128/1000/4000 tokens; prints the client's mean TTFT next to the
    means of vLLM's own histograms over the same requests (time_to_first_token, queue,
    prefill = first token - scheduled, decode per token): what is engine step time and what
    is per-request work outside the engine.

merge    OUT.json IN.json...
    Pools the samples of several runs against the same server, shape by shape (the medians
    of a loaded host move by ±20 % between runs; pooling narrows that).

fit      REAL.json [--block-size 128 --max-batched-tokens N --max-tokens M ...]
    Fits the simulator's step-time model (src/sim/profile.rs)
        t_step = floor + a·P + b·A/1e6 + c·D + d·C/1e3   (ms)
    to the measured medians. For every shape the engine's schedule is replayed in Python (FCFS,
    chunked prefill under the per-step token budget, prefix hits of whole blocks, at most
    len - 1 tokens, decoding after the first token), so each request's TTFT is a sum of step
    work vectors, linear in the coefficients; the median of a concurrency-8 shape is the mean
    of its 4th and 5th first tokens. The coefficients minimise the squared *relative* error
    (rows weighted by 1/real) subject to being >= 0 (active-set: a negative coefficient is pinned
    to 0 and the rest refitted). Prints the fitted `step:` block as YAML and the per-shape fit.
"""

import argparse
import http.client
import json
import math
import random
import socket
import statistics
import sys
import threading
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


def run_batch(server, prompts, max_tokens):
    """Send `prompts` at once (one thread each); return [(ttft_s, usage)] in prompt order."""
    out = [None] * len(prompts)
    errs = []
    barrier = threading.Barrier(len(prompts))

    def one(i):
        try:
            out[i] = server.stream_ttft(prompts[i], max_tokens, barrier)
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(e)
            try:
                barrier.abort()
            except Exception:  # noqa: BLE001
                pass

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise errs[0]
    return out


def measure(args):
    server = Server(args.base_url, args.model)
    maker = PromptMaker(server, args.seed)
    lengths = [int(x) for x in args.lengths.split(",")]
    concs = [int(x) for x in args.concurrency.split(",")]
    print(
        f"server {args.base_url} model {args.model}: /tokenize "
        f"{'yes' if maker.has_tokenize else 'no (length / 4)'}",
        file=sys.stderr,
    )
    # warm-up: the first requests after start compile kernels / fill allocators
    for n in (128, 1000, 4000):
        p, _ = maker.make(n, "warmup")
        for _ in range(2):
            server.stream_ttft(p, args.max_tokens)
    shapes = [(kind, conc, n) for kind in KINDS for conc in concs for n in lengths]
    shapes += [("decode", conc, args.decode_prompt) for conc in concs]
    acc = {s: {"samples": [], "reps": [], "toks": [], "cached": []} for s in shapes}
    # repetitions outermost: a burst of load on the host hits every shape alike
    for rep in range(args.reps):
        for kind, conc, n in shapes:
            a = acc[(kind, conc, n)]
            prompts = [maker.make(n, f"{kind}-{conc}-{n}-{rep}-{i}") for i in range(conc)]
            texts = [p for p, _ in prompts]
            a["toks"] += [t for _, t in prompts]
            if kind == "prefix-hit":
                for t in texts:  # fill the cache, one at a time
                    server.stream_ttft(t, args.max_tokens)
            time.sleep(args.pause)
            mt = args.decode_tokens if kind == "decode" else args.max_tokens
            batch = run_batch(server, texts, mt)
            vals = [(itl if kind == "decode" else ttft) * 1e3 for ttft, itl, _ in batch]
            a["samples"] += vals
            a["reps"].append(statistics.median(vals))
            for _, _, usage in batch:
                details = (usage or {}).get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    a["cached"].append(details["cached_tokens"])
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr)
    results = []
    for kind, conc, n in shapes:
        a = acc[(kind, conc, n)]
        samples = a["samples"]
        metric = "itl" if kind == "decode" else "ttft"
        row = {
            "shape": f"{kind} c={conc} n={n}" + (" (ITL)" if metric == "itl" else ""),
            "kind": kind,
            "metric": metric,
            "concurrency": conc,
            "target_tokens": n,
            "max_tokens": args.decode_tokens if kind == "decode" else args.max_tokens,
            "prompt_tokens_mean": statistics.fmean(a["toks"]),
            "cached_tokens_mean": statistics.fmean(a["cached"]) if a["cached"] else None,
            "ms_median": statistics.median(samples),
            "ms_quiet": quantile(a["reps"], 0.25),
            "ms_mean": statistics.fmean(samples),
            "ms_min": min(samples),
            "ms_max": max(samples),
            "samples_ms": [round(s, 3) for s in samples],
            "rep_medians_ms": [round(s, 3) for s in a["reps"]],
        }
        results.append(row)
        print(
            f"{row['shape']:<32} tokens {row['prompt_tokens_mean']:7.1f} "
            f"median {row['ms_median']:8.2f} ms  quiet {row['ms_quiet']:8.2f} ms  "
            f"[{row['ms_min']:.2f} .. {row['ms_max']:.2f}]",
            file=sys.stderr,
        )
    doc = {
        "base_url": args.base_url,
        "model": args.model,
        "label": args.label,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reps": args.reps,
        "max_tokens": args.max_tokens,
        "tokenizer": "server /tokenize" if maker.has_tokenize else "length / 4",
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


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
    for metric, label in (("ttft", "TTFT"), ("itl", "ITL")):
        sel = [r for r in rows if r[1] == metric]
        if not sel:
            continue
        errs = [abs(r[4]) for r in sel]
        worst = max(sel, key=lambda r: abs(r[4]))
        print(f"{label} ({len(sel)} shapes): median |relative error| "
              f"{statistics.median(errs) * 100:.1f} %, worst {abs(worst[4]) * 100:.1f} % "
              f"({worst[0]})")


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


# ------------------------------------------------------------------------------ fitting

NAMES = [
    "floor_ms",
    "prefill_ms_per_token",
    "attn_ms_per_mpair",
    "decode_ms_per_seq",
    "decode_ms_per_kctx",
    # analysis only (not in the simulator's profile): a per-request latency added to every
    # TTFT outside the engine's steps (HTTP, tokenising, first-output path)
    "request_latency_ms",
]


def replay(prompt_len, cached, arrivals, beta, args, max_tokens):
    """Replay the simulated engine (src/sim/engine.rs) for equal requests arriving at `arrivals`.

    All requests are sent at time 0 and reach the engine at `arrivals[i]` ms (FCFS in that
    order). An idle engine starts a step as soon as a request is there; a request arriving
    during a step joins the next one. Step durations come from the coefficients `beta`.
    Returns, per request, ((idle_ms, work) at its first token, (idle_ms, work) at its last):
    the time of the token is idle_ms + work·beta, where `work` sums the work vectors
    [1, P, A/1e6, D, C/1e3] of the steps up to and including the one that produced it and
    `idle_ms` is the time the engine spent waiting for arrivals before then (constant for fixed
    arrivals as long as the schedule does not change).
    """
    conc = len(arrivals)
    order = sorted(range(conc), key=lambda i: arrivals[i])
    reqs = [{"computed": 0, "output": 0} for _ in range(conc)]
    pending = list(order)
    waiting, running = [], []
    acc = [0.0] * 5
    idle = 0.0
    now = 0.0
    first = [None] * conc
    last = [None] * conc
    steps = 0
    while any(f is None for f in last):
        while pending and arrivals[pending[0]] <= now + 1e-12:
            waiting.append(pending.pop(0))
        if not waiting and not running:
            idle += arrivals[pending[0]] - now
            now = arrivals[pending[0]]
            continue
        steps += 1
        if steps > 100000:
            raise RuntimeError("schedule did not converge")
        left = args.max_batched_tokens
        sched = []
        for i in running:
            if left <= 0:
                break
            r = reqs[i]
            n = min(prompt_len + r["output"] - r["computed"], left)
            sched.append((i, n))
            left -= n
        while waiting and len(running) < args.max_num_seqs and left > 0:
            i = waiting.pop(0)
            r = reqs[i]
            r["computed"] = cached
            n = min(prompt_len - r["computed"], left)
            running.append(i)
            sched.append((i, n))
            left -= n
        work = [1.0, 0.0, 0.0, 0.0, 0.0]
        for i, n in sched:
            r = reqs[i]
            total = prompt_len + r["output"]
            if r["output"] > 0 and n == 1 and r["computed"] + 1 == total:
                work[3] += 1
                work[4] += (r["computed"] + 1) / 1e3
            else:
                work[1] += n
                work[2] += n * (r["computed"] + n / 2) / 1e6
        acc = [x + y for x, y in zip(acc, work)]
        now += sum(w * b for w, b in zip(work, beta))
        for i, n in sched:
            r = reqs[i]
            r["computed"] += n
            if r["computed"] >= prompt_len + r["output"]:
                r["output"] += 1
                if first[i] is None:
                    first[i] = (idle, list(acc))
                if r["output"] >= max_tokens:
                    last[i] = (idle, list(acc))
                    running.remove(i)
    return list(zip(first, last))


def arrival_times(conc, n, args, frontend):
    """When each of `conc` simultaneously sent requests of `n` tokens reaches the engine (ms).

    together     all at once;
    first-alone  the first at 0, the rest just after the first step has started (what the
                 live simulator sees: its engine task wakes on the first request);
    frontend     serialised per-request front-end work f0 + f·n (tokenising, hashing, IPC):
                 request i arrives at (i + 1)·(f0 + f·n) — the real server's API process.
    """
    if frontend is not None:
        f0, f = frontend
        return [(i + 1) * (f0 + f * n) for i in range(conc)]
    if args.arrivals == "together" or conc == 1:
        return [0.0] * conc
    return [0.0] + [1e-6] * (conc - 1)


def design_row(res, beta, args, frontend=None):
    """(idle_ms, work) of the shape's median (mean of the middle two when even): of the TTFTs,
    or for ITL shapes of the mean inter-token latencies (last - first) / (tokens - 1)."""
    n = round(res["prompt_tokens_mean"])
    bs = args.block_size
    cached = ((n - 1) // bs) * bs if res["kind"] == "prefix-hit" else 0
    arr = arrival_times(res["concurrency"], n, args, frontend)
    mt = res.get("max_tokens", args.max_tokens)
    rows = []
    for (i0, w0), (i1, w1) in replay(n, cached, arr, beta, args, mt):
        if res.get("metric") == "itl":
            k = max(1, mt - 1)
            rows.append(((i1 - i0) / k, [(b - a) / k for a, b in zip(w0, w1)]))
        else:
            rows.append((i0, w0))
    rows.sort(key=lambda f: f[0] + sum(w * b for w, b in zip(f[1], beta)))
    k = len(rows)
    mid = [rows[k // 2]] if k % 2 else rows[k // 2 - 1 : k // 2 + 1]
    idle = statistics.fmean(f[0] for f in mid)
    work = [statistics.fmean(f[1][j] for f in mid) for j in range(5)]
    work.append(0.0 if res.get("metric") == "itl" else 1.0)
    return idle, work


def solve(a, b):
    """Solve the small dense system a x = b (Gaussian elimination, partial pivoting)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            raise ZeroDivisionError("singular")
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls_relative(x_rows, y, free, offsets=None):
    """min Σ ((c + x·β - y)/y)²  s.t. β >= 0, over the parameters in `free` (others 0)."""
    offsets = offsets or [0.0] * len(y)
    active = list(free)
    while active:
        # rows divided by y, so the residual is the relative error
        xs = [[row[j] / yi for j in active] for row, yi in zip(x_rows, y)]
        ts = [(yi - c) / yi for yi, c in zip(y, offsets)]
        scale = [math.sqrt(sum(r[k] ** 2 for r in xs)) or 1.0 for k in range(len(active))]
        xs = [[r[k] / scale[k] for k in range(len(active))] for r in xs]
        na = len(active)
        ata = [[sum(r[i] * r[j] for r in xs) for j in range(na)] for i in range(na)]
        aty = [sum(r[i] * t for r, t in zip(xs, ts)) for i in range(na)]
        beta = [b / sc for b, sc in zip(solve(ata, aty), scale)]
        neg = [k for k, b in enumerate(beta) if b < 0]
        if not neg:
            out = [0.0] * len(x_rows[0])
            for k, j in enumerate(active):
                out[j] = beta[k]
            return out
        active.pop(min(neg, key=lambda k: beta[k]))
    return [0.0] * len(x_rows[0])


def fit_shapes(results, y, args, free, fixed, frontend=None):
    """Fixed-point fit: replay with the current β, refit β on the replayed work, repeat.

    Only TTFT shapes enter the least squares; `fixed` ({index: value}) pins coefficients.
    Returns β and the model's value for every shape (ITL shapes included)."""
    beta = [20.0, 0.01, 0.0, 0.0, 0.0, 0.0]
    for j, v in fixed.items():
        beta[j] = v
    free = [j for j in free if j not in fixed]
    ttft = [k for k, r in enumerate(results) if r.get("metric", "ttft") == "ttft"]
    for _ in range(30):
        rows = [with_offset(design_row(results[k], beta, args, frontend), results[k], args)
                for k in ttft]
        offsets = [c + sum(w[j] * v for j, v in fixed.items()) for c, w in rows]
        new = nnls_relative([w for _, w in rows], [y[k] for k in ttft], free, offsets)
        for j, v in fixed.items():
            new[j] = v
        done = all(abs(a - b) <= 1e-9 + 1e-6 * abs(a) for a, b in zip(new, beta))
        beta = new
        if done:
            break
    rows = [with_offset(design_row(r, beta, args, frontend), r, args) for r in results]
    preds = [c + sum(w * b for w, b in zip(ws, beta)) for c, ws in rows]
    return beta, preds


def with_offset(row, res, args):
    """Add the simulator's own per-request latency (HTTP, timers) to TTFT rows."""
    c, w = row
    return (c + (0.0 if res.get("metric") == "itl" else args.offset_ms), w)


def decode_cost_from_itl(results, stat):
    """Per-sequence decode cost: the slope of ITL over the batch size, (ITL_c - ITL_1)/(c - 1);
    the step floor cancels. None without two ITL shapes."""
    itl = {r["concurrency"]: r["ms_" + stat] for r in results if r.get("metric") == "itl"}
    if 1 not in itl or len(itl) < 2:
        return None
    c = max(itl)
    return max(0.0, (itl[c] - itl[1]) / (c - 1))


def fit(args):
    real = load(args.real)
    results = real["results"]
    y = [r["ms_" + args.stat] for r in results]
    free = [NAMES.index(n) for n in args.params.split(",")]
    fixed = {}
    d = args.decode_ms_per_seq
    if d is None:
        d = decode_cost_from_itl(results, args.stat)
    if d is not None:
        fixed[NAMES.index("decode_ms_per_seq")] = d
    for item in args.fix:
        name, value = item.split("=")
        fixed[NAMES.index(name)] = float(value)
    frontend = None
    ttft = [k for k, r in enumerate(results) if r.get("metric", "ttft") == "ttft"]

    def score(preds):
        return sum(((preds[k] - y[k]) / y[k]) ** 2 for k in ttft)

    if args.frontend:
        # grid over the front-end cost (f0 ms, f ms/token); β fitted at each point
        best = None
        for f0 in [0.5 * i for i in range(0, 41)]:
            for f in [0.001 * i for i in range(0, 16)]:
                _, preds = fit_shapes(results, y, args, free, fixed, (f0, f))
                if best is None or score(preds) < best[0]:
                    best = (score(preds), (f0, f))
        frontend = best[1]
    beta, preds = fit_shapes(results, y, args, free, fixed, frontend)
    print(f"# fit to ms_{args.stat} of {args.real}; arrivals: "
          + (f"frontend f0 = {frontend[0]:g} ms + {frontend[1] * 1e3:g} us/token, serialised"
             if frontend else args.arrivals)
          + (f"; decode_ms_per_seq fixed at {d:.4g}" if d is not None else ""), file=sys.stderr)
    print("# per-shape fit (ms): shape, real, model, rel. error", file=sys.stderr)
    for r, yi, p in zip(results, y, preds):
        print(f"#   {r['shape']:<32} {yi:8.2f} {p:8.2f} {100 * (p - yi) / yi:+6.1f} %",
              file=sys.stderr)
    errs = [abs(preds[k] - y[k]) / y[k] for k in ttft]
    print(f"# TTFT shapes: median |rel. err| {100 * statistics.median(errs):.1f} %, "
          f"worst {100 * max(errs):.1f} %", file=sys.stderr)
    print("step:")
    for name, b in zip(NAMES[:5], beta):
        print(f"  {name}: {b:.4g}")
    if beta[5]:
        print(f"# not a profile field: request_latency_ms: {beta[5]:.4g}")


# --------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("measure", help="measure TTFT shapes against a server")
    m.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8101")
    m.add_argument("--model", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--label", default="")
    m.add_argument("--reps", type=int, default=5)
    m.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    m.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    m.add_argument("--max-tokens", type=int, default=4, help="output tokens of TTFT shapes")
    m.add_argument("--decode-prompt", type=int, default=128, help="prompt of the ITL shapes")
    m.add_argument("--decode-tokens", type=int, default=32, help="output tokens of ITL shapes")
    m.add_argument("--pause", type=float, default=0.05, help="seconds of quiet before each timed batch")
    m.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("compare", help="markdown table of real vs simulated medians")
    c.add_argument("real")
    c.add_argument("sim")
    c.add_argument("--stat", choices=["median", "quiet"], default="median")
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
    f = sub.add_parser("fit", help="least-squares fit of the step-time model")
    f.add_argument("real")
    f.add_argument("--stat", choices=["median", "quiet"], default="median")
    f.add_argument("--block-size", type=int, default=128)
    f.add_argument("--max-batched-tokens", type=int, default=2048,
                   help="vLLM's CPU default for the API server")
    f.add_argument("--max-num-seqs", type=int, default=128)
    f.add_argument("--max-tokens", type=int, default=4)
    f.add_argument("--arrivals", choices=["together", "first-alone"], default="first-alone",
                   help="how a concurrency-8 batch reaches the engine (see arrival_times)")
    f.add_argument("--frontend", action="store_true",
                   help="also fit a serialised per-request front-end cost f0 + f·n (analysis "
                        "only: the simulator's profile has no such term)")
    f.add_argument(
        "--params",
        default="floor_ms,prefill_ms_per_token,attn_ms_per_mpair",
        help="coefficients fitted to the TTFT shapes (the others are 0 unless fixed)",
    )
    f.add_argument("--offset-ms", type=float, default=0.0,
                   help="latency the live simulator adds to every TTFT outside its steps")
    f.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                   help="pin a coefficient (repeatable)")
    f.add_argument("--decode-ms-per-seq", type=float, default=None,
                   help="fix the decode cost (default: from the ITL shapes' slope)")
    args = ap.parse_args()
    modes = {"measure": measure, "compare": compare, "merge": merge, "fit": fit, "split": split}
    modes[args.mode](args)


if __name__ == "__main__":
    main()
