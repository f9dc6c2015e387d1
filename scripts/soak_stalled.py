#!/usr/bin/env python3
"""Stalled readers mixed into a soak (scripts/soak.sh): every EVERY seconds, a batch of N
raw-socket clients (4 KiB receive buffer, 536-byte MSS, as scripts/stalled-readers.py) each
open a long stream through the gateway and never read it. The batch is *released* when the
gateway's `pronto_client_stalled_total` has risen by N and every client finds its connection
reset or closed. One JSON line per batch goes to OUT:

  {"t": seconds since START, "readers": N, "counted": stall counter delta,
   "reset": .., "closed": .., "still_open": .., "released_s": seconds to the last count}

Usage: soak_stalled.py --target HOST:PORT --admin HOST:PORT --model M --start EPOCH
           --until EPOCH --out FILE [--every 120] [--readers 20] [--first 45]
           [--max-tokens 8000] [--bound 120]
No batch starts unless it can be waited for (`--bound` seconds) before --until.
"""

import argparse
import http.client
import json
import socket
import time


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--admin", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--until", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--every", type=float, default=120)
    p.add_argument("--first", type=float, default=45)
    p.add_argument("--readers", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=8000)
    p.add_argument("--bound", type=float, default=120)
    return p.parse_args()


def addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def stalled(admin):
    """The sum of every `pronto_client_stalled_total` series, or None when unreachable."""
    try:
        c = http.client.HTTPConnection(*admin, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith("pronto_client_stalled_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def batch(a, target, admin):
    before = stalled(admin) or 0.0
    body = json.dumps({"model": a.model, "max_tokens": a.max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": "a stalled reader: tell me everything"}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    socks, refused = [], 0
    t0 = time.monotonic()
    for _ in range(a.readers):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        try:
            s.connect(target)
            s.sendall(head + body)
            socks.append(s)
        except OSError:
            refused += 1
            s.close()
    counted, released_s = 0.0, None
    end = t0 + a.bound
    while time.monotonic() < end:
        now = stalled(admin)
        if now is not None:
            counted = now - before
            if counted >= len(socks):
                released_s = time.monotonic() - t0
                break
        time.sleep(1.0)
    reset = closed = still_open = 0
    for s in socks:
        s.settimeout(5)
        try:
            while s.recv(1 << 20):
                pass
            closed += 1
        except ConnectionResetError:
            reset += 1
        except socket.timeout:
            still_open += 1
        except OSError:
            reset += 1
        s.close()
    return {"readers": a.readers, "opened": len(socks), "refused": refused,
            "counted": int(counted), "reset": reset, "closed": closed,
            "still_open": still_open, "released_s": released_s}


def main():
    a = args()
    target, admin = addr(a.target), addr(a.admin)
    next_at = a.start + a.first
    while True:
        now = time.time()
        if now + a.bound > a.until:
            break
        if now < next_at:
            time.sleep(min(next_at - now, 1.0))
            continue
        t = time.time() - a.start
        r = batch(a, target, admin)
        r["t"] = round(t, 1)
        with open(a.out, "a") as f:
            f.write(json.dumps(r) + "\n")
        next_at += a.every


if __name__ == "__main__":
    main()
