#!/bin/sh
# KV pool get of 1 MiB blocks between two network namespaces vs iperf3 between the same
# namespaces, and vs memcpy on this host (docs/bench-notes/store.md). Needs root and iproute2.
#   usage: bench/store/netns_get_vs_iperf3.sh BUILD_DIR [CLIENTS] [BYTES]
set -eu
BUILD=${1:?build dir}
CLIENTS=${2:-4}
BYTES=${3:-1G}
ID=$$
A=tysb-a-$ID B=tysb-b-$ID
STORE=$BUILD/src/store/tycho-store TYCHO=$BUILD/src/cli/tycho
TMP=$(mktemp -d)
cleanup() {
    [ -n "${SPID:-}" ] && kill "$SPID" 2>/dev/null || true
    [ -n "${IPID:-}" ] && kill "$IPID" 2>/dev/null || true
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
ip netns add "$A"
ip netns add "$B"
ip link add tyba$ID type veth peer name tybb$ID
ip link set tyba$ID netns "$A"
ip link set tybb$ID netns "$B"
ip -n "$A" addr add 10.213.9.1/24 dev tyba$ID
ip -n "$B" addr add 10.213.9.2/24 dev tybb$ID
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set tyba$ID up
ip -n "$B" link set tybb$ID up

ip netns exec "$A" iperf3 -s -B 10.213.9.1 -p 5201 >/dev/null 2>&1 &
IPID=$!
sleep 0.5
IPERF=$(ip netns exec "$B" iperf3 -c 10.213.9.1 -p 5201 -t 5 -P "$CLIENTS" -J |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)')
kill $IPID; IPID=

ip netns exec "$A" "$STORE" --master --listen_host=10.213.9.1 --listen_port=7000 \
    --name=pool-a --dram_bytes=2G --log_level=warn --port_file="$TMP/ports" &
SPID=$!
for i in $(seq 100); do [ -s "$TMP/ports" ] && break; sleep 0.1; done
sleep 0.5
ip netns exec "$B" "$TYCHO" store-bench --master=10.213.9.1:7000 --transport=tcp \
    --listen-host=10.213.9.2 --sizes=1M --clients="$CLIENTS" --bytes="$BYTES" \
    --no-redis --no-memcached --json > "$TMP/bench.json"
python3 - "$TMP/bench.json" "$IPERF" <<'PY'
import json, sys
b = json.load(open(sys.argv[1])); iperf = float(sys.argv[2])
t = [r for r in b["results"] if r["system"] == "tycho"][0]
mc = b["memcpy"][0]["memcpy_gbps"]
print(f"1 MiB get between namespaces (tcp, {b['clients']} clients): {t['get_gbps']:.3f} GB/s "
      f"(p50 {t['get_p50_us']:.0f} us, p99 {t['get_p99_us']:.0f} us); put {t['put_gbps']:.3f} GB/s")
print(f"iperf3 between the same namespaces ({b['clients']} streams): {iperf:.3f} GB/s")
print(f"memcpy of 1 MiB blocks on this host ({b['clients']} threads): {mc:.3f} GB/s")
print(f"ratios: get/iperf3 = {t['get_gbps']/iperf:.2f}x, get/memcpy = {t['get_gbps']/mc:.2f}x")
PY
