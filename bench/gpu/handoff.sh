#!/usr/bin/env bash
# KV handoff bandwidth between two processes on one GPU host, device memory on both sides
# (issue 22), every figure from this run:
#   cuda_ipc: tycho transfer-bench --transport local (CUDA IPC) vs cudaMemcpyAsync device to
#             device of the same sizes in one process                        (goal >= 0.8x)
#   tcp:      the pinned staging path over loopback vs iperf3 on the same loopback (goal >= 0.8x)
# Block sizes: 1 MiB (bulk) and 64 KiB (a few KV pages of a 1B model's layer).
# usage: bench/gpu/handoff.sh TYCHO [DURATION_S]     prints RESULT lines (scripts/gpu-check.sh)
set -uo pipefail
TYCHO=${1:?usage: handoff.sh TYCHO [DURATION_S]}
DUR=${2:-3}
tmp=$(mktemp -d)
cleanup() { [ -n "${TPID:-}" ] && kill "$TPID" 2>/dev/null; [ -n "${IPID:-}" ] && kill "$IPID" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
gb() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gb_per_s'])" "$1" 2>/dev/null || echo 0; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

"$TYCHO" transfer-bench --role target --listen 127.0.0.1:0 --buffer-mb 1024 --location cuda:0 \
    >"$tmp/target" 2>"$tmp/target.err" &
TPID=$!
for _ in $(seq 100); do [ -s "$tmp/target" ] && break; sleep 0.1; done
SEG=$(awk '{print $2}' "$tmp/target")
[ -n "$SEG" ] || { echo "handoff: the target did not start: $(tail -2 "$tmp/target.err")"; exit 1; }

for spec in "1048576 16 1m" "65536 64 64k"; do
    set -- $spec
    common="--op write --block-size $1 --batch-size $2 --duration $DUR --json --location cuda:0"
    "$TYCHO" transfer-bench --target "$SEG" --transport local $common >"$tmp/ipc.json" 2>"$tmp/ipc.err"
    "$TYCHO" transfer-bench --role memcpy --buffer-mb 1024 $common >"$tmp/d2d.json" 2>"$tmp/d2d.err"
    ipc=$(gb "$tmp/ipc.json"); d2d=$(gb "$tmp/d2d.json")
    grep -q '"transport":"local"' "$tmp/ipc.json" || echo "handoff: cuda_ipc run failed: $(tail -2 "$tmp/ipc.err")"
    echo "RESULT handoff_cuda_ipc_${3}_gbps $ipc GB/s"
    echo "RESULT handoff_d2d_copy_${3}_gbps $d2d GB/s"
    echo "RESULT handoff_cuda_ipc_${3}_vs_d2d $(ratio "$ipc" "$d2d") x(goal>=0.8)"
done

# tcp staging vs iperf3, 4 streams each
common="--op write --block-size 1048576 --batch-size 16 --duration $DUR --json --location cuda:0"
"$TYCHO" transfer-bench --target "$SEG" --transport tcp --threads 4 --conns 4 $common \
    >"$tmp/tcp.json" 2>"$tmp/tcp.err"
tcp=$(gb "$tmp/tcp.json")
if command -v iperf3 >/dev/null; then
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    iperf3 -s -1 -p "$PORT" -B 127.0.0.1 >/dev/null 2>&1 &
    IPID=$!
    sleep 0.3
    iperf3 -c 127.0.0.1 -p "$PORT" -P 4 -t "$DUR" -J >"$tmp/iperf.json" 2>/dev/null
    ip=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['end']['sum_received']['bits_per_second']/8e9, 3))" "$tmp/iperf.json" 2>/dev/null || echo 0)
    IPID=
    echo "RESULT handoff_tcp_staging_gbps $tcp GB/s"
    echo "RESULT handoff_iperf3_loopback_gbps $ip GB/s"
    echo "RESULT handoff_tcp_staging_vs_iperf3 $(ratio "$tcp" "$ip") x(goal>=0.8)"
else
    echo "RESULT handoff_tcp_staging_gbps $tcp GB/s(no_iperf3)"
fi
