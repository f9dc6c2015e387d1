#!/usr/bin/env bash
# Issue 44's literal keep-alive case (not in CI: it takes DELAY): a stream whose first token
# comes DELAY (90 s) after it is sent, behind nginx with `proxy_read_timeout` READ_TIMEOUT
# (60 s, nginx's default) in front of Pronto. Two requests at once through the same nginx:
# one on a route with `keepalive: KEEPALIVE` (15 s), one on a route without. With keep-alives
# the client gets its answer; without them nginx gives up at READ_TIMEOUT (504).
#
# The slow first token is the simulated backend's `stall_first_token` fault: the engine
# prefills as usual and the first token is held DELAY (wall time) — to the gateway and to
# nginx, a DELAY-long prefill (nothing arrives before the first token either way).
#
# Prints a Markdown table (status, time, keep-alives received, whether the stream ended with
# [DONE]) on stdout; docs/reliability.md records one run.
#
# Usage: ./scripts/keepalive-nginx.sh
# Environment (all optional): DELAY=90s READ_TIMEOUT=60s KEEPALIVE=15s
#   BIN=PATH  pronto binary (default $CARGO_TARGET_DIR/debug/pronto, built unless SKIP_BUILD=1)
#   NGINX=PATH  (default: nginx on PATH, else /usr/sbin/nginx)
set -euo pipefail
cd "$(dirname "$0")/.."

DELAY=${DELAY:-90s}
READ_TIMEOUT=${READ_TIMEOUT:-60s}
KEEPALIVE=${KEEPALIVE:-15s}
MODEL=sim-model
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug/pronto}
if [[ -z ${SKIP_BUILD:-} ]]; then
    cargo build --locked --bin pronto >&2
fi
[[ -x "$BIN" ]] || { echo "keepalive-nginx: $BIN not found" >&2; exit 1; }
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
[[ -x "$NGINX" ]] || { echo "keepalive-nginx: nginx not found (apt-get install nginx)" >&2; exit 1; }

source scripts/lib/live.sh
live_init keepalive-nginx

cat >"$TMP/fleet.yaml" <<EOF
model: $MODEL
backends:
  - { name: b0, profile: h100-llama3-8b, num_kv_blocks: 8000, port: 0, faults: { stall_first_token: $DELAY } }
EOF
start_fleet "$TMP/fleet.log" 1 --config "$TMP/fleet.yaml"

gateway_yaml() { # $1: port, $2: admin port
    cat <<EOF
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
threads: 2
limits: {first_token_timeout: 5m}
routes:
  - { name: keepalive, pool: $MODEL, keepalive: $KEEPALIVE, match: { headers: { x-keepalive: "on" } } }
  - { name: plain, pool: $MODEL }
pools:
  $MODEL:
    backends:
$FLEET_BACKENDS
EOF
}
start_gateway gateway_yaml

mkdir -p "$TMP/nginx"
cat >"$TMP/nginx/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx.log warn;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx/body;
  proxy_temp_path $TMP/nginx/proxy;
  fastcgi_temp_path $TMP/nginx/fastcgi;
  uwsgi_temp_path $TMP/nginx/uwsgi;
  scgi_temp_path $TMP/nginx/scgi;
  server {
    listen unix:$TMP/nginx/nginx.sock;
    location / {
      proxy_pass http://127.0.0.1:$GW_PORT;
      proxy_http_version 1.1;
      proxy_buffering off;
      proxy_read_timeout $READ_TIMEOUT;
    }
  }
}
EOF
"$NGINX" -p "$TMP/nginx" -e "$TMP/nginx.log" -c "$TMP/nginx/nginx.conf" </dev/null >>"$TMP/nginx.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 100); do [[ -S "$TMP/nginx/nginx.sock" ]] && break; sleep 0.1; done
[[ -S "$TMP/nginx/nginx.sock" ]] || live_die "nginx did not start"

body='{"model": "'$MODEL'", "stream": true, "max_tokens": 8, "messages": [{"role": "user", "content": "a long prompt"}]}'
ask() { # $1: name, $2...: extra curl args
    local name=$1
    shift
    curl -sS --unix-socket "$TMP/nginx/nginx.sock" -o "$TMP/$name.body" \
        -w '%{http_code} %{time_total}' -H 'content-type: application/json' "$@" \
        -d "$body" http://localhost/v1/chat/completions >"$TMP/$name.out" 2>>"$TMP/curl.log" || true
}
echo "keepalive-nginx: two streams, first token after $DELAY, nginx proxy_read_timeout $READ_TIMEOUT" >&2
ask with -H 'x-keepalive: on' &
with=$!
ask without &
without=$!
wait "$with" "$without"

echo "| route | nginx proxy_read_timeout | first token after | HTTP status | time s | keep-alives received | ends with [DONE] |"
echo "|---|---|---|---:|---:|---:|---|"
for name in with without; do
    read -r status secs <"$TMP/$name.out" || true
    kas=$(grep -c '^: keep-alive' "$TMP/$name.body" || true)
    done_=$(grep -q '^data: \[DONE\]' "$TMP/$name.body" && echo yes || echo no)
    route=$([[ $name == with ]] && echo "keepalive: $KEEPALIVE" || echo "no keepalive")
    printf '| %s | %s | %s | %s | %.1f | %s | %s |\n' "$route" "$READ_TIMEOUT" "$DELAY" \
        "${status:-none}" "${secs:-0}" "$kas" "$done_"
done
