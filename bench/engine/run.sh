#!/bin/sh
# Tycho vs llama.cpp on the same ~110M-parameter GGUF (made by `tycho mkmodel`, F32 or with
# BENCH_TYPE=f16, q8_0, q4_k, q6_k or q4_k_m (llama.cpp's mix of Q4_K and Q6_K) those weights),
# prefill and decode tokens/s at 1 and 2 threads, plus memory read bandwidth, all in one run.
# usage: [BENCH_TYPE=f32|f16|q8_0|q4_k|q6_k|q4_k_m] bench/engine/run.sh [BUILD_DIR]
#        [PROMPT_TOKENS] [GEN_TOKENS]
set -eu
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
P="${2:-256}"
G="${3:-64}"
DATA="${TYCHO_TEST_DATA:-$ROOT/../shared}"
TYPE="${BENCH_TYPE:-f32}"
case "$TYPE" in f32|f16|q8_0|q4_k|q6_k|q4_k_m) ;;
    *) echo "BENCH_TYPE must be f32, f16, q8_0, q4_k, q6_k or q4_k_m" >&2; exit 2 ;; esac
MODEL="${BENCH_MODEL:-/tmp/tycho-bench-110m-$TYPE.gguf}"
BENCH="$BUILD/bench/engine/bench_engine"
if [ ! -x "$BENCH" ]; then  # bench/ not in the build yet: link against the built libraries
    BENCH=/tmp/tycho-bench_engine
    cc -O2 -D_GNU_SOURCE -I"$ROOT/include" "$ROOT/bench/engine/bench_engine.c" \
        "$BUILD/src/engine/libty_engine.a" "$BUILD/src/engine/libty_tokenizer.a" \
        "$BUILD/src/common/libty_common.a" -lopenblas -ljansson -lpcre2-8 -lutf8proc -lxxhash \
        -lpthread -lm -o "$BENCH"
fi
[ -f "$MODEL" ] || "$BUILD/src/cli/tycho" mkmodel --preset 110m --type "$TYPE" \
    --vocab-from "$DATA/models/llama-2-tiny-random/llama-2-tiny-random.gguf" --out "$MODEL"
echo "# model $MODEL ($(du -m "$MODEL" | cut -f1) MiB), prompt $P tokens, decode $G tokens"
OUT=$(mktemp)
"$BENCH" "$MODEL" "$P" "$G" 2 | tee "$OUT"
if [ -f "${LLAMACPP_PREFIX:-${TYCHO_PEERS_DIR:-/opt/tycho-peers}/llamacpp}/node_modules/node-llama-cpp/package.json" ]; then
    node "$ROOT/bench/engine/llamacpp_bench.mjs" "$MODEL" "$P" "$G" 2 | tee -a "$OUT"
else
    echo "# node-llama-cpp not installed: no llama.cpp figures"
fi
# summary: best thread count per engine, ratios, decode as a fraction of bandwidth
awk -F'[:,}]' '
  /membw_gbs/ { bw = ($2 > bw) ? $2 : bw }
  /weight_bytes/ { wb = $4 }
  /"engine"/ {
    e = ($0 ~ /tycho/) ? "tycho" : "llama";
    for (i = 1; i <= NF; i++) { if ($i ~ /prefill_tok_s/) pf = $(i+1); if ($i ~ /decode_tok_s/) dc = $(i+1) }
    if (pf > bp[e]) bp[e] = pf; if (dc > bd[e]) bd[e] = dc }
  END {
    printf "# best: tycho prefill %.1f decode %.2f tok/s; llama.cpp prefill %.1f decode %.2f tok/s\n", bp["tycho"], bd["tycho"], bp["llama"], bd["llama"];
    if (bp["llama"] > 0) printf "# ratio tycho/llama.cpp: prefill %.2fx decode %.2fx\n", bp["tycho"]/bp["llama"], bd["tycho"]/bd["llama"];
    printf "# memory read bandwidth %.2f GB/s; weights %.1f MB; decode = %.0f%% (tycho)", bw, wb/1e6, 100*wb*bd["tycho"]/(bw*1e9);
    if (bd["llama"] > 0) printf ", %.0f%% (llama.cpp)", 100*wb*bd["llama"]/(bw*1e9);
    printf " of bandwidth\n" }' "$OUT"
rm -f "$OUT"
