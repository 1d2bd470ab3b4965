#!/bin/sh
# `tycho serve` of this build against `tycho serve` of another build (OLD_BUILD) on the same
# model and the same `tycho bench serve` load, interleaved in rounds so that the shared
# machine's noise hits both alike: output tokens/s, mean TPOT and TTFT, and the ratios.
# A large-vocabulary model with few weights shows the host's per-token work (sampling, the
# logits rows) next to the forward.
# usage: bench/serve/ab.sh BUILD_DIR OLD_BUILD_DIR MODEL [ROUNDS] [PROMPTS] [CONCURRENCY]
#        [INPUT_LEN] [OUTPUT_LEN] [TEMPERATURE] [TOP_P]
# env: SERVE_ARGS (more `tycho serve` flags for both, e.g. "--engine.kv_pages=64"),
#      BENCH_ARGS (more `tycho bench serve` flags, e.g. "--max-tokens 400"), VOCAB (prompt ids
#      are drawn below it; 30000)
set -eu
[ $# -ge 3 ] || { sed -n 2,10p "$0" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
NEW="$(cd "$1" && pwd)/src/cli/tycho"
OLD="$(cd "$2" && pwd)/src/cli/tycho"
MODEL="$3"
ROUNDS="${4:-3}"
N="${5:-256}"
C="${6:-64}"
IN="${7:-32}"
OUT="${8:-64}"
TEMP="${9:-0}"
TOPP="${10:-1}"
PORT=18195
RES=$(mktemp -d)
PID=
cleanup() {
    [ -z "$PID" ] || kill "$PID" 2>/dev/null || true
    rm -rf "$RES"
}
trap cleanup EXIT
one() { # name binary
    # shellcheck disable=SC2086 # SERVE_ARGS / BENCH_ARGS are word lists
    "$2" serve --model "$MODEL" --port "$PORT" ${SERVE_ARGS:-} >"$RES/$1.log" 2>&1 &
    PID=$!
    i=0
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        i=$((i + 1)); [ "$i" -lt 200 ] || { echo "$1: tycho serve did not start" >&2; exit 1; }
        sleep 0.05
    done
    "$NEW" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "$N" \
        --request-rate inf --max-concurrency "$C" --random-input-len "$IN" \
        --random-output-len "$OUT" --random-vocab "${VOCAB:-30000}" --seed 1 --temperature "$TEMP" \
        --top-p "$TOPP" ${BENCH_ARGS:-} --json "$RES/$1.json" >/dev/null
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
}
echo "# $MODEL: $N requests, concurrency $C, $IN-token prompts, $OUT output tokens," \
    "temperature $TEMP, top_p $TOPP; serve: ${SERVE_ARGS:-}; bench: ${BENCH_ARGS:-}"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    one "r$r-new" "$NEW"
    one "r$r-old" "$OLD"
    r=$((r + 1))
done
python3 - "$RES" "$ROUNDS" <<'EOF'
import json, os, sys
res, rounds = sys.argv[1], int(sys.argv[2])
print("\n| round | build | ok / failed | output tokens | output tok/s | mean TPOT ms | mean TTFT ms |")
print("|---|---|---|---|---|---|---|")
rows = []
for r in range(1, rounds + 1):
    d = {}
    for b in ("new", "old"):
        with open(os.path.join(res, "r%d-%s.json" % (r, b))) as f:
            d[b] = json.load(f)
        x = d[b]
        print("| %d | %s | %d / %d | %d | %.1f | %.2f | %.1f |" % (
            r, "this" if b == "new" else "old", x["completed"], x["failed"],
            x["total_output_tokens"], x["output_throughput"], x["mean_tpot_ms"],
            x["mean_ttft_ms"]))
    rows.append({"round": r, "tok_s_ratio": d["new"]["output_throughput"] / d["old"]["output_throughput"],
                 "tpot_ratio": d["new"]["mean_tpot_ms"] / d["old"]["mean_tpot_ms"]})
for row in rows:
    print("# round %d: output tok/s this/old %.2fx, TPOT %.2fx" % (
        row["round"], row["tok_s_ratio"], row["tpot_ratio"]))
    print(json.dumps(row))
EOF
