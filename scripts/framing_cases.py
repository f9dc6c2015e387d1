#!/usr/bin/env python3
"""The raw HTTP/1.1 framing suite (tests/fixtures/framing/cases.json) against any server.

Each case is sent at once on a fresh connection; the answers are read until the server
closes the connection (or BOUND seconds pass) and parsed one after another, so a server that
kept parsing after a framing error shows a second answer (the case's probe request).

  framing_cases.py run HOST:PORT MODEL > results.json   one server, every case
  framing_cases.py table A.json:NAME B.json:NAME ...     a Markdown table of the runs

The same expansion of the case templates lives in tests/framing.rs (cases.json's `about`).
"""

import json
import os
import re
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "..", "tests", "fixtures", "framing", "cases.json")
BOUND = 3.0


def body(model):
    return json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hello there"}]},
                      separators=(",", ":"))


def expand(raw, model):
    b = body(model)
    b1, b2 = b[:10], b[10:]
    subs = {
        "{H}": "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
        "{N}": "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "{BL}": str(len(b)), "{BXU}": "%X" % len(b), "{BX}": "%x" % len(b),
        "{B1X}": "%x" % len(b1), "{B2X}": "%x" % len(b2),
        "{B1}": b1, "{B2}": b2, "{B}": b,
    }
    out = re.sub(r"\{A\*(\d+)\}", lambda m: "a" * int(m.group(1)), raw)
    # Longest placeholders first ({BXU} before {BX}, {B1X} before {B1}).
    for k in sorted(subs, key=len, reverse=True):
        out = out.replace(k, subs[k])
    return out.encode("latin-1")


def read_all(sock):
    """Bytes until the peer closes (closed=True) or BOUND seconds pass."""
    sock.settimeout(BOUND)
    deadline = time.monotonic() + BOUND
    out = b""
    while time.monotonic() < deadline:
        try:
            b = sock.recv(65536)
        except socket.timeout:
            return out, False
        except ConnectionResetError:
            return out, True
        if not b:
            return out, True
        out += b
    return out, False


def responses(data):
    """The statuses of the HTTP/1.x responses in `data`, in order."""
    statuses = []
    while data:
        end = data.find(b"\r\n\r\n")
        if end < 0 or not data.startswith(b"HTTP/1."):
            break
        head = data[:end].decode("latin-1").split("\r\n")
        try:
            status = int(head[0].split(" ")[1])
        except (IndexError, ValueError):
            break
        statuses.append(status)
        rest = data[end + 4:]
        fields = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip()
                  for l in head[1:] if ":" in l}
        if "content-length" in fields:
            rest = rest[int(fields["content-length"]):]
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line_end = rest.find(b"\r\n")
                if line_end < 0:
                    rest = b""
                    break
                size = int(rest[:line_end].split(b";")[0], 16)
                rest = rest[line_end + 2 + size + 2:]
                if size == 0:
                    break
        data = rest
    return statuses


def run_case(addr, raw):
    s = socket.create_connection(addr, timeout=BOUND)
    try:
        s.sendall(raw)
        data, closed = read_all(s)
    finally:
        s.close()
    return {"statuses": responses(data), "closed": closed}


def run(addr, model):
    cases = json.load(open(CASES))["cases"]
    out = []
    for c in cases:
        r = run_case(addr, expand(c["raw"], model))
        r.update(name=c["name"], cls=c["class"], expected={
            k: c[k] for k in ("status", "responses", "backend")})
        out.append(r)
    return out


def cell(r):
    if not r["statuses"]:
        return "no answer, " + ("closed" if r["closed"] else "open")
    s = "/".join(str(x) for x in r["statuses"])
    return f"{s}, {'closed' if r['closed'] else 'open'}"


def table(runs):
    names = [n for n, _ in runs]
    print("| case | class | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    differ = 0
    for rows in zip(*(r for _, r in runs)):
        cells = [cell(r) for r in rows]
        differ += len(set(cells)) > 1
        print(f"| {rows[0]['name']} | {rows[0]['cls']} | " + " | ".join(cells) + " |")
    print(f"\n{len(runs[0][1])} cases; the answers differ on {differ}.")


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "run":
        host, port = sys.argv[2].rsplit(":", 1)
        json.dump(run((host, int(port)), sys.argv[3]), sys.stdout, indent=1)
    elif len(sys.argv) >= 3 and sys.argv[1] == "table":
        runs = []
        for arg in sys.argv[2:]:
            path, name = arg.rsplit(":", 1)
            runs.append((name, json.load(open(path))))
        table(runs)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
