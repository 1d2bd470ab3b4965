#!/usr/bin/env bash
# Install what is missing, build, and start Tycho on this machine as the disaggregated cluster it
# is for: a Conductor (the OpenAI API), one prefill and one decode daemon and a KV-pool node
# (tycho-store, also the pool's master), as separate processes (deploy/local-cluster.sh starts
# them). Ctrl-C or SIGTERM stops them all; so does any of them exiting on its own.
#
# Usage: scripts/serve.sh [--model PATH] [--port N] [--host ADDR] [--pool SIZE]
#        scripts/serve.sh [--model PATH] [--port N] [--host ADDR] --single [`tycho serve` options]
#   --port N      the API's port (default 8000; 0: a free one, printed)
#   --host ADDR   the API's listen address (default 127.0.0.1)
#   --pool SIZE   the KV pool's DRAM (default 256M; 0: no pool node)
#   --single      all roles in one process (`tycho serve`), for single-machine use; the options
#                 after it are `tycho serve`'s (tycho serve --help)
# Without --model it serves the stories260K test model when ../shared (or $TYCHO_TEST_DATA) has
# it; otherwise a small random-weight model (its output is noise), as `tycho serve` does, and
# says so.
# Environment: BUILD_DIR (default build); SERVE_NO_BUILD=1 skips installing and building and
# runs the binaries in BUILD_DIR as they are; TYCHO_CLUSTER_DIR holds the daemons' logs, pids
# and ports (default: a new folder under /tmp, printed); TYCHO_PREFILL_ARGS, TYCHO_DECODE_ARGS,
# TYCHO_CONDUCTOR_ARGS as for deploy/local-cluster.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
DATA=${TYCHO_TEST_DATA:-../shared}

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "serve: $*" >&2; exit 2; }

SINGLE=0 MODEL='' PORT='' HOST='' POOL=256M
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --single) SINGLE=1; shift; break ;;
    --model|--port|--host|--pool)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --model) MODEL=$2 ;; --port) PORT=$2 ;; --host) HOST=$2 ;; --pool) POOL=$2 ;;
      esac
      shift 2 ;;
    --model=*) MODEL=${1#*=}; shift ;;
    --port=*) PORT=${1#*=}; shift ;;
    --host=*) HOST=${1#*=}; shift ;;
    --pool=*) POOL=${1#*=}; shift ;;
    *) die "unknown option $1 (the cluster takes --model, --port, --host, --pool;" \
          "scripts/serve.sh --single passes tycho serve's options; --help)" ;;
  esac
done

if [ "${SERVE_NO_BUILD:-0}" != 1 ]; then
  bash scripts/install-deps.sh
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  if [ $SINGLE = 1 ]; then
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target tycho
  else
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target tycho tycho-conductor tycho-prefill \
      tycho-decode tycho-store
  fi
fi
case "$BUILD_DIR" in /*) TYCHO=$BUILD_DIR/src/cli/tycho ;; *) TYCHO=./$BUILD_DIR/src/cli/tycho ;; esac
[ -x "$TYCHO" ] || die "$TYCHO not built (run without SERVE_NO_BUILD, or set BUILD_DIR)"
stories=$DATA/models/stories260K/stories260K.gguf

if [ $SINGLE = 1 ]; then
  [ -n "$HOST" ] && set -- --host "$HOST" "$@"
  [ -n "$PORT" ] && set -- --port "$PORT" "$@"
  [ -n "$MODEL" ] && set -- --model "$MODEL" "$@"
  case " $* " in
    *" --model "*|*" --model="*|*" --config "*|*" --config="*|*" --help "*) ;;
    *) [ -e "$stories" ] && set -- --model "$stories" "$@" ;;
  esac
  exec "$TYCHO" serve "$@"
fi

if [ -z "$MODEL" ]; then
  if [ -e "$stories" ]; then
    MODEL=$stories
  else
    # what `tycho serve` does without a model: the same file in the same cache folder
    cache=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/tycho
    MODEL=$cache/random-tiny.gguf
    echo "serve: no --model given and no stories260K in $DATA: serving a small RANDOM-WEIGHT" \
         "model ($MODEL)." >&2
    echo "serve: its output is noise. Point it at a real model with" >&2
    echo "serve:   scripts/serve.sh --model /path/to/model.gguf  (or a Hugging Face model" \
         "directory)" >&2
    if [ ! -e "$MODEL" ]; then
      mkdir -p "$cache"
      "$TYCHO" mkmodel --preset tiny --vocab-from "${TYCHO_VOCAB_FROM:-bytes}" --out "$MODEL" \
        >/dev/null
    fi
  fi
fi
[ -e "$MODEL" ] || die "model $MODEL not found"
PORT=${PORT:-8000} HOST=${HOST:-127.0.0.1}

OWN_DIR=0
if [ -n "${TYCHO_CLUSTER_DIR:-}" ]; then
  DIR=$TYCHO_CLUSTER_DIR
else
  DIR=$(mktemp -d /tmp/tycho-serve-XXXXXX) OWN_DIR=1
fi
export TYCHO_CLUSTER_DIR=$DIR TYCHO_BIN_DIR=$BUILD_DIR
stopping=0 waiter=''
stop_cluster() { # the logs of a folder we made are kept when something failed
  local rc=$?
  [ $stopping = 1 ] && return
  stopping=1
  if [ -n "$waiter" ]; then kill "$waiter" 2>/dev/null || true; fi  # it may be gone: set -e
  echo "serve: stopping the cluster" >&2
  sh deploy/local-cluster.sh stop >/dev/null || true
  if [ $OWN_DIR = 1 ] && [ "$rc" = 0 ]; then rm -rf "$DIR"; fi
}
trap 'true; stop_cluster; exit 0' INT TERM HUP
trap stop_cluster EXIT  # any other way out (a failed start, an error) stops what started

if ! sh deploy/local-cluster.sh start --model "$MODEL" --port "$PORT" --host "$HOST" \
    --prefill 1 --decode 1 --pool "$POOL" >/dev/null; then
  for f in "$DIR"/*.log; do
    [ -e "$f" ] && { echo "==== $f" >&2; tail -n 15 "$f" >&2; }
  done
  echo "serve: the cluster did not start; the logs stay in $DIR" >&2
  exit 1
fi
HTTP_PORT=$(cut -d' ' -f1 "$DIR/conductor.ports")
case "$HOST" in 0.0.0.0|::) URL_HOST=127.0.0.1 ;; *:*) URL_HOST="[$HOST]" ;; *) URL_HOST=$HOST ;; esac
URL=http://$URL_HOST:$HTTP_PORT
cat <<EOF

Tycho serves $MODEL at $URL/v1 (the OpenAI API):
  curl $URL/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "Once upon a time", "max_tokens": 32}'
Watch it:  $TYCHO status --url $URL
Logs:      $DIR/*.log
Ctrl-C stops all.
EOF

# Wait for a signal; a daemon that exits on its own takes the others down with it.
while :; do
  dead=$(sh deploy/local-cluster.sh status | awk '$2 == "dead" { print $1 }')
  if [ -n "$dead" ]; then
    for n in $dead; do
      echo "serve: $n exited; the end of its log ($DIR/$n.log):" >&2
      tail -n 15 "$DIR/$n.log" >&2 || true
    done
    echo "serve: the logs stay in $DIR" >&2
    exit 1
  fi
  sleep 1 &
  waiter=$!
  wait $waiter || true
  waiter=''
done
