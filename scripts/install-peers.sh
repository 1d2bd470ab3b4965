#!/usr/bin/env bash
# Reference peers for parity tests and benchmarks, installed from npm outside the repository:
# llama.cpp (node-llama-cpp), Hugging Face tokenizers, and the official openai client (with the
# ajv JSON-schema validator beside it, the peer that checks structured output).
# Idempotent; TYCHO_PEERS_DIR (default /opt/tycho-peers) holds them. Tests that need a peer look
# there and skip (exit 77) when it is absent.
#
# Each peer folder gets a package.json written here with exact versions, so that every machine
# gets the same peers, and they run on Debian 12's Node.js (18.x) as well as on newer ones:
# node-llama-cpp 3.21.1 pulls ora 9, whose string-width 8 uses the regular-expression flag /v
# (Node 20+); Node 18 refuses to load it ("Invalid regular expression flags"), so ora gets
# string-width 7.2.0 (same API, Node 18). A folder whose package.json differs from the one
# written here (an older install of this script, or a hand-made one) is reinstalled.
set -euo pipefail
DIR=${TYCHO_PEERS_DIR:-/opt/tycho-peers}
case "${1:-}" in
  -h|--help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
  "") ;;
  *) echo "install-peers: unknown argument $1 (usage: $0 [--help])" >&2; exit 2 ;;
esac
if ! command -v npm >/dev/null 2>&1; then
  echo "install-peers: npm not found; skipping" >&2
  exit 1
fi

# install_peer SUB MARKER PACKAGE_JSON [npm install flags]: make $DIR/SUB hold exactly
# PACKAGE_JSON's dependencies. The copy of PACKAGE_JSON in node_modules records a finished
# install; while it matches (and MARKER is there) nothing is done.
install_peer() {
  local sub=$1 marker=$2 want=$3; shift 3
  local d="$DIR/$sub" stamp="$DIR/$sub/node_modules/.tycho-peer.json"
  if [ -e "$d/node_modules/$marker/package.json" ] && [ -f "$stamp" ] &&
     [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  mkdir -p "$d"
  printf '%s\n' "$want" >"$d/package.json"
  # A lock file from an earlier install would keep the tree it resolved (the broken one).
  rm -f "$d/package-lock.json" "$stamp"
  echo "install-peers: npm install into $d"
  npm install --silent --no-audit --no-fund --prefix "$d" "$@"
  printf '%s\n' "$want" >"$stamp"
}

install_peer llamacpp node-llama-cpp '{
  "name": "tycho-peer-llamacpp",
  "private": true,
  "dependencies": {
    "node-llama-cpp": "3.21.1",
    "@node-llama-cpp/linux-x64": "3.21.1"
  },
  "overrides": {
    "ora": {
      "string-width": "7.2.0"
    }
  }
}' --omit=optional --ignore-scripts
install_peer hftok tokenizers '{
  "name": "tycho-peer-hftok",
  "private": true,
  "dependencies": {
    "tokenizers": "0.23.2"
  }
}'
install_peer openai openai '{
  "name": "tycho-peer-openai",
  "private": true,
  "dependencies": {
    "openai": "6.49.0",
    "ajv": "8.17.1"
  }
}'

# Fail here, with the reason, rather than later in a test: every peer must load on this node.
check_load() { # sub module
  local err
  if ! err=$(cd "$DIR/$1" && node --input-type=module -e \
      "await import('$2')" 2>&1 >/dev/null); then
    echo "install-peers: $2 in $DIR/$1 does not load under node $(node --version):" >&2
    echo "$err" | head -5 >&2
    exit 1
  fi
}
check_load llamacpp node-llama-cpp
check_load hftok tokenizers
check_load openai openai
check_load openai ajv
echo "install-peers: peers in $DIR"
