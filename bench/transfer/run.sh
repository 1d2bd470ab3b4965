#!/usr/bin/env bash
# Transfer engine benchmark, all figures from one run on this machine:
#   tcp over loopback   vs iperf3 with the same number of streams   (target >= 0.8x)
#   local shared memory vs plain memcpy of the same sizes           (target >= 0.7x)
# usage: bench/transfer/run.sh [BUILD_DIR] ; env DURATION (s, 5), STREAMS (4), BLOCK (1 MiB),
#        BATCH (16), OP (write|read)
set -euo pipefail
BUILD=${1:-build}
TYCHO=$BUILD/src/cli/tycho
DURATION=${DURATION:-5}
STREAMS=${STREAMS:-4}
BLOCK=${BLOCK:-1048576}
BATCH=${BATCH:-16}
OP=${OP:-write}
[ -x "$TYCHO" ] || { echo "no $TYCHO: build the tycho target first" >&2; exit 2; }
command -v iperf3 >/dev/null || { echo "iperf3 not installed" >&2; exit 2; }
tmp=$(mktemp -d)
cleanup() { [ -n "${TPID:-}" ] && kill "$TPID" 2>/dev/null || true; [ -n "${IPID:-}" ] && kill "$IPID" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

gb() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gb_per_s'])" "$1"; }

# target process holding a shared-memory buffer
"$TYCHO" transfer-bench --role target --listen 127.0.0.1:0 --buffer-mb 1024 >"$tmp/target" 2>"$tmp/target.err" &
TPID=$!
for _ in $(seq 50); do [ -s "$tmp/target" ] && break; sleep 0.1; done
SEG=$(awk '{print $2}' "$tmp/target")

# iperf3, same number of streams, same duration
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -1 -p "$PORT" -B 127.0.0.1 >/dev/null 2>&1 &
IPID=$!
sleep 0.3
iperf3 -c 127.0.0.1 -p "$PORT" -P "$STREAMS" -t "$DURATION" -J >"$tmp/iperf.json"
IPERF=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['end']['sum_received']['bits_per_second']/8e9)" "$tmp/iperf.json")
IPID=

COMMON="--op $OP --block-size $BLOCK --batch-size $BATCH --duration $DURATION --json"
"$TYCHO" transfer-bench --target "$SEG" --transport tcp --threads "$STREAMS" --conns "$STREAMS" $COMMON >"$tmp/tcp.json"
"$TYCHO" transfer-bench --target "$SEG" --transport local --threads "$STREAMS" $COMMON >"$tmp/local.json"
"$TYCHO" transfer-bench --role memcpy --threads "$STREAMS" --buffer-mb 1024 $COMMON >"$tmp/memcpy.json"

TCP=$(gb "$tmp/tcp.json"); LOCAL=$(gb "$tmp/local.json"); MEMCPY=$(gb "$tmp/memcpy.json")
echo "iperf3 -P $STREAMS:   $IPERF GB/s"
echo "tycho tcp x$STREAMS:   $TCP GB/s    $(cat "$tmp/tcp.json")"
echo "memcpy x$STREAMS:      $MEMCPY GB/s"
echo "tycho local x$STREAMS: $LOCAL GB/s  $(cat "$tmp/local.json")"
python3 - "$IPERF" "$TCP" "$MEMCPY" "$LOCAL" <<'PY'
import sys
iperf, tcp, memcpy, local = map(float, sys.argv[1:])
r1, r2 = tcp / iperf, local / memcpy
print(f"tcp/iperf3   = {r1:.2f}  (target >= 0.80) {'PASS' if r1 >= 0.8 else 'FAIL'}")
print(f"local/memcpy = {r2:.2f}  (target >= 0.70) {'PASS' if r2 >= 0.7 else 'FAIL'}")
sys.exit(0 if r1 >= 0.8 and r2 >= 0.7 else 1)
PY
