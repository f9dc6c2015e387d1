#!/usr/bin/env bash
# The raw HTTP/1.1 framing suite (tests/fixtures/framing/cases.json, the same cases
# tests/framing.rs asserts) against Pronto and against nginx, side by side: a Markdown table
# of what each answered (statuses of every answer, then whether the connection was closed
# within 3 s). Pronto runs in front of a one-backend simulated fleet; nginx (Debian's) on
# 127.0.0.1 with a temporary config, proxying to a trivial upstream (an nginx server block
# answering 200). docs/reliability.md records one run.
#   scripts/framing-vs-nginx.sh      env: PRONTO (default target/release/pronto, else
#                                    target/debug/pronto), NGINX (default nginx), OUT
set -euo pipefail
cd "$(dirname "$0")/.."
pronto="${PRONTO:-target/release/pronto}"
[ -x "$pronto" ] || pronto=target/debug/pronto
[ -x "$pronto" ] || { echo "framing-vs-nginx: no pronto binary (cargo build --bin pronto)" >&2; exit 2; }
nginx="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"
[ -x "$nginx" ] || { echo "framing-vs-nginx: nginx not found (apt-get install nginx)" >&2; exit 2; }
out="${OUT:-$(mktemp -d /tmp/pronto-framing.XXXX)}"
mkdir -p "$out/nginx"
port=$((20000 + RANDOM % 20000))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Pronto in front of one simulated backend.
cat > "$out/fleet.yaml" <<EOF
model: m
backends:
  - {name: b0, profile: h100-llama3-8b, port: $((port + 2))}
EOF
"$pronto" sim-fleet --config "$out/fleet.yaml" --time-scale 0.01 >"$out/fleet.log" 2>&1 & pids+=($!)
cat > "$out/pronto.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$((port + 1))
threads: 2
pools:
  m:
    policy: round_robin
    backends:
      - {name: b0, url: 'http://127.0.0.1:$((port + 2))'}
EOF
for _ in $(seq 150); do curl -sf "http://127.0.0.1:$((port + 2))/health" >/dev/null && break; sleep 0.2; done
"$pronto" serve --config "$out/pronto.yaml" >"$out/gateway.log" 2>&1 & pids+=($!)
for _ in $(seq 150); do curl -sf "http://127.0.0.1:$((port + 1))/readyz" >/dev/null && break; sleep 0.2; done

# nginx proxying to an upstream that answers 200 to everything.
n="$out/nginx"
cat > "$n/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $n/nginx.pid;
error_log $n/error.log info;
events { worker_connections 64; }
http {
  access_log $n/access.log;
  client_body_temp_path $n/body; proxy_temp_path $n/proxy; fastcgi_temp_path $n/fcgi;
  uwsgi_temp_path $n/uwsgi; scgi_temp_path $n/scgi;
  server { listen 127.0.0.1:$((port + 4)); location / { return 200 '{"ok":true}'; } }
  server {
    listen 127.0.0.1:$((port + 3));
    location / { proxy_pass http://127.0.0.1:$((port + 4)); proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
"$nginx" -c "$n/nginx.conf" -p "$n" & pids+=($!)
for _ in $(seq 50); do curl -s "http://127.0.0.1:$((port + 3))/" >/dev/null && break; sleep 0.1; done

python3 scripts/framing_cases.py run "127.0.0.1:$port" m > "$out/pronto.json"
python3 scripts/framing_cases.py run "127.0.0.1:$((port + 3))" m > "$out/nginx.json"
echo "framing-vs-nginx: $("$pronto" --version), $("$nginx" -v 2>&1); output in $out" >&2
python3 scripts/framing_cases.py table "$out/pronto.json:Pronto" "$out/nginx.json:nginx $("$nginx" -v 2>&1 | sed 's|.*/||')" | tee "$out/table.md"
