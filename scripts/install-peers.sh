#!/usr/bin/env bash
# Reference peers for parity tests and benchmarks, installed from npm outside the repository:
# llama.cpp (node-llama-cpp), Hugging Face tokenizers, and the official openai client.
# Idempotent; TYCHO_PEERS_DIR (default /opt/tycho-peers) holds them. Tests that need a peer look
# there and skip (exit 77) when it is absent.
set -euo pipefail
DIR=${TYCHO_PEERS_DIR:-/opt/tycho-peers}
if ! command -v npm >/dev/null 2>&1; then
  echo "install-peers: npm not found; skipping" >&2
  exit 1
fi
install_one() { # dir marker packages...
  local sub=$1 marker=$2; shift 2
  if [ -e "$DIR/$sub/node_modules/$marker/package.json" ]; then
    return 0
  fi
  mkdir -p "$DIR/$sub"
  echo "install-peers: npm install $* into $DIR/$sub"
  npm install --silent --no-audit --no-fund --prefix "$DIR/$sub" "$@"
}
install_one llamacpp node-llama-cpp -E node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1 \
  --omit=optional --ignore-scripts
install_one hftok tokenizers tokenizers
install_one openai openai openai
echo "install-peers: peers in $DIR"
