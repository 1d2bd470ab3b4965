#!/bin/sh
# Short prompts behind long ones on one prefill node: the time to first token of short prompts
# that arrive while long prompts are being computed, for this build's cluster and (OLD_BUILD)
# another build's, alternating in rounds on the same machine. The peer is the other build:
# before interleaving, a long prompt ran as one forward call and a short prompt behind it
# waited for its end. 1 prefill + 1 decode node, chunk_tokens 64, no KV pool.
# Load (streaming completions, greedy, 1 output token): LONG prompts of LONG_LEN tokens sent
# together at t = 0, then SHORT prompts of 16 tokens, one every GAP seconds from t = 0.2 s.
# usage: bench/cluster/interleave.sh BUILD_DIR [OLD_BUILD_DIR|""] MODEL [ROUNDS] [LONG]
#        [LONG_LEN] [SHORT] [GAP]
set -eu
[ $# -ge 3 ] || { sed -n 2,10p "$0" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "$1" && pwd)"
OLD="${2:-}"
MODEL="$3"
ROUNDS="${4:-2}"
NLONG="${5:-2}"
LONG_LEN="${6:-1500}"
NSHORT="${7:-8}"
GAP="${8:-0.25}"
PORT=18170
RES=$(mktemp -d)
export TYCHO_CLUSTER_DIR="$RES/cluster"
cleanup() {
    TYCHO_BIN_DIR="$BUILD" sh "$ROOT/deploy/local-cluster.sh" stop >/dev/null 2>&1 || true
    rm -rf "$RES"
}
trap cleanup EXIT
run() { # name bin_dir
    TYCHO_BIN_DIR="$2" TYCHO_PREFILL_ARGS="--chunk_tokens=64" \
        sh "$ROOT/deploy/local-cluster.sh" start --model "$MODEL" --port "$PORT" --prefill 1 \
        --decode 1 --pool 0 >/dev/null
    python3 - "$PORT" "$NLONG" "$LONG_LEN" "$NSHORT" "$GAP" >"$RES/$1.json" <<'EOF'
import http.client, json, sys, threading, time
port, nlong, long_len, nshort, gap = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), float(sys.argv[5])
out = {"long": [], "short": []}
lock = threading.Lock()
def ask(kind, ids):
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": ids, "max_tokens": 1,
              "temperature": 0, "stream": True}), {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft = None
    for line in r:
        if line.startswith(b"data: ") and ttft is None and b'"text"' in line:
            ttft = time.time() - t0
    with lock:
        out[kind].append(ttft if r.status == 200 else None)
ts = []
for i in range(nlong):  # each long prompt its own ids: nothing shared in the page cache
    ids = [100 + (i * 131 + k * 37) % 400 for k in range(long_len)]
    ts.append(threading.Thread(target=ask, args=("long", ids)))
    ts[-1].start()
time.sleep(0.2)
for i in range(nshort):
    ts.append(threading.Thread(target=ask, args=("short", [300 + i] + [200 + k for k in range(15)])))
    ts[-1].start()
    time.sleep(gap)
for t in ts:
    t.join()
print(json.dumps(out))
EOF
    TYCHO_BIN_DIR="$2" sh "$ROOT/deploy/local-cluster.sh" stop >/dev/null
}
echo "# $MODEL: $NLONG prompts of $LONG_LEN tokens at once, then $NSHORT of 16 tokens every" \
    "$GAP s; 1 prefill + 1 decode, chunk_tokens 64"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    run "r$r-new" "$BUILD"
    [ -z "$OLD" ] || run "r$r-old" "$(cd "$OLD" && pwd)"
    r=$((r + 1))
done
python3 - "$RES" "$ROUNDS" "$OLD" <<'EOF'
import json, os, sys
res, rounds, old = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def stats(v):
    v = sorted(x for x in v if x is not None)
    return (sum(v) / len(v), v[len(v) // 2], v[-1]) if v else (float("nan"),) * 3
print("\n| round | build | short TTFT mean / p50 / max s | long TTFT mean s | failed |")
print("|---|---|---|---|---|")
for r in range(1, rounds + 1):
    row = {}
    for b in ("new", "old") if old else ("new",):
        with open(os.path.join(res, "r%d-%s.json" % (r, b))) as f:
            d = json.load(f)
        s, l = stats(d["short"]), stats(d["long"])
        failed = sum(x is None for x in d["short"] + d["long"])
        row[b] = (s, l)
        print("| %d | %s | %.2f / %.2f / %.2f | %.2f | %d |" % (
            r, "this" if b == "new" else "old", s[0], s[1], s[2], l[0], failed))
    if old:
        print("# round %d: short TTFT mean this/old %.2fx, long TTFT %.2fx" % (
            r, row["new"][0][0] / row["old"][0][0], row["new"][1][0] / row["old"][1][0]))
EOF
