#!/usr/bin/env python3
"""Replay a real-fleet trace straight at the engines, round robin, no router (scripts/real-fleet-sim.sh).

A same-host anchor for the simulator: the trace's requests go open loop, at their own
timestamps, to engine i mod N (what the evaluator's `round_robin` does), as token-id prompts on
/v1/completions: every hash id stands for BLOCK token ids drawn from a generator seeded with the
id, so prompts share exactly the prefixes the trace says, at the engines' own block grain, and
have exactly `input_length` tokens (no chat template, no tokenizer round trip). Each request
generates `output_length` tokens (ignore_eos). TTFT = the first streamed chunk − the request's
scheduled send time, measured here.

  real_fleet_direct.py TRACE --engine URL --engine URL --model NAME --out FILE.json
"""
import argparse
import asyncio
import json
import random
import time

import aiohttp


def prompt_ids(row, block, lo, hi):
    ids = []
    for h in row["hash_ids"]:
        rng = random.Random(h)
        ids.extend(rng.randrange(lo, hi) for _ in range(block))
    n = row["input_length"]
    if len(ids) < n:  # more tokens than the hash ids cover: unique to this request
        rng = random.Random(f"unique-{row['timestamp']}-{len(ids)}")
        ids.extend(rng.randrange(lo, hi) for _ in range(n - len(ids)))
    return ids[:n]


def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


async def one(session, url, body, at, t0):
    delay = t0 + at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = t0 + at
    first = None
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                return {"error": f"HTTP {resp.status}: {(await resp.text())[:200]}"}
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                if first is None:
                    first = time.monotonic()
        return {"ttft_ms": (first - sent) * 1e3, "e2e_ms": (time.monotonic() - sent) * 1e3}
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return {"error": repr(e)}


async def run(a):
    rows = [json.loads(l) for l in open(a.trace) if l.strip()]
    timeout = aiohttp.ClientTimeout(total=a.timeout)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.monotonic() + 1.0
        tasks = []
        for i, r in enumerate(rows):
            body = {"model": a.model, "prompt": prompt_ids(r, a.block, a.lo, a.hi),
                    "max_tokens": r["output_length"], "ignore_eos": True, "stream": True}
            url = a.engine[i % len(a.engine)]
            tasks.append(one(session, url, body, r["timestamp"] / 1e3, t0))
        results = await asyncio.gather(*tasks)
    ttft = [x["ttft_ms"] for x in results if "ttft_ms" in x]
    errors = [x["error"] for x in results if "error" in x]
    out = {"trace": a.trace, "engines": a.engine, "requests": len(rows), "completed": len(ttft),
           "errors": errors[:5], "n_errors": len(errors),
           "ttft_mean_ms": sum(ttft) / len(ttft) if ttft else float("nan"),
           "ttft_p50_ms": percentile(ttft, 0.5), "ttft_p90_ms": percentile(ttft, 0.9),
           "ttft_p99_ms": percentile(ttft, 0.99), "ttft_ms": ttft}
    with open(a.out, "w") as f:
        json.dump(out, f)
    print(f"direct: {a.trace}: {len(ttft)}/{len(rows)} completed, TTFT mean {out['ttft_mean_ms']:.0f} ms, "
          f"p50 {out['ttft_p50_ms']:.0f}, p90 {out['ttft_p90_ms']:.0f}, p99 {out['ttft_p99_ms']:.0f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--engine", action="append", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--lo", type=int, default=100, help="smallest token id drawn (skips special tokens)")
    ap.add_argument("--hi", type=int, default=4000, help="token ids are drawn below this")
    ap.add_argument("--timeout", type=float, default=600)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
