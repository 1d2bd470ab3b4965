#!/bin/sh
# A `tycho`-shaped wrapper so that tests written against `tycho serve` run against the cluster:
#   tycho_cluster_serve.sh serve --model M --port P [--api-key K]
# starts tycho-conductor on P plus 1 tycho-prefill and 1 tycho-decode (loopback, ephemeral
# ports) and stops them all on SIGTERM/SIGINT; every other command runs the real `tycho`.
B=${TYCHO_BIN_DIR:?set TYCHO_BIN_DIR to the build folder}
if [ "$1" != serve ]; then
    exec "$B/src/cli/tycho" "$@"
fi
shift
MODEL= PORT=8000 KEY=
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --api-key) KEY=$2; shift 2 ;;
        *) echo "tycho_cluster_serve.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
DECODE=$B/src/decode/tycho-decode
DIR=$(mktemp -d)
PIDS=
cleanup() { [ -n "$PIDS" ] && kill $PIDS 2>/dev/null; wait; rm -rf "$DIR"; exit 0; }
trap cleanup TERM INT HUP
"$B/src/conductor/tycho-conductor" --model_path="$MODEL" --listen_port="$PORT" \
    --rpc_port=0 --port_file="$DIR/c.ports" ${KEY:+--api_keys=[$KEY]} &
PIDS="$!"
i=0
while [ ! -s "$DIR/c.ports" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
RPC=$(cut -d' ' -f2 "$DIR/c.ports")
"$B/src/prefill/tycho-prefill" --model_path="$MODEL" --conductor_address=127.0.0.1:"$RPC" \
    --name=p0 --heartbeat_interval=200ms &
PIDS="$PIDS $!"
"$DECODE" --model_path="$MODEL" --conductor_address=127.0.0.1:"$RPC" --name=d0 \
    --heartbeat_interval=200ms &
PIDS="$PIDS $!"
wait
