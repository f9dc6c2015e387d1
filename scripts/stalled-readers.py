#!/usr/bin/env python3
"""Many stalled readers at once (issue 42, item 2): a gateway in front of a small simulated
fleet; N raw-socket clients (4 KiB receive buffer, 536-byte MSS) each open a long stream and
never read it,
all at once, while one normal client keeps sending short requests. Reports, as Markdown:

- whether every stalled reader was released: `pronto_client_stalled_total` reaches N, every
  engine aborted its request (`sim_aborted_requests_total`) and runs none
  (`vllm:num_requests_running` 0), the gateway's `pronto_backend_inflight` is 0, and each
  client sees its connection reset;
- the gateway's peak RSS (VmHWM of /proc/PID/status) and its RSS at the end;
- the normal client's answers throughout (successes / failures).

Not in CI (it opens thousands of sockets); docs/reliability.md records one run.

Usage: scripts/stalled-readers.py [--pronto target/release/pronto] [--readers 1000]
           [--backends 4] [--write-timeout 2s]
"""

import argparse
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

MODEL = "stall-model"


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--pronto", default=os.environ.get("PRONTO", "target/release/pronto"))
    p.add_argument("--readers", type=int, default=1000)
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--write-timeout", default="2s")
    p.add_argument("--time-scale", default="0.01")
    return p.parse_args()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metrics(host, port, path="/metrics"):
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", path)
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def family(m, name):
    """The sum of every series of `name`."""
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def status(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return -1


def wait_until(cond, bound, every=0.2):
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(every)
    return cond()


def body(content, max_tokens, stream):
    return json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                       "messages": [{"role": "user", "content": content}]}).encode()


def main():
    a = args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * a.readers + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if not os.access(a.pronto, os.X_OK):
        sys.exit(f"stalled-readers: {a.pronto} not built (cargo build --release --bin pronto)")
    out = tempfile.mkdtemp(prefix="pronto-stalled-")
    procs = []
    try:
        # The fleet: backends on ephemeral ports, printed as name<TAB>url<TAB>profile.
        fleet = subprocess.Popen(
            [a.pronto, "sim-fleet", "--backends", str(a.backends), "--base-port", "0",
             "--model", MODEL, "--num-kv-blocks", "400000", "--time-scale", a.time_scale],
            stdout=subprocess.PIPE, stderr=open(f"{out}/fleet.log", "w"), text=True)
        procs.append(fleet)
        urls = []
        while len(urls) < a.backends:
            fields = fleet.stdout.readline().split("\t")
            if len(fields) >= 2 and fields[1].startswith("http://"):
                urls.append(fields[1].strip())
        port, admin = free_port(), free_port()
        config = [f"listen: 127.0.0.1:{port}", f"admin_listen: 127.0.0.1:{admin}", "threads: 2",
                  "limits:", f"  write_timeout: {a.write_timeout}",
                  f"  max_connections: {a.readers + 100}", "retry: {max_retries: 0}",
                  "pools:", f"  {MODEL}:", "    policy: least_inflight", "    backends:"]
        config += [f"      - {{name: b{i}, url: '{u}'}}" for i, u in enumerate(urls)]
        open(f"{out}/pronto.yaml", "w").write("\n".join(config) + "\n")
        gw = subprocess.Popen([a.pronto, "serve", "--config", f"{out}/pronto.yaml"],
                              stdout=open(f"{out}/gateway.log", "w"), stderr=subprocess.STDOUT,
                              env={**os.environ, "RUST_LOG": "warn"})
        procs.append(gw)
        if not wait_until(lambda: ready(admin), 30):
            sys.exit(f"stalled-readers: the gateway did not become ready (log: {out}/gateway.log)")
        base_rss = status(gw.pid, "VmRSS")

        # The normal client, throughout.
        served = {"ok": 0, "failed": 0, "slowest_s": 0.0}
        stop = threading.Event()

        def normal():
            while not stop.is_set():
                t = time.monotonic()
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    c.request("POST", "/v1/chat/completions", body=body("hello", 8, False),
                              headers={"content-type": "application/json"})
                    r = c.getresponse()
                    r.read()
                    c.close()
                    served["ok" if r.status == 200 else "failed"] += 1
                except OSError:
                    served["failed"] += 1
                served["slowest_s"] = max(served["slowest_s"], time.monotonic() - t)
                time.sleep(0.05)

        normal_thread = threading.Thread(target=normal, daemon=True)
        normal_thread.start()

        # The stalled readers: all open at once, none ever reads.
        started = time.monotonic()
        readers = []
        req = body("tell me everything", 100000, True)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"content-type: application/json\r\nContent-Length: {len(req)}\r\n\r\n").encode()
        for _ in range(a.readers):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            # A small MSS keeps the gateway's send buffer for this connection small (Linux
            # sizes it from the MSS and the congestion window): the reader stalls within tens
            # of KB instead of the ~3 MB a loopback connection buffers.
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
            s.connect(("127.0.0.1", port))
            s.sendall(head + req)
            readers.append(s)
        opened_s = time.monotonic() - started

        def stalled():
            return family(metrics("127.0.0.1", admin), "pronto_client_stalled_total")

        released = wait_until(lambda: stalled() >= a.readers, 600, every=1.0)
        released_s = time.monotonic() - started
        sims = [metrics(u.split("//")[1].split(":")[0], int(u.rsplit(":", 1)[1])) for u in urls]
        drained = wait_until(lambda: all(
            family(metrics(u.split("//")[1].split(":")[0], int(u.rsplit(":", 1)[1])),
                   "vllm:num_requests_running") == 0 for u in urls), 30)
        sims = [metrics(u.split("//")[1].split(":")[0], int(u.rsplit(":", 1)[1])) for u in urls]
        aborted = sum(family(m, "sim_aborted_requests_total") for m in sims)
        running = sum(family(m, "vllm:num_requests_running") for m in sims)
        gm = metrics("127.0.0.1", admin)
        inflight = family(gm, "pronto_backend_inflight")
        stalls = family(gm, "pronto_client_stalled_total")
        # Each reader, reading now, finds its connection reset (or closed).
        resets = closed = still_open = 0
        for s in readers:
            s.settimeout(5)
            try:
                while s.recv(1 << 20):
                    pass
                closed += 1
            except ConnectionResetError:
                resets += 1
            except socket.timeout:
                still_open += 1
            s.close()
        time.sleep(2)
        stop.set()
        normal_thread.join(timeout=60)
        peak = status(gw.pid, "VmHWM")
        end_rss = status(gw.pid, "VmRSS")
        version = subprocess.run([a.pronto, "--version"], capture_output=True, text=True).stdout.strip()

        ok = (released and drained and aborted >= a.readers and running == 0 and inflight == 0
              and still_open == 0 and served["failed"] == 0 and served["ok"] > 0)
        print(f"stalled readers: {version} ({a.pronto}), {a.readers} readers (MSS 536), "
              f"{a.backends} simulated backends (time scale {a.time_scale}), "
              f"write_timeout {a.write_timeout}\n")
        print("| measure | value |")
        print("|---|---|")
        print(f"| readers opened (all at once) | {a.readers} in {opened_s:.1f} s |")
        print(f"| released (`pronto_client_stalled_total`) | {stalls:.0f} / {a.readers}, "
              f"all {released_s:.1f} s after the first opened |")
        print(f"| engine aborts (`sim_aborted_requests_total`) | {aborted:.0f} |")
        print(f"| engine running after (`vllm:num_requests_running`) | {running:.0f} |")
        print(f"| gateway in flight after (`pronto_backend_inflight`) | {inflight:.0f} |")
        print(f"| readers' connections | {resets} reset, {closed} closed, {still_open} still open |")
        print(f"| gateway RSS: start / peak (VmHWM) / end | {base_rss} / {peak} / {end_rss} MiB |")
        print(f"| normal client throughout | {served['ok']} × 200, {served['failed']} failed, "
              f"slowest {served['slowest_s']:.2f} s |")
        print(f"\n{'as expected' if ok else 'NOT as expected'}")
        sys.exit(0 if ok else 1)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def ready(admin):
    try:
        c = http.client.HTTPConnection("127.0.0.1", admin, timeout=2)
        c.request("GET", "/readyz")
        ok = c.getresponse().status == 200
        c.close()
        return ok
    except OSError:
        return False


if __name__ == "__main__":
    main()
