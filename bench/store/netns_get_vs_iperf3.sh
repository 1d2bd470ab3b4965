#!/bin/sh
# KV pool get of 1 MiB blocks between two network namespaces vs iperf3 between the same
# namespaces, in the same run (docs/benchmarks.md). Needs root, iproute2, iperf3.
#   usage: bench/store/netns_get_vs_iperf3.sh BUILD_DIR [STREAMS] [REPS] [BYTES] [EXTRA...]
# Namespace A holds the master and one pool node (2 GiB); namespace B runs iperf3 -c and
# `tycho store-bench` with as many client threads and TCP connections to the node as iperf3
# has streams. After an untimed warm-up of both, each repetition runs iperf3 (3 s, first second
# omitted) and then store-bench (one put pass, 3 timed get passes: their median counts); the
# medians, min and max of the repetitions are reported with their ratio. EXTRA arguments go to
# store-bench (e.g. --verify=lease, --xfer-checksum, --batch=16).
set -eu
# The daemons prove a cluster secret to each other (docs/arch/security.md): a throwaway one
# unless the caller gives one.
if [ -z "${TYCHO_CLUSTER_SECRET_FILE:-}" ]; then
    TYCHO_CLUSTER_SECRET_FILE=$(mktemp -d)/cluster.secret
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TYCHO_CLUSTER_SECRET_FILE")
fi
export TYCHO_CLUSTER_SECRET_FILE
BUILD=${1:?build dir}
STREAMS=${2:-4}
REPS=${3:-5}
BYTES=${4:-512M}
shift $(( $# < 4 ? $# : 4 ))
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
ip netns exec "$A" "$STORE" --master --listen_host=10.213.9.1 --listen_port=7000 \
    --name=pool-a --dram_bytes=2G --lease=1s --log_level=warn --port_file="$TMP/ports" &
SPID=$!
for i in $(seq 100); do [ -s "$TMP/ports" ] && break; sleep 0.1; done
sleep 0.5

iperf() { # $1: seconds; prints GB/s received
    ip netns exec "$B" iperf3 -c 10.213.9.1 -p 5201 -t "$1" -O 1 -P "$STREAMS" -J |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)'
}
bench() { # $1: bytes, $2: output json, then extra store-bench arguments
    b=$1 out=$2
    shift 2
    ip netns exec "$B" "$TYCHO" store-bench --master=10.213.9.1:7000 --transport=tcp \
        --listen-host=10.213.9.2 --sizes=1M --clients="$STREAMS" --streams="$STREAMS" \
        --bytes="$b" --reps=3 --no-redis --no-memcached --json "$@" > "$out"
}
iperf 2 > /dev/null                 # warm-up, discarded
bench 128M "$TMP/warm.json" "$@"
for r in $(seq "$REPS"); do
    iperf 3 >> "$TMP/iperf.txt"
    bench "$BYTES" "$TMP/bench-$r.json" "$@"
done
python3 - "$TMP" "$REPS" "$STREAMS" "$*" <<'PY'
import json, statistics as st, sys
d, reps, streams, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ip = [float(x) for x in open(f"{d}/iperf.txt").read().split()]
runs = [json.load(open(f"{d}/bench-{r}.json")) for r in range(1, reps + 1)]
rows = [[x for x in b["results"] if x["system"] == "tycho"][0] for b in runs]
get = [x["get_gbps"] for x in rows]
put = [x["put_gbps"] for x in rows]
errs = sum(x["errors"] for x in rows)
ratio = [g / i for g, i in zip(get, ip)]
def s(v): return f"median {st.median(v):.3f}, min {min(v):.3f}, max {max(v):.3f}"
print(f"{reps} repetitions, {streams} streams / client threads / TCP connections, "
      f"batch {runs[0]['batch']}, store-bench args: {extra or '(none)'}")
print(f"1 MiB get between namespaces (tcp) GB/s: {s(get)}; errors {errs}")
print(f"   per repetition: " + " ".join(f"{g:.3f}" for g in get))
print(f"iperf3 between the same namespaces GB/s: {s(ip)}")
print(f"   per repetition: " + " ".join(f"{i:.3f}" for i in ip))
print(f"1 MiB put GB/s: {s(put)}")
print(f"get/iperf3: ratio of medians {st.median(get)/st.median(ip):.2f}x, "
      f"per repetition {s(ratio)}")
PY
