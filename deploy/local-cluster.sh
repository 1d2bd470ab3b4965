#!/bin/sh
# Start a disaggregated Tycho cluster on this machine: a Conductor, 2 prefill and 2 decode
# daemons and a KV pool (tycho-store: master and one pool node) that the nodes share prefixes
# and answers through (separate processes; KV moves between them over the transfer engine's tcp
# and local transports on loopback).
#
#   deploy/local-cluster.sh start [--model PATH] [--port HTTP_PORT] [--host ADDR] [--prefill N]
#                                 [--decode N] [--pool SIZE]
#   deploy/local-cluster.sh status | stop
#
# --port 0 takes a free port (start prints the one taken; the Conductor's 'http rpc' ports are in
# $TYCHO_CLUSTER_DIR/conductor.ports); --host is the API's listen address (default 127.0.0.1);
# --pool is the pool's DRAM (default 256M; 0: no pool). stop sends SIGTERM (the daemons drain)
# and SIGKILLs what is still running 10 s later.
#
# The daemons prove a cluster secret to each other on every RPC, transfer and store connection:
# $TYCHO_CLUSTER_SECRET_FILE when set, else $TYCHO_CLUSTER_DIR/cluster.secret, made (mode 0600,
# `tycho gen-secret`) on the first start and kept across restarts.
#
# Binaries: $TYCHO_BIN_DIR (default: ./build) or PATH. State (pids, logs, ports) in
# $TYCHO_CLUSTER_DIR (default: /tmp/tycho-local-cluster). Extra settings for every prefill or
# decode node: $TYCHO_PREFILL_ARGS, $TYCHO_DECODE_ARGS (e.g. "--prefill_batch=1"), and for the
# Conductor: $TYCHO_CONDUCTOR_ARGS (e.g. "--log_level=debug").
set -eu
DIR=${TYCHO_CLUSTER_DIR:-/tmp/tycho-local-cluster}
BIN=${TYCHO_BIN_DIR:-$(dirname "$0")/../build}

find_bin() {
    for p in "$BIN/src/conductor/$1" "$BIN/src/prefill/$1" "$BIN/src/decode/$1" \
             "$BIN/src/store/$1" "$BIN/src/cli/$1"; do
        [ -x "$p" ] && { echo "$p"; return; }
    done
    command -v "$1" || { echo "local-cluster: $1 not found (set TYCHO_BIN_DIR)" >&2; exit 1; }
}

wait_file() { # path, seconds
    i=0
    while [ ! -s "$1" ]; do
        i=$((i + 1))
        [ $i -gt $(($2 * 20)) ] && { echo "local-cluster: $1 did not appear" >&2; return 1; }
        sleep 0.05
    done
}

start() {
    MODEL=${TYCHO_MODEL:-} PORT=8000 HOST=127.0.0.1 NP=2 ND=2 POOL=256M
    while [ $# -gt 0 ]; do
        case "$1" in
            --model|--port|--host|--prefill|--decode|--pool)
                [ $# -ge 2 ] || { echo "local-cluster: $1 needs a value" >&2; exit 2; } ;;
        esac
        case "$1" in
            --model) MODEL=$2; shift 2 ;;
            --port) PORT=$2; shift 2 ;;
            --host) HOST=$2; shift 2 ;;
            --prefill) NP=$2; shift 2 ;;
            --decode) ND=$2; shift 2 ;;
            --pool) POOL=$2; shift 2 ;;
            *) echo "local-cluster: unknown option $1" >&2; usage >&2; exit 2 ;;
        esac
    done
    [ -n "$MODEL" ] || { echo "local-cluster: --model PATH (or TYCHO_MODEL) is required" >&2; exit 2; }
    [ -e "$DIR/conductor.pid" ] && kill -0 "$(cat "$DIR/conductor.pid")" 2>/dev/null &&
        { echo "local-cluster: already running (deploy/local-cluster.sh stop)" >&2; exit 1; }
    mkdir -p "$DIR"
    rm -f "$DIR"/*.ports "$DIR"/*.pid
    if [ -z "${TYCHO_CLUSTER_SECRET_FILE:-}" ]; then
        TYCHO_CLUSTER_SECRET_FILE=$DIR/cluster.secret
        [ -e "$TYCHO_CLUSTER_SECRET_FILE" ] ||
            "$(find_bin tycho)" gen-secret "$TYCHO_CLUSTER_SECRET_FILE" >/dev/null
    fi
    export TYCHO_CLUSTER_SECRET_FILE
    POOL_ARG='' POOL_DESC=none
    if [ "$POOL" != 0 ]; then
        POOL_DESC="$POOL DRAM"
        "$(find_bin tycho-store)" --master=true --listen_port=0 --dram_bytes="$POOL" \
            --name=pool-0 --port_file="$DIR/store.ports" >"$DIR/store.log" 2>&1 &
        echo $! >"$DIR/store.pid"
        wait_file "$DIR/store.ports" 30
        POOL_ARG=--kv_pool.master=127.0.0.1:$(sed 's/.*master=\([0-9]*\).*/\1/' "$DIR/store.ports")
    fi
    # shellcheck disable=SC2086 # POOL_ARG is one word or none
    "$(find_bin tycho-conductor)" --model_path="$MODEL" --listen_host="$HOST" \
        --listen_port="$PORT" --rpc_port=0 \
        --port_file="$DIR/conductor.ports" $POOL_ARG ${TYCHO_CONDUCTOR_ARGS:-} \
        >"$DIR/conductor.log" 2>&1 &
    echo $! >"$DIR/conductor.pid"
    wait_file "$DIR/conductor.ports" 30
    RPC=$(cut -d' ' -f2 "$DIR/conductor.ports")
    i=0
    while [ $i -lt "$NP" ]; do
        # shellcheck disable=SC2086
        "$(find_bin tycho-prefill)" --model_path="$MODEL" --name="prefill-$i" \
            --conductor_address="127.0.0.1:$RPC" --port_file="$DIR/prefill-$i.ports" \
            $POOL_ARG ${TYCHO_PREFILL_ARGS:-} >"$DIR/prefill-$i.log" 2>&1 &
        echo $! >"$DIR/prefill-$i.pid"
        i=$((i + 1))
    done
    i=0
    while [ $i -lt "$ND" ]; do
        # shellcheck disable=SC2086
        "$(find_bin tycho-decode)" --model_path="$MODEL" --name="decode-$i" \
            --conductor_address="127.0.0.1:$RPC" --port_file="$DIR/decode-$i.ports" \
            $POOL_ARG ${TYCHO_DECODE_ARGS:-} >"$DIR/decode-$i.log" 2>&1 &
        echo $! >"$DIR/decode-$i.pid"
        i=$((i + 1))
    done
    for f in "$DIR"/prefill-*.pid "$DIR"/decode-*.pid; do
        wait_file "${f%.pid}.ports" 60
    done
    PORT=$(cut -d' ' -f1 "$DIR/conductor.ports")
    case "$HOST" in 0.0.0.0|::) URL_HOST=127.0.0.1 ;; *:*) URL_HOST="[$HOST]" ;; *) URL_HOST=$HOST ;; esac
    echo "Tycho cluster: $NP prefill + $ND decode, KV pool $POOL_DESC; OpenAI API at http://$URL_HOST:$PORT/v1"
    echo "logs and pids in $DIR; stop with: $0 stop"
}

status() {
    for f in "$DIR"/*.pid; do
        [ -e "$f" ] || { echo "not running"; return; }
        n=$(basename "$f" .pid)
        if alive "$(cat "$f")"; then s=running; else s=dead; fi
        printf '%-12s %-8s pid %s ports %s\n' "$n" "$s" "$(cat "$f")" \
            "$(cat "$DIR/$n.ports" 2>/dev/null || echo -)"
    done
}

alive() { # pid: running (a zombie, exited but not yet reaped by whoever adopted it, is not)
    kill -0 "$1" 2>/dev/null && [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

running() { # whether any pid file of $DIR names a live process
    for f in "$DIR"/*.pid; do
        [ -e "$f" ] && alive "$(cat "$f")" && return 0
    done
    return 1
}

stop() {
    for f in "$DIR"/*.pid; do
        [ -e "$f" ] || continue
        kill "$(cat "$f")" 2>/dev/null || true
    done
    i=0
    while running && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    for f in "$DIR"/*.pid; do
        [ -e "$f" ] || continue
        if alive "$(cat "$f")"; then
            echo "local-cluster: $(basename "$f" .pid) still running 10 s after SIGTERM: SIGKILL" >&2
            kill -9 "$(cat "$f")" 2>/dev/null || true
        fi
        rm -f "$f"
    done
    echo "stopped"
}

usage() {
    echo "usage: $0 start [--model PATH] [--port N] [--host ADDR] [--prefill N] [--decode N] [--pool SIZE] | status | stop"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    start) start "$@" ;;
    status) status ;;
    stop) stop ;;
    -h|--help|help) sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac
