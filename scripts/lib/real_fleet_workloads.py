#!/usr/bin/env python3
"""Workloads of scripts/real-fleet-bench.sh, written as Mooncake-format JSONL traces.

Every trace row is `{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}` with one hash id per BLOCK real tokens (the model's tokenizer), so AIPerf
(`--custom-dataset-type mooncake_trace --isl-block-size BLOCK --fixed-schedule`) builds prompts
whose shared hash-id prefixes are shared token prefixes. Arrivals are open loop: the trace's own
timestamps, rescaled so the whole trace offers RATE requests per second over DURATION seconds.

Kinds:
  multiturn  agent-like sessions: one of AGENTS long system prompts (SYSTEM tokens each), then
             per turn a user/tool message of TURN tokens appended to the whole history (every
             turn resends the history); sessions start as a Poisson process, turns follow after
             an exponential think time; a session ends after 2..MAX_TURNS turns or when the next
             turn would pass MAX_INPUT tokens.
  mooncake   a slice of the Mooncake conversation trace (path given, never copied): whole
             conversations (requests sharing their first two blocks), each kept with
             probability SAMPLE (default 1/8), from OFFSET seconds on, until there are
             RATE x DURATION requests; each 512-token block becomes one BLOCK-token block (same hash ids, so
             the same sharing), prompts truncated to MAX_INPUT tokens (truncation keeps
             prefixes), ties in the 3 s buckets spread evenly, the arrival pattern rescaled to
             RATE.
  noreuse    the Azure conversation trace's prompt lengths (lengths only, SCALE × each, capped at
             MAX_INPUT) with hash ids unique to each request, its arrival pattern rescaled to RATE.

Outputs are min(trace output, MAX_OUTPUT) tokens (a CPU engine decodes slowly).

`replay-trace` converts such a trace for `pronto replay`, whose synthetic text uses 512
four-byte words per hash id: about WORDS_RATIO real tokens per word (measured by the script with
the engine's /tokenize), so GROUP = round(512 × ratio / BLOCK) consecutive blocks become one
replay block and lengths are divided by the ratio (sharing kept at the coarser grain).
"""
import argparse
import csv
import datetime
import json
import math
import random
import sys


def write(rows, path):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def rescale(rows, rate, duration):
    """The first round(rate × duration) rows, their arrival pattern stretched or squeezed so
    that they span `duration` seconds: `rate` req/s on average, the trace's burstiness kept."""
    rows.sort(key=lambda r: r["t"])
    n = max(1, min(len(rows), round(rate * duration)))
    if n < round(rate * duration):
        print(f"workload: the trace has only {n} requests", file=sys.stderr)
    rows = rows[:n]
    t0 = rows[0]["t"]
    span = rows[-1]["t"] - t0
    # n arrivals over `duration`: the last one lands at duration × (n - 1) / n.
    k = duration * (n - 1) / n / span if span > 0 else 0.0
    return [{"timestamp": int(round((r["t"] - t0) * k * 1000)), "input_length": r["input_length"],
             "output_length": r["output_length"], "hash_ids": r["hash_ids"]} for r in rows]


def blocks_for(n_tokens, block):
    return max(1, math.ceil(n_tokens / block))


def multiturn(a, rng):
    next_id = 1_000_000
    systems = []
    for _ in range(a.agents):
        ids = list(range(next_id, next_id + blocks_for(a.system, a.block)))
        next_id += len(ids)
        systems.append(ids)
    turn_blocks = blocks_for(a.turn, a.block)
    rows = []
    mean_turns = (2 + a.max_turns) / 2
    session_rate = a.rate / mean_turns
    # Generate sessions over a window longer than the run, then cut by the rescale; the
    # rescale factor stays ~1 because the session start rate was derived from the target.
    t = 0.0
    horizon = a.duration * 1.2 + a.think * a.max_turns
    while t < horizon:
        t += rng.expovariate(session_rate)
        agent = systems[rng.randrange(len(systems))]
        history = list(agent)
        turns = rng.randint(2, a.max_turns)
        at = t
        for _ in range(turns):
            new = list(range(next_id, next_id + turn_blocks))
            next_id += turn_blocks
            ids = history + new
            if len(ids) * a.block > a.max_input:
                break
            rows.append({"t": at, "input_length": len(ids) * a.block,
                         "output_length": a.max_output, "hash_ids": ids})
            history = ids
            at += a.think * rng.expovariate(1.0) + 0.5
    return rescale(rows, a.rate, a.duration)


def mooncake(a, rng):
    raw = []
    with open(a.trace) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if r["timestamp"] >= a.offset * 1000:
                    raw.append(r)
    # Spread ties evenly over their bucket (the conversation trace has 3 s buckets).
    spread = []
    i = 0
    while i < len(raw):
        j = i
        while j < len(raw) and raw[j]["timestamp"] == raw[i]["timestamp"]:
            j += 1
        nxt = raw[j]["timestamp"] if j < len(raw) else raw[i]["timestamp"] + 3000
        for k in range(i, j):
            spread.append((raw[k]["timestamp"] + (nxt - raw[i]["timestamp"]) * (k - i) / (j - i), raw[k]))
        i = j
    # Whole conversations, sampled: requests that share their first two blocks (the shared
    # system block and the conversation's first own block) belong to one conversation. Keep
    # each conversation with probability SAMPLE (seeded), in trace order, until there are
    # RATE x DURATION requests: the slice keeps the turns (and the reuse) of 1/SAMPLE times as
    # long a stretch of the trace, whatever the rate, instead of a sliver of unrelated first
    # turns.
    keep = {}
    want = round(a.rate * a.duration)
    rows = []
    for t, r in spread:
        key = tuple(r["hash_ids"][:2])
        if key not in keep:
            keep[key] = rng.random() < a.sample
        if not keep[key]:
            continue
        scaled = max(1, int(r["input_length"] * a.block / 512))
        n = min(blocks_for(scaled, a.block), a.max_input // a.block)
        rows.append({"t": t / 1000.0, "input_length": min(scaled, n * a.block),
                     "output_length": max(1, min(r["output_length"], a.max_output)),
                     "hash_ids": r["hash_ids"][:n]})
        if len(rows) >= want:
            break
    return rescale(rows, a.rate, a.duration)


def noreuse(a, rng):
    rows = []
    t0 = None
    next_id = 50_000_000
    with open(a.trace) as f:
        for rec in csv.DictReader(f):
            ts = datetime.datetime.strptime(rec["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            t0 = ts if t0 is None else t0
            n_in = max(1, min(int(int(rec["ContextTokens"]) * a.scale), a.max_input))
            n = blocks_for(n_in, a.block)
            rows.append({"t": ts - t0, "input_length": n_in,
                         "output_length": max(1, min(int(rec["GeneratedTokens"]), a.max_output)),
                         "hash_ids": list(range(next_id, next_id + n))})
            next_id += n
            if len(rows) > a.rate * a.duration * 4 + 100:
                break
    return rescale(rows, a.rate, a.duration)


def replay_trace(a):
    group = max(1, round(512 * a.words_ratio / a.block))
    out = []
    with open(a.trace) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            ids = r["hash_ids"]
            grouped = [hash(tuple(ids[: i + group])) & 0x7FFF_FFFF_FFFF
                       for i in range(0, len(ids), group)]
            out.append({"timestamp": r["timestamp"],
                        "input_length": max(1, int(r["input_length"] / a.words_ratio)),
                        "output_length": r["output_length"], "hash_ids": grouped})
    write(out, a.out)
    print(f"replay trace: {len(out)} requests, {group} blocks of {a.block} tokens per replay block")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workload")
    w.add_argument("kind", choices=["multiturn", "mooncake", "noreuse"])
    w.add_argument("--out", required=True)
    w.add_argument("--rate", type=float, required=True, help="offered requests per second")
    w.add_argument("--duration", type=float, required=True, help="seconds of arrivals")
    w.add_argument("--block", type=int, default=128)
    w.add_argument("--max-input", type=int, default=1536)
    w.add_argument("--max-output", type=int, default=32)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--trace", help="mooncake: conversation_trace.jsonl; noreuse: Azure conv CSV")
    w.add_argument("--offset", type=float, default=0, help="mooncake: start of the window, s")
    w.add_argument("--sample", type=float, default=0.125,
                   help="mooncake: share of the trace's conversations kept")
    w.add_argument("--scale", type=float, default=1.0, help="noreuse: prompt length multiplier")
    w.add_argument("--agents", type=int, default=4)
    w.add_argument("--system", type=int, default=768, help="multiturn: system prompt tokens")
    w.add_argument("--turn", type=int, default=128, help="multiturn: tokens added per turn")
    w.add_argument("--max-turns", type=int, default=6)
    w.add_argument("--think", type=float, default=6.0, help="multiturn: mean think time, s")
    r = sub.add_parser("replay-trace")
    r.add_argument("trace")
    r.add_argument("--out", required=True)
    r.add_argument("--block", type=int, default=128)
    r.add_argument("--words-ratio", type=float, required=True)
    a = ap.parse_args()
    if a.cmd == "replay-trace":
        return replay_trace(a)
    rng = random.Random(a.seed)
    rows = {"multiturn": multiturn, "mooncake": mooncake, "noreuse": noreuse}[a.kind](a, rng)
    if not rows:
        sys.exit("workload: no requests (rate or duration too small?)")
    write(rows, a.out)
    mean_in = sum(r["input_length"] for r in rows) / len(rows)
    # Blocks that continue a prefix seen earlier in the trace: the hit share an infinite cache
    # would reach (an upper bound for any router).
    seen, reusable, blocks = set(), 0, 0
    for r in rows:
        prefix = ()
        for h in r["hash_ids"]:
            prefix += (h,)
            blocks += 1
            reusable += prefix in seen
            seen.add(prefix)
    print(f"{a.kind}: {len(rows)} requests in {a.duration:g} s ({len(rows) / a.duration:.3f} req/s offered; target {a.rate:.3f}), "
          f"mean input {mean_in:.0f} tokens, {100 * reusable / max(blocks, 1):.0f} % of blocks reusable")


if __name__ == "__main__":
    main()
