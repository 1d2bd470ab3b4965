#!/bin/sh
# The KV cache's element type at long context: Tycho with f32 pages, Tycho with f16 pages and
# llama.cpp (whose default KV cache is f16) on the same F16 ~110M GGUF and the same token ids,
# interleaved in rounds so that the shared machine's noise hits all three alike, with the
# memory read bandwidth measured in each Tycho run. A decode step at long context reads the
# weights and every context token's K and V once: the summary gives each engine's share of
# the bandwidth counting both, and the f16/f32 and Tycho/llama.cpp ratios per round.
# usage: bench/engine/kv_dtype.sh [BUILD_DIR] [PROMPT_TOKENS] [GEN_TOKENS] [ROUNDS] [MAX_THREADS]
set -eu
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
P="${2:-896}"
G="${3:-64}"
ROUNDS="${4:-2}"
T="${5:-1}"
DATA="${TYCHO_TEST_DATA:-$ROOT/../shared}"
MODEL="${BENCH_MODEL:-/tmp/tycho-bench-110m-f16.gguf}"
BENCH="$BUILD/bench/engine/bench_engine"
[ -x "$BENCH" ] || { echo "no $BENCH: build the tree first" >&2; exit 2; }
[ -f "$MODEL" ] || "$BUILD/src/cli/tycho" mkmodel --preset 110m --type f16 \
    --vocab-from "$DATA/models/llama-2-tiny-random/llama-2-tiny-random.gguf" --out "$MODEL"
PEER="${LLAMACPP_PREFIX:-${TYCHO_PEERS_DIR:-/opt/tycho-peers}/llamacpp}"
echo "# model $MODEL, prompt $P tokens, decode $G tokens, threads 1..$T, $ROUNDS rounds"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for kv in f32 f16; do
        BENCH_KV=$kv "$BENCH" "$MODEL" "$P" "$G" "$T" | sed "s/^{/{\"round\":$r,/" | tee -a "$OUT"
    done
    if [ -f "$PEER/node_modules/node-llama-cpp/package.json" ]; then
        node "$ROOT/bench/engine/llamacpp_bench.mjs" "$MODEL" "$P" "$G" "$T" |
            sed "s/^{/{\"round\":$r,/" | tee -a "$OUT"
    else
        echo "# node-llama-cpp not installed under $PEER: no llama.cpp figures"
    fi
    r=$((r + 1))
done
python3 - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
bw = max(r["membw_gbs"] for r in rows if "membw_gbs" in r) * 1e9
wb = next(r["weight_bytes"] for r in rows if "weight_bytes" in r)
kv16 = next(r["kv_bytes_per_step"] for r in rows if r.get("kv_dtype") == "f16")
best = {}  # (round, engine) -> (decode, prefill, kv bytes per step), best thread count
for r in rows:
    if "engine" not in r:
        continue
    name = "tycho " + r["kv_dtype"] if r["engine"] == "tycho" else "llama.cpp (f16)"
    kv = r.get("kv_bytes_per_step", kv16)
    k = (r["round"], name)
    if k not in best or r["decode_tok_s"] > best[k][0]:
        best[k] = (r["decode_tok_s"], r["prefill_tok_s"], kv)
print("\n| round | engine | prefill tok/s | decode tok/s | MB read per step | share of %.1f GB/s |"
      % (bw / 1e9))
print("|---|---|---|---|---|---|")
for (rnd, name), (dec, pf, kv) in sorted(best.items()):
    print("| %d | %s | %.1f | %.2f | %.0f | %.0f %% |" %
          (rnd, name, pf, dec, (wb + kv) / 1e6, 100 * (wb + kv) * dec / bw))
for rnd in sorted({k[0] for k in best}):
    f32, f16 = best.get((rnd, "tycho f32")), best.get((rnd, "tycho f16"))
    ll = best.get((rnd, "llama.cpp (f16)"))
    line = "# round %d: decode f16/f32 %.2fx" % (rnd, f16[0] / f32[0])
    if ll:
        line += ", tycho f16 / llama.cpp %.2fx (f32: %.2fx)" % (f16[0] / ll[0], f32[0] / ll[0])
    print(line)
per_tok = {r["kv_dtype"]: r["kv_bytes_per_token"] for r in rows if "kv_dtype" in r}
print("# KV per context token: " + ", ".join("%s %.0f bytes" % kv for kv in sorted(per_tok.items())))
EOF
