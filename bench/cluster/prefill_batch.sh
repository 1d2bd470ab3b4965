#!/bin/sh
# Batched prefill on the prefill nodes: the same 2 prefill + 2 decode local cluster with
# prefill_batch=1 (one prompt per forward call) and prefill_batch=8, and `tycho serve` (one
# process, every prompt and decode in shared engine steps: the ceiling without a KV handoff),
# each under the same `tycho bench serve` load (short random prompts, all at once, bounded
# concurrency), interleaved in rounds so that the shared machine's noise hits all alike.
# usage: bench/cluster/prefill_batch.sh [BUILD_DIR] [MODEL] [ROUNDS] [PROMPTS] [CONCURRENCY]
#        [INPUT_LEN] [OUTPUT_LEN]
set -eu
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
DATA="${TYCHO_TEST_DATA:-$ROOT/../shared}"
MODEL="${2:-$DATA/models/stories260K/stories260K.gguf}"
ROUNDS="${3:-2}"
N="${4:-200}"
C="${5:-32}"
IN="${6:-64}"
OUT="${7:-16}"
TYCHO="$BUILD/src/cli/tycho"
PORT=18150
RES=$(mktemp -d)
export TYCHO_BIN_DIR="$BUILD" TYCHO_CLUSTER_DIR="$RES/cluster"
cleanup() {
    sh "$ROOT/deploy/local-cluster.sh" stop >/dev/null 2>&1 || true
    [ -n "${SERVE_PID:-}" ] && kill "$SERVE_PID" 2>/dev/null || true
    rm -rf "$RES"
}
trap cleanup EXIT
load() { # name
    "$TYCHO" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "$N" \
        --request-rate inf --max-concurrency "$C" --random-input-len "$IN" \
        --random-output-len "$OUT" --seed 1 --json "$RES/$1.json" >/dev/null
}
echo "# $MODEL: $N requests, $IN-token random prompts, $OUT output tokens, concurrency $C"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for b in 1 8; do
        TYCHO_PREFILL_ARGS="--prefill_batch=$b" sh "$ROOT/deploy/local-cluster.sh" start \
            --model "$MODEL" --port "$PORT" --pool 0 >/dev/null
        load "r$r-batch$b"
        sh "$ROOT/deploy/local-cluster.sh" stop >/dev/null
        echo "# round $r prefill_batch=$b done"
    done
    "$TYCHO" serve --model "$MODEL" --port "$PORT" >"$RES/serve.log" 2>&1 &
    SERVE_PID=$!
    i=0
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        i=$((i + 1)); [ "$i" -lt 100 ] || { echo "tycho serve did not start" >&2; exit 1; }
        sleep 0.1
    done
    load "r$r-serve"
    kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true; SERVE_PID=
    echo "# round $r tycho serve done"
    r=$((r + 1))
done
python3 - "$RES" "$ROUNDS" <<'EOF'
import json, os, sys
res, rounds = sys.argv[1], int(sys.argv[2])
def get(name):
    with open(os.path.join(res, name + ".json")) as f:
        return json.load(f)
print("\n| round | setup | ok / failed | req/s | mean TTFT ms | p99 TTFT ms | mean E2EL ms |")
print("|---|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    row = {}
    for name, label in (("batch1", "cluster, prefill_batch=1"), ("batch8", "cluster, prefill_batch=8"),
                        ("serve", "tycho serve")):
        d = get("r%d-%s" % (r, name))
        row[name] = d
        print("| %d | %s | %d / %d | %.1f | %.1f | %.1f | %.1f |" % (
            r, label, d["completed"], d["failed"], d["request_throughput"], d["mean_ttft_ms"],
            d["p99_ttft_ms"], d["mean_e2el_ms"]))
    b1, b8, sv = row["batch1"], row["batch8"], row["serve"]
    print("# round %d: req/s batch8/batch1 %.2fx, mean TTFT %.2fx; batch8 / tycho serve %.2fx" % (
        r, b8["request_throughput"] / b1["request_throughput"],
        b8["mean_ttft_ms"] / b1["mean_ttft_ms"],
        b8["request_throughput"] / sv["request_throughput"]))
EOF
