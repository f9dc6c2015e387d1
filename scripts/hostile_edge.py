"""The edge cases of the hostile report (scripts/hostile.py) that need a gateway of their own:
API keys, rate limits, SLO routes, the admin guard, credentials and the example secrets.

Two more gateways are started here, in front of small recording backends written below (a
Python HTTP server that keeps every request's headers and can hold an answer or play dead):

- *edge*: `auth:` with three keys (`full`, `narrow` limited to `open-model`, `limited` with
  60 requests per minute), routes `open` / `secret` to recording backends, and `shed` /
  `queue` (ttft_slo 30 s) to a one-slot backend (`max_inflight: 1`);
- *keyed*: no `auth:`, a route that matches on `match.api_keys` and one that looks at no key.

`cases(case, cfg)` registers the cases with hostile.py's `case` decorator.
"""

import http.client
import json
import os
import secrets
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Recorder(ThreadingHTTPServer):
    """A backend that records every request's headers. A message `hold N` holds the answer N
    seconds; `dead` makes it close every connection without an answer (health checks too)."""
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen = []  # the headers of every POST, as (name, value) pairs
        self.inflight = 0
        self.dead = False
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def answer(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.server.dead:
            self.close_connection = True
            return
        if self.path == "/health":
            self.answer(200, {"status": "ok"})
        else:
            self.answer(404, {"error": {"message": "not here", "code": "not_found"}})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.server.dead:
            self.close_connection = True
            return
        with self.server.lock:
            self.server.seen.append(list(self.headers.items()))
            self.server.inflight += 1
        try:
            req = json.loads(body)
            text = req["messages"][-1]["content"]
            if text.startswith("hold "):
                time.sleep(float(text.split()[1]))
            self.answer(200, {
                "id": "chatcmpl-rec", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "recorded"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
        finally:
            with self.server.lock:
                self.server.inflight -= 1


def wait_until(pred, bound, every=0.05):
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(every)
    return pred()


class Gateway:
    """A `pronto serve` with `yaml` (its listen lines added here)."""

    def __init__(self, pronto, out, name, yaml):
        self.port, self.admin = free_port(), free_port()
        self.path = os.path.join(out, f"{name}.yaml")
        with open(self.path, "w") as f:
            f.write(f"listen: 127.0.0.1:{self.port}\nadmin_listen: 127.0.0.1:{self.admin}\n" + yaml)
        self.log = open(os.path.join(out, f"{name}.log"), "w")
        self.proc = subprocess.Popen([pronto, "serve", "--config", self.path],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        if not wait_until(lambda: self.get("/readyz", admin=True)[0] == 200, 30, 0.2):
            raise RuntimeError(f"{name} gateway did not become ready (log: {self.log.name})")

    def call(self, method, path, body=None, headers=None, admin=False, timeout=30):
        """(status, body bytes, headers with lowercase names); status 0 when no answer."""
        c = http.client.HTTPConnection("127.0.0.1", self.admin if admin else self.port, timeout=timeout)
        try:
            c.request(method, path, body, headers or {})
            r = c.getresponse()
            return r.status, r.read(), {k.lower(): v for k, v in r.getheaders()}
        except OSError as e:
            return 0, str(e).encode(), {}
        finally:
            c.close()

    def get(self, path, headers=None, admin=False):
        return self.call("GET", path, None, headers, admin)

    def chat(self, model, key=None, content="hello", headers=None):
        h = {"content-type": "application/json"}
        if key:
            h["authorization"] = f"Bearer {key}"
        h.update(headers or {})
        body = json.dumps({"model": model, "max_tokens": 4,
                           "messages": [{"role": "user", "content": content}]}).encode()
        return self.call("POST", "/v1/chat/completions", body, h)

    def metric(self, series):
        _, text, _ = self.get("/metrics", admin=True)
        for line in text.decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return None

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def code(body):
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "not-json"


def cases(case, cfg):
    pronto, out = cfg["pronto"], cfg["out"]
    keys = {n: f"sk-hostile-{n}-{secrets.token_hex(12)}" for n in ("full", "narrow", "limited")}
    route_key = f"sk-hostile-route-{secrets.token_hex(12)}"
    rec, secret_rec, slot = Recorder(), Recorder(), Recorder()
    health = "health: {interval: 200ms, timeout: 400ms, eject_after_failures: 2, readmit_after: 1s}\n"
    edge = Gateway(pronto, out, "edge", (
        "threads: 1\nretry: {max_retries: 0}\n" + health +
        "auth:\n  keys:\n"
        f"    - {{name: full, key: {keys['full']}}}\n"
        f"    - {{name: narrow, key: {keys['narrow']}, models: [open-model]}}\n"
        f"    - {{name: limited, key: {keys['limited']}}}\n"
        "rate_limits:\n  keys:\n    limited: {requests_per_minute: 60}\n"
        "routes:\n"
        "  - {name: shed, match: {model: slot-model, headers: {x-class: shed}}, pool: slot, ttft_slo: 30s, on_slo_miss: shed}\n"
        "  - {name: queue, match: {model: slot-model}, pool: slot, ttft_slo: 30s, on_slo_miss: queue}\n"
        "  - {name: open, match: {model: open-model}, pool: open-model}\n"
        "  - {name: secret, match: {model: secret-model}, pool: secret-model}\n"
        "pools:\n"
        f"  open-model:\n    backends: [{{name: rec, url: '{rec.url}'}}]\n"
        f"  secret-model:\n    backends: [{{name: secret-rec, url: '{secret_rec.url}'}}]\n"
        f"  slot:\n    backends: [{{name: slot, url: '{slot.url}', max_inflight: 1}}]\n"))
    keyed = Gateway(pronto, out, "keyed", (
        "threads: 1\n" + health +
        "routes:\n"
        f"  - {{name: keyed, match: {{api_keys: [{route_key}]}}, pool: open-model}}\n"
        "  - {name: rest, pool: open-model}\n"
        f"pools:\n  open-model:\n    backends: [{{name: rec, url: '{rec.url}'}}]\n"))
    edge_pid = edge.proc.pid

    @case("429 rate limit, then a retry after Retry-After",
          "429 rate_limit_exceeded with Retry-After; the retry after it is 200", pid=edge_pid)
    def _():
        sent, got = 0, None
        while sent < 80:
            st, body, h = edge.chat("open-model", keys["limited"], f"rate {sent}")
            sent += 1
            if st != 200:
                got = (st, code(body), h.get("retry-after"))
                break
        if got is None:
            return f"{sent} × 200, never limited", 0, False
        st, c, after = got
        wait = int(after) if after and after.isdigit() else None
        if wait is not None:
            time.sleep(wait)
        st2, body2, _ = edge.chat("open-model", keys["limited"], "the retry")
        seen = f"request {sent}: {st} {c}, Retry-After: {after}; retried {wait} s later: {st2}"
        ok = st == 429 and c == "rate_limit_exceeded" and wait is not None and st2 == 200
        return seen, 0, ok

    @case("credentials Pronto uses are not forwarded",
          "the backend never sees a key auth: or match.api_keys matched; an unused key passes through",
          pid=edge_pid)
    def _():
        def headers_of(n):
            return rec.seen[n:]
        n = len(rec.seen)
        st1, _, _ = edge.chat("open-model", keys["full"], "auth on")
        with_auth = headers_of(n)
        n = len(rec.seen)
        st2, _, _ = keyed.chat("open-model", route_key, "route key")
        with_route_key = headers_of(n)
        n = len(rec.seen)
        own = f"sk-client-own-{secrets.token_hex(8)}"
        st3, _, _ = keyed.chat("open-model", own, "own key")
        with_own = headers_of(n)

        def leaked(seen, key):
            return any(key in v for hs in seen for _, v in hs)
        a, b, c = leaked(with_auth, keys["full"]), leaked(with_route_key, route_key), leaked(with_own, own)
        seen = (f"auth: key {st1}, at the backend: {'LEAKED' if a else 'absent'}; match.api_keys "
                f"key {st2}: {'LEAKED' if b else 'absent'}; unused key {st3}: "
                f"{'passed through' if c else 'absent'}")
        ok = (st1, st2, st3) == (200, 200, 200) and len(with_auth) == len(with_route_key) == len(with_own) == 1 \
            and not a and not b and c
        return seen, 0, ok

    @case("overload vs ejection (queue and shed routes, one-slot pool)",
          "busy: shed 429 with Retry-After, queued one served; all down: 503 no_backend_available at once",
          pid=edge_pid)
    def _():
        res = {}

        def send(tag, content, headers=None):
            res[tag] = edge.chat("slot-model", keys["full"], content, headers)
        first = threading.Thread(target=send, args=("first", "hold 2"))
        first.start()
        busy = wait_until(lambda: slot.inflight >= 1, 5)
        shed = edge.chat("slot-model", keys["full"], "shed me", {"x-class": "shed"})
        queued = threading.Thread(target=send, args=("queued", "queued"))
        queued.start()
        first.join()
        queued.join()
        slot.dead = True
        down = wait_until(lambda: edge.metric('pronto_backend_healthy{backend="slot"}') == 0.0, 10)
        outage = []
        for headers in (None, {"x-class": "shed"}):
            t = time.monotonic()
            st, body, h = edge.chat("slot-model", keys["full"], "outage", headers)
            outage.append((st, code(body), h.get("retry-after"), time.monotonic() - t))
        slot.dead = False
        back = wait_until(lambda: edge.chat("slot-model", keys["full"], "back")[0] == 200, 10, 0.2)
        s_st, s_body, s_h = shed
        seen = (f"busy: shed {s_st} {code(s_body)} Retry-After {s_h.get('retry-after')}, "
                f"first {res['first'][0]}, queued {res['queued'][0]}; down: "
                + ", ".join(f"{st} {c} Retry-After {ra} in {t * 1000:.0f} ms" for st, c, ra, t in outage)
                + f"; back: {back}")
        ok = (busy and s_st == 429 and code(s_body) == "slo_overloaded" and s_h.get("retry-after")
              and res["first"][0] == 200 and res["queued"][0] == 200 and down
              and all(st == 503 and c == "no_backend_available" and ra and t < 2 for st, c, ra, t in outage)
              and back)
        return seen, sum(1 for st, _, _, _ in outage if st == 0), ok

    @case("model probing with a restricted key",
          "/v1/models lists only its model; a served and an unknown model it may not use get "
          "the same answer, naming no other model; no key 401",
          pid=edge_pid)
    def _():
        k = {"authorization": f"Bearer {keys['narrow']}"}
        st, body, _ = edge.get("/v1/models", k)
        listed = sorted(m["id"] for m in json.loads(body).get("data", [])) if st == 200 else []
        one_st, one_body, _ = edge.get("/v1/models/secret-model", k)
        chat_st, chat_body, _ = edge.chat("secret-model", keys["narrow"])
        unk_st, unk_body, _ = edge.chat("no-such-model", keys["narrow"])
        anon_st, anon_body, _ = edge.get("/v1/models")
        others = ("slot-model", "open-model")  # never named in an answer about another model
        named = [m for m in others for b in (one_body, chat_body, unk_body) if m.encode() in b]
        seen = (f"/v1/models {st} {listed}; /v1/models/secret-model {one_st} {code(one_body)}; "
                f"secret-model {chat_st} {code(chat_body)}; no-such-model {unk_st} {code(unk_body)}; "
                f"no key {anon_st} {code(anon_body)}; other models named: {sorted(set(named)) or 'none'}")
        # No oracle: a model that is served but not the key's answers as one nobody serves.
        same = (chat_st, code(chat_body)) == (unk_st, code(unk_body))
        ok = (st == 200 and listed == ["open-model"] and one_st == 404 and chat_st in (403, 404)
              and same and anon_st == 401 and not named)
        return seen, 0, ok

    @case("admin POST with a foreign Host or a cross-site Origin",
          "403 for each; the same POST from a plain client 200", pid=edge_pid)
    def _():
        admin = f"127.0.0.1:{edge.admin}"
        tries = [("Host evil.example", {"Host": "evil.example"}),
                 ("Host rebind.example:port", {"Host": f"rebind.example:{edge.admin}"}),
                 ("Origin http://evil.example", {"Host": admin, "Origin": "http://evil.example"}),
                 ("Origin null", {"Host": admin, "Origin": "null"})]
        got = [(what, edge.call("POST", "/admin/reload", b"", h, admin=True)[0]) for what, h in tries]
        plain = edge.call("POST", "/admin/reload", b"", {}, admin=True)[0]
        seen = ", ".join(f"{w}: {s}" for w, s in got) + f"; plain: {plain}"
        return seen, 0, all(s == 403 for _, s in got) and plain == 200

    @case("a config with the repository's example secrets",
          "refused at start (non-zero exit, the field named) for each", pid=edge_pid)
    def _():
        base = f"pools:\n  open-model:\n    backends: [{{name: rec, url: '{rec.url}'}}]\n"
        # field path the refusal must name -> the config's lines with that example secret
        tries = {
            "admin.token": "admin: {token: example-admin-token-change-me}\n",
            "auth.keys[0].key": "auth:\n  keys: [{name: a, key: sk-example-team-a-change-me}]\n",
            "routes[0].match.api_keys[0]": (
                "routes:\n  - {name: r, match: {api_keys: [sk-example-route-key-change-me]}, "
                "pool: open-model}\n"),
        }
        seen = []
        ok = True
        for what, extra in tries.items():
            path = os.path.join(out, f"example-secret-{what.split('.')[0].split('[')[0]}.yaml")
            with open(path, "w") as f:
                f.write(f"listen: 127.0.0.1:{free_port()}\nadmin_listen: 127.0.0.1:{free_port()}\n"
                        + extra + base)
            p = subprocess.Popen([pronto, "serve", "--config", path], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            try:
                text, _ = p.communicate(timeout=15)
                refused = (p.returncode != 0 and "published in Pronto's repository" in text
                           and f"{what}: this is the example" in text)
                seen.append(f"{what}: exit {p.returncode}" + (", named" if refused else " (not refused)"))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                refused = False
                seen.append(f"{what}: served")
            ok = ok and refused
        return "; ".join(seen), 0, ok

    edge.stop()
    keyed.stop()
    for r in (rec, secret_rec, slot):
        r.shutdown()
