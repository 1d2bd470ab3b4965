#!/bin/sh
# Chunked pipeline parallelism (docs/benchmarks.md): time to first token of one long prompt
# through 1, 2 and 4 prefill nodes, each node in its own network namespace (veth pairs on a
# bridge, a tc qdisc shaping every node's link), each pinned to one CPU (taskset, threads: 1), KV and
# hidden states over tcp; beside `tycho sim`'s prediction for the same setup from the cost
# model `tycho fit-cost` measures on this machine (one node, one thread). Needs root,
# iproute2, taskset.
#   usage: bench/cluster/cpp_ttft.sh BUILD_DIR [TOKENS] [REPS] [CHUNK] [QDISC...]
# TOKENS: prompt length (16384); REPS: prompts per setup (2, each a different prompt, so no
# prefix is reused); CHUNK: the prefill nodes' chunk_tokens (1024); QDISC: the tc qdisc of
# every node's link (default: tbf rate 10gbit burst 1mb latency 10ms; e.g. "netem delay 100us
# rate 10gbit" where the kernel has sch_netem, which this machine's has not).
set -eu
if [ -z "${TYCHO_CLUSTER_SECRET_FILE:-}" ]; then
    TYCHO_CLUSTER_SECRET_FILE=$(mktemp -d)/cluster.secret
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TYCHO_CLUSTER_SECRET_FILE")
fi
export TYCHO_CLUSTER_SECRET_FILE
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:?build dir}" && pwd)"
TOKENS=${2:-16384}
REPS=${3:-2}
CHUNK=${4:-1024}
shift $(( $# < 4 ? $# : 4 ))
NETEM=${*:-tbf rate 10gbit burst 1mb latency 10ms}
DATA="${TYCHO_TEST_DATA:-$ROOT/../shared}"
TYCHO=$BUILD/src/cli/tycho
ID=$$
NET=10.215.$((ID % 200)).
TMP=$(mktemp -d)
NCPU=$(nproc)
CTX=$((TOKENS + 64))
PAGES=$((2 * (CTX / 16 + 1)))
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for n in c p0 p1 p2 p3 d0; do ip netns del "ty$n-$ID" 2>/dev/null || true; done
    ip link del "tybr$ID" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

MODEL=$TMP/cpp.gguf
"$TYCHO" mkmodel --dims 128,4,4,2,256 --vocab-from "$DATA/models/stories260K/stories260K.gguf" \
    --out "$MODEL" >/dev/null

ip link add "tybr$ID" type bridge
ip addr add "${NET}254/24" dev "tybr$ID"
ip link set "tybr$ID" up
k=1
for n in c p0 p1 p2 p3 d0; do
    ns=ty$n-$ID
    ip netns add "$ns"
    ip link add "tyh$k-$ID" type veth peer name "tyn$k-$ID"
    ip link set "tyn$k-$ID" netns "$ns"
    ip link set "tyh$k-$ID" master "tybr$ID" up
    ip -n "$ns" addr add "$NET$k/24" dev "tyn$k-$ID"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "tyn$k-$ID" up
    ip netns exec "$ns" tc qdisc add dev "tyn$k-$ID" root $NETEM
    eval "IP_$n=$NET$k"
    k=$((k + 1))
done

# the cost model of one node, one thread, as the nodes run (sim's prediction below)
"$TYCHO" fit-cost --model "$MODEL" --threads 1 --max-prompt 2048 --chunk-tokens "$CHUNK" \
    --block-tokens 16 --out "$TMP/cost.yaml" >/dev/null

start() { # name cpu argv...
    name=$1 cpu=$2
    shift 2
    ip netns exec "ty$name-$ID" taskset -c "$cpu" "$@" --port_file="$TMP/$name.ports" \
        >"$TMP/$name.log" 2>&1 &
    PIDS="$PIDS $!"
}
wait_file() {
    for i in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.1; done
    echo "no $1" >&2
    exit 1
}
cluster() { # stages
    rm -f "$TMP"/*.ports
    PIDS=""
    start c 0 "$BUILD/src/conductor/tycho-conductor" --model_path="$MODEL" \
        --listen_host="$IP_c" --listen_port=8100 --rpc_host="$IP_c" --rpc_port=7100 \
        --max_ctx="$CTX" --request_timeout=600s --pipeline.stages="$1" \
        --pipeline.threshold=$((CHUNK + 1)) --heartbeat_interval=200ms --log_level=warn
    wait_file "$TMP/c.ports"
    i=0
    for n in p0 p1 p2 p3 d0; do
        bin=$BUILD/src/prefill/tycho-prefill
        [ "$n" = d0 ] && bin=$BUILD/src/decode/tycho-decode
        eval "ip=\$IP_$n"
        start "$n" $((i % NCPU)) "$bin" --model_path="$MODEL" --name="$n" --listen_host="$ip" \
            --conductor_address="$IP_c:7100" --transfer.transport=tcp --threads=1 \
            --max_ctx="$CTX" --kv_pages="$PAGES" --chunk_tokens="$CHUNK" --max_batch_size=2 \
            --kv_block_tokens=16 --heartbeat_interval=200ms --log_level=warn
        i=$((i + 1))
    done
    for n in p0 p1 p2 p3 d0; do wait_file "$TMP/$n.ports"; done
    sleep 1 # registrations
}
stop() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    PIDS=""
}

for S in 1 2 4; do
    cluster $([ "$S" = 1 ] && echo 0 || echo "$S")
    python3 - "$IP_c" "$TOKENS" "$REPS" "$S" >>"$TMP/ttft.txt" <<'PY'
import http.client, json, sys, time
host, n, reps, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for r in range(reps):
    ids = [3 + (i * 37 + i // 7 + r * 101) % 500 for i in range(n)]
    c = http.client.HTTPConnection(host, 8100, timeout=900)
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps({"prompt": ids, "max_tokens": 2,
              "temperature": 0, "stream": True}), {"Content-Type": "application/json"})
    resp, ttft = c.getresponse(), None
    while True:
        line = resp.readline()
        if not line or line.strip() == b"data: [DONE]":
            break
        if ttft is None and line.startswith(b"data: ") and b'"text"' in line:
            ttft = time.time() - t0
    print(stages, r, "%.3f" % (ttft if ttft is not None else -1))
PY
    stop
done

for S in 1 2 4; do
    echo "{\"timestamp\": 0, \"input_length\": $TOKENS, \"output_length\": 1, \"hash_ids\": [$S]}" \
        >"$TMP/trace-$S.jsonl"
    "$TYCHO" sim --config "$TMP/cost.yaml" --trace "$TMP/trace-$S.jsonl" --json \
        --policy kvcache_centric --admission baseline --cluster.prefill_nodes=4 \
        --cluster.decode_nodes=1 --cluster.cpp_stages=$([ "$S" = 1 ] && echo 0 || echo "$S") \
        --cluster.cpp_chunk_tokens="$CHUNK" --cluster.cpp_threshold=$((CHUNK + 1)) \
        --cluster.cpp_hidden_bytes_per_token=512 2>/dev/null |
        python3 -c "import json,sys; print('$S', json.load(sys.stdin)['runs'][0]['ttft_s']['mean'])" \
        >>"$TMP/sim.txt"
done
python3 - "$TMP" "$TOKENS" "$CHUNK" "$NCPU" "$NETEM" <<'PY'
import statistics as st, sys
d, tokens, chunk, ncpu, netem = sys.argv[1:6]
meas = {}
for line in open(d + "/ttft.txt"):
    s, r, t = line.split()
    meas.setdefault(s, []).append(float(t))
sim = dict(line.split() for line in open(d + "/sim.txt"))
print("%s-token prompt, chunk %s, 1 thread per node on %s CPUs, qdisc '%s'" % (tokens, chunk,
                                                                             ncpu, netem))
print("%-7s %-28s %-12s %-10s" % ("stages", "measured TTFT s (each)", "median s", "sim s"))
base = st.median(meas["1"])
for s in ("1", "2", "4"):
    m = st.median(meas[s])
    print("%-7s %-28s %-12.2f %-10.2f  (x%.2f measured, x%.2f sim vs 1 node)" % (
        s, " ".join("%.2f" % x for x in meas[s]), m, float(sim[s]), base / m,
        float(sim["1"]) / float(sim[s])))
PY
