#!/bin/sh
# How well the Conductor predicts time to first token under a burst of short prompts, when
# the prefill nodes batch them (prefill_batch=8): the mean predicted TTFT of the accepted
# requests (tycho_scheduler_predicted_ttft_seconds on the Conductor's /metrics) against the
# mean TTFT the client measured (`tycho bench serve`), for this build's Conductor and, when
# OLD_BUILD is given, an older build's Conductor with this build's nodes (same cluster, same
# load, interleaved in rounds). The cost model starts from `cost.profile: auto` and is
# refitted from the nodes' timing samples, as in production.
# usage: bench/cluster/ttft_prediction.sh [BUILD_DIR] [OLD_BUILD_DIR|""] [MODEL] [ROUNDS]
#        [PROMPTS] [CONCURRENCY] [INPUT_LEN] [OUTPUT_LEN]
set -eu
# The daemons prove a cluster secret to each other (docs/arch/security.md): a throwaway one
# unless the caller gives one.
if [ -z "${TYCHO_CLUSTER_SECRET_FILE:-}" ]; then
    TYCHO_CLUSTER_SECRET_FILE=$(mktemp -d)/cluster.secret
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TYCHO_CLUSTER_SECRET_FILE")
fi
export TYCHO_CLUSTER_SECRET_FILE
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
OLD="${2:-}"
DATA="${TYCHO_TEST_DATA:-$ROOT/../shared}"
MODEL="${3:-$DATA/models/stories260K/stories260K.gguf}"
ROUNDS="${4:-2}"
N="${5:-96}"
C="${6:-32}"
IN="${7:-32}"
OUT="${8:-4}"
TYCHO="$BUILD/src/cli/tycho"
PORT=18160
RES=$(mktemp -d)
export TYCHO_CLUSTER_DIR="$RES/cluster"
cleanup() {
    sh "$ROOT/deploy/local-cluster.sh" stop >/dev/null 2>&1 || true
    rm -rf "$RES"
}
trap cleanup EXIT
# a binary tree with the old Conductor and this build's nodes
if [ -n "$OLD" ]; then
    OLD="$(cd "$OLD" && pwd)"
    mkdir -p "$RES/mixed/src/conductor" "$RES/mixed/src/prefill" "$RES/mixed/src/decode" \
        "$RES/mixed/src/store"
    old_c="$OLD/src/conductor/tycho-conductor" # (before the re-cut: src/conductor/cluster/)
    [ -x "$old_c" ] || old_c="$OLD/src/conductor/cluster/tycho-conductor"
    ln -s "$old_c" "$RES/mixed/src/conductor/"
    for b in prefill/tycho-prefill decode/tycho-decode store/tycho-store; do
        ln -s "$BUILD/src/$b" "$RES/mixed/src/$b"
    done
fi
run() { # name bin_dir
    TYCHO_BIN_DIR="$2" TYCHO_PREFILL_ARGS="--prefill_batch=8" \
        sh "$ROOT/deploy/local-cluster.sh" start --model "$MODEL" --port "$PORT" --prefill 2 \
        --decode 2 --pool 0 >/dev/null
    # a few requests alone first, so that the cost model is fitted before the burst
    "$TYCHO" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 24 \
        --request-rate 4 --random-input-len "$IN" --random-output-len "$OUT" --seed 2 \
        --json /dev/null >/dev/null
    curl -sf "http://127.0.0.1:$PORT/metrics" >"$RES/$1.before"
    "$TYCHO" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "$N" \
        --request-rate inf --max-concurrency "$C" --random-input-len "$IN" \
        --random-output-len "$OUT" --seed 1 --json "$RES/$1.json" >/dev/null
    curl -sf "http://127.0.0.1:$PORT/metrics" >"$RES/$1.after"
    TYCHO_BIN_DIR="$2" sh "$ROOT/deploy/local-cluster.sh" stop >/dev/null
}
echo "# $MODEL: $N requests at once, concurrency $C, $IN-token prompts, $OUT output tokens"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    run "r$r-new" "$BUILD"
    [ -z "$OLD" ] || run "r$r-old" "$RES/mixed"
    echo "# round $r done"
    r=$((r + 1))
done
python3 - "$RES" "$ROUNDS" "$OLD" <<'EOF'
import json, os, sys
res, rounds, old = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def metric(path, name):
    with open(path) as f:
        for line in f:
            if line.startswith(name + " ") or line.startswith(name + "{}"):
                return float(line.split()[-1])
    return 0.0

rows = []
print("\n| round | Conductor | ok / failed | mean TTFT ms (measured) | mean predicted ms | "
      "predicted / measured |")
print("|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    for name, label in (("new", "this build"), ("old", "old build")):
        base = os.path.join(res, "r%d-%s" % (r, name))
        if not os.path.exists(base + ".json"):
            continue
        with open(base + ".json") as f:
            d = json.load(f)
        s = [metric(base + ".after", "tycho_scheduler_predicted_ttft_seconds_" + k) -
             metric(base + ".before", "tycho_scheduler_predicted_ttft_seconds_" + k)
             for k in ("sum", "count")]
        pred = 1e3 * s[0] / s[1] if s[1] else float("nan")
        ratio = pred / d["mean_ttft_ms"]
        rows.append({"round": r, "conductor": name, "completed": d["completed"],
                     "failed": d["failed"], "mean_ttft_ms": d["mean_ttft_ms"],
                     "mean_predicted_ms": pred, "ratio": ratio})
        print("| %d | %s | %d / %d | %.1f | %.1f | %.2f |" % (
            r, label, d["completed"], d["failed"], d["mean_ttft_ms"], pred, ratio))
for row in rows:
    print(json.dumps(row))
EOF
