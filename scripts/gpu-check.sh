#!/usr/bin/env bash
# One command for a GPU machine (issue 7 item 5): configure with CUDA, build, run every
# `gpu`-labelled test and the GPU benchmarks, print a summary table. Budget: < 8 minutes on an
# H200 with 16 cores. Usage: scripts/gpu-check.sh [BUILD_DIR]   (default build-gpu-check)
# Env: TYCHO_TEST_DATA (default ../shared: stories260K for the e2e test, a tokenizer GGUF for
# the 1B model), TYCHO_BENCH_MODEL (an existing ~1B GGUF to use instead of generating one).
# Exit status: 0 when every gpu test passed (skips count as failures here: a GPU is expected).
set -uo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$SRC/build-gpu-check}"
JOBS="$(nproc 2>/dev/null || echo 4)"
LOG="$BUILD/gpu-check-logs"
T0=$(date +%s)
mkdir -p "$LOG"
declare -a ROWS

row() { ROWS+=("$(printf '%-44s %-10s %s' "$1" "$2" "$3")"); }
elapsed() { echo $(( $(date +%s) - T0 ))s; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    | sed 's/^/gpu: /' || echo "gpu: nvidia-smi not available"

if ! timeout 120 cmake -S "$SRC" -B "$BUILD" -DTYCHO_CUDA=ON -DTYCHO_WERROR=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$LOG/configure.log" 2>&1; then
    tail -30 "$LOG/configure.log"; echo "gpu-check: configure failed"; exit 1
fi
# Only the GPU targets: the rest of the tree is CI's job and would cost minutes here.
TARGETS=$(cd "$BUILD" && cmake --build . --target help | awk '/^\.\.\. (test_gpu_|bench_gpu_|ty_backend_cuda|ty_kernels|tycho$)/ {print $2}')
if ! timeout 300 cmake --build "$BUILD" -j"$JOBS" --target $TARGETS >"$LOG/build.log" 2>&1; then
    grep -E "error|warning" "$LOG/build.log" | head -40; echo "gpu-check: build failed"; exit 1
fi
row "build (kernels, backend, gpu tests, benches)" ok "$(elapsed)"

status=0
timeout 240 ctest --test-dir "$BUILD" -L gpu --output-on-failure --no-tests=error \
    >"$LOG/ctest.log" 2>&1 || status=1
while read -r line; do
    name=$(echo "$line" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/')
    res=$(echo "$line" | grep -q "Passed" && echo pass || (echo "$line" | grep -q "Skipped" && echo SKIP || echo FAIL))
    [ "$res" = pass ] || status=1
    row "test $name" "$res" "$(echo "$line" | grep -oE '[0-9.]+ sec')"
done < <(grep -E "Test +#[0-9]+:" "$LOG/ctest.log")

bench() { # name, command...
    local name=$1; shift
    if timeout 120 "$@" >"$LOG/$name.log" 2>&1; then
        while read -r _ key val unit; do row "$key" "$val" "$unit"; done < <(grep '^RESULT' "$LOG/$name.log")
    else
        row "$name" "rc=$?" "see $LOG/$name.log"
    fi
}
bench bench_gpu_attn "$BUILD/bench/gpu/bench_gpu_attn"
if python3 -c "import torch" >/dev/null 2>&1; then
    bench sdpa_ref python3 "$SRC/bench/gpu/sdpa_ref.py"
else
    row "sdpa_ref (PyTorch SDPA)" skipped "torch not importable"
fi
# Decode tokens/s of a ~1B random model (TinyLlama-1.1B shape, f16), made once per build dir
# (~20 s of `tycho mkmodel`; the file is 2.2 GB).
DATA="${TYCHO_TEST_DATA:-$SRC/../shared}"
MODEL1B="${TYCHO_BENCH_MODEL:-$BUILD/bench-models/1b-f16.gguf}"
VOCAB="$DATA/models/llama-2-tiny-random/llama-2-tiny-random.gguf"
if [ ! -f "$MODEL1B" ] && [ -f "$VOCAB" ] && [ -x "$BUILD/src/cli/tycho" ]; then
    mkdir -p "$(dirname "$MODEL1B")"
    timeout 120 "$BUILD/src/cli/tycho" mkmodel --preset 1b --type f16 --vocab-from "$VOCAB" \
        --out "$MODEL1B" >"$LOG/mkmodel.log" 2>&1 || rm -f "$MODEL1B"
fi
if [ -x "$BUILD/bench/gpu/bench_gpu_decode" ] && [ -f "$MODEL1B" ]; then
    bench bench_gpu_decode "$BUILD/bench/gpu/bench_gpu_decode" "$MODEL1B" --batches 1,16,64 \
        --prompt 128 --steps 64 --tag 1b --compare-graphs
else
    row "bench_gpu_decode (1B model)" skipped "no model: $VOCAB or tycho missing"
fi

# Targets of issue 7, from the RESULT lines.
get() { grep -h "^RESULT $1 " "$LOG"/*.log 2>/dev/null | awk '{print $3}' | head -1; }
r=$(get decode_attn_b64_ctx4096_vs_copy)
[ -n "$r" ] && row "target: decode attn >= 0.70 x copy" "$(awk -v r="$r" 'BEGIN{print (r>=0.70)?"met":"MISSED"}')" "ratio $r"
p=$(get prefill_attn_b4_L2048_tflops); t=$(get sdpa_prefill_b4_L2048_tflops)
[ -n "$p" ] && [ -n "$t" ] && row "target: prefill attn >= 0.50 x SDPA" \
    "$(awk -v p="$p" -v t="$t" 'BEGIN{print (p>=0.5*t)?"met":"MISSED"}')" "$p vs $t TFLOP/s"

echo
printf '%-44s %-10s %s\n' "check" "result" "detail"
printf '%s\n' "--------------------------------------------------------------------------------"
printf '%s\n' "${ROWS[@]}"
echo "total $(elapsed); logs in $LOG"
exit $status
