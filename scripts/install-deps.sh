#!/usr/bin/env bash
# Install every Debian package Tycho builds, tests or benchmarks against (DESIGN.md §10).
# Idempotent: packages already present are skipped; with nothing missing it touches nothing.
# Run as root on Debian 12 (or with sudo available). CUDA is optional and never installed here:
# the build finds /usr/local/cuda or nvcc on PATH by itself.
set -euo pipefail

pkgs=(
  # build
  build-essential cmake pkg-config git clang
  # libraries
  libuv1-dev libhttp-parser-dev libjansson-dev
  libprotobuf-c-dev protobuf-c-compiler
  libyaml-dev libcyaml-dev libxxhash-dev
  libpcre2-dev libutf8proc-dev libopenblas-dev
  liburing-dev libibverbs-dev librdmacm-dev
  libjemalloc-dev libsystemd-dev libcurl4-openssl-dev libssl-dev
  libcmocka-dev
  # tests and benchmarks: real peers
  etcd-server etcd-client iperf3 redis-server memcached
  iproute2 procps curl gnuplot-nox python3 python3-yaml openssl
)
# Node.js runs the reference clients (openai, tokenizers, node-llama-cpp); a machine that has
# node and npm from elsewhere keeps them (Debian's npm conflicts with other nodejs builds).
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

SUDO=
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Debian starts these daemons on install; tests start their own instances on other ports.
for svc in redis-server memcached etcd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    $SUDO systemctl stop "$svc" || true
  fi
done
echo "install-deps: done"
