#!/usr/bin/env python3
"""Hostile clients mixed into a soak (scripts/soak.sh): every EVERY seconds, one pass over the
raw HTTP/1.1 framing suite (tests/fixtures/framing/cases.json, through scripts/framing_cases.py)
and a few malformed requests (malformed JSON, non-UTF-8, JSON nested 100 000 deep, a body over
max_body_bytes, an unknown model). Each case is sent on a fresh connection and its answer
compared with what the suite (or the error vocabulary) expects. One JSON line per case:

  {"t": seconds since START, "pass": K, "case": NAME, "expected": .., "seen": .., "ok": bool}

Usage: soak_hostile.py --target HOST:PORT --model M --start EPOCH --until EPOCH --out FILE
           [--every 60] [--first 30] [--max-body 32MiB-in-bytes]
"""

import argparse
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import framing_cases  # noqa: E402


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--until", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--every", type=float, default=60)
    p.add_argument("--first", type=float, default=30)
    p.add_argument("--max-body", type=int, default=32 << 20)
    return p.parse_args()


def head(length, extra=""):
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"{extra}Content-Length: {length}\r\n\r\n").encode()


def chat(model, content="hello"):
    return json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": content}]}).encode()


def malformed(model, max_body):
    """(name, raw bytes, expected "STATUS code")."""
    bad_utf8 = chat(model, "hello XX").replace(b"XX", b"\xff\xfe")
    deep = b'{"model":"m","messages":' + b"[" * 100000 + b"]" * 100000 + b"}"
    unknown = chat("no-such-model")
    return [
        ("malformed JSON", head(9) + b"{not json", "400 invalid_request"),
        ("non-UTF-8 in the body", head(len(bad_utf8)) + bad_utf8, "400 invalid_request"),
        ("JSON nested 100 000 deep", head(len(deep)) + deep, "400 invalid_request"),
        ("body over max_body_bytes (declared)", head(2 * max_body), "413 request_too_large"),
        ("unknown model", head(len(unknown)) + unknown, "404 model_not_found"),
    ]


def answer(target, data):
    """`STATUS code` of the first answer to `data` on a fresh connection."""
    s = socket.create_connection(target, timeout=10)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        out, _ = framing_cases.read_all(s)
    finally:
        s.close()
    if not out:
        return "no answer"
    try:
        status = int(out.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return "not HTTP"
    try:
        code = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"]
    except Exception:
        code = "not-json"
    return f"{status} {code}"


def one_pass(a, target, k):
    rows = []
    cases = json.load(open(framing_cases.CASES))["cases"]
    for c in cases:
        want = f"{c['status']}, {c['responses']} answer(s), closed"
        try:
            r = framing_cases.run_case(target, framing_cases.expand(c["raw"], a.model))
            seen = framing_cases.cell(r)
            ok = (r["statuses"][:1] == [c["status"]] and len(r["statuses"]) == c["responses"]
                  and r["closed"])
        except OSError as e:
            seen, ok = f"error: {e}", False
        rows.append((f"framing: {c['name']}", want, seen, ok))
    for name, data, want in malformed(a.model, a.max_body):
        try:
            seen = answer(target, data)
        except OSError as e:
            seen = f"error: {e}"
        rows.append((name, want, seen, seen == want))
    t = round(time.time() - a.start, 1)
    with open(a.out, "a") as f:
        for name, want, seen, ok in rows:
            f.write(json.dumps({"t": t, "pass": k, "case": name, "expected": want,
                                "seen": seen, "ok": ok}) + "\n")


def main():
    a = args()
    host, port = a.target.rsplit(":", 1)
    target = (host, int(port))
    next_at, k = a.start + a.first, 0
    # A pass takes seconds; none starts in the last 20 s.
    while time.time() + 20 < a.until:
        if time.time() < next_at:
            time.sleep(1.0)
            continue
        one_pass(a, target, k)
        k += 1
        next_at += a.every


if __name__ == "__main__":
    main()
