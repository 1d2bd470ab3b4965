#!/usr/bin/env bash
# One command for a GPU machine (issue 7 item 5): build (or take a prebuilt bundle), run every
# GPU test and the GPU benchmarks, print a summary table. Budget: < 8 minutes on an H200.
#
# usage: scripts/gpu-check.sh [BUILD_DIR]          configure + build here (needs the Debian
#                                                  -dev packages), default build-gpu-check
#        scripts/gpu-check.sh --prebuilt DIR       DIR unpacked from scripts/gpu-bundle.sh
#                                                  (bin/, lib/, data/): nothing is built
# Env: TYCHO_TEST_DATA (default ../shared, or DIR/data with --prebuilt), TYCHO_BENCH_MODEL (an
# existing ~1B GGUF instead of generating one), GPU_CHECK_LOGS (where logs go), GPU_CHECK_ONLY
# (tests | bench: run one half), GPU_CHECK_SANITIZE=0 (no compute-sanitizer rerun of a failing
# op test), GPU_CHECK_TIMEOUT (seconds per program; default 240 for a test, 150 for a benchmark).
# Output: the table on stdout, the same rows in $LOG/summary.tsv, each program's log in $LOG.
# Exit status: 0 when every GPU test passed (a skip counts as a failure: a GPU is expected).
set -uo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
T0=$(date +%s)
declare -a ROWS

if [ "${1:-}" = "--prebuilt" ]; then
    PRE="$(cd "${2:?--prebuilt needs a directory}" && pwd)"
    BIN="$PRE/bin"
    LOG="${GPU_CHECK_LOGS:-$PRE/logs}"
    export TYCHO_TEST_DATA="${TYCHO_TEST_DATA:-$PRE/data}" TYCHO_BIN="$BIN/tycho"
    # cuBLAS comes from this machine's CUDA toolkit (or PyTorch's wheel), the rest from lib/.
    cublas=$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda*/lib*/libcublas.so.13 \
        /usr/lib/x86_64-linux-gnu/libcublas.so.13 2>/dev/null | head -1)
    [ -n "$cublas" ] || cublas=$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)
    export LD_LIBRARY_PATH="$PRE/lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    BUILD="${1:-$SRC/build-gpu-check}"
    BIN=
    LOG="${GPU_CHECK_LOGS:-$BUILD/gpu-check-logs}"
fi
mkdir -p "$LOG"
: >"$LOG/summary.tsv"

row() {
    ROWS+=("$(printf '%-46s %-10s %s' "$1" "$2" "$3")")
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$LOG/summary.tsv"
}
elapsed() { echo $(( $(date +%s) - T0 ))s; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || echo "gpu: nvidia-smi not available"

if [ -z "$BIN" ]; then
    if ! timeout 120 cmake -S "$SRC" -B "$BUILD" -DTYCHO_CUDA=ON -DTYCHO_WERROR=ON \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$LOG/configure.log" 2>&1; then
        tail -30 "$LOG/configure.log"; echo "gpu-check: configure failed"; exit 1
    fi
    # Only the GPU targets: the rest of the tree is CI's job and would cost minutes here.
    TARGETS=$(cd "$BUILD" && cmake --build . --target help |
        awk '/^\.\.\. (test_gpu_|bench_gpu_|ty_backend_cuda|ty_kernels|tycho$|tycho-(conductor|prefill|decode|store)$)/ {print $2}')
    if ! timeout 300 cmake --build "$BUILD" -j"$(nproc 2>/dev/null || echo 4)" --target $TARGETS \
            >"$LOG/build.log" 2>&1; then
        grep -E "error|warning" "$LOG/build.log" | head -40; echo "gpu-check: build failed"; exit 1
    fi
    row "build (kernels, backend, gpu tests, benches)" ok "$(elapsed)"
    BIN="$LOG/bin"
    mkdir -p "$BIN"
    find "$BUILD/tests/gpu" "$BUILD/bench/gpu" -maxdepth 2 -type f -perm -u+x \
        \( -name 'test_gpu_*' -o -name 'bench_gpu_*' \) -exec ln -sf {} "$BIN/" \;
    ln -sf "$BUILD/src/cli/tycho" "$BIN/tycho"
    for d in conductor prefill decode store; do
        ln -sf "$BUILD/src/$d/tycho-$d" "$BIN/tycho-$d"
    done
    export TYCHO_BIN="$BIN/tycho"
    export TYCHO_TEST_DATA="${TYCHO_TEST_DATA:-$SRC/../shared}"
fi

status=0
ONLY="${GPU_CHECK_ONLY:-all}"
# A ~1B random model (TinyLlama-1.1B shape, f16), made once (~20 s of `tycho mkmodel`; the file
# is 2.2 GB): the decode benchmark and the GPU cluster's 1.1B check use it.
MODEL1B="${TYCHO_BENCH_MODEL:-$LOG/../bench-models/1b-f16.gguf}"
VOCAB="$TYCHO_TEST_DATA/models/llama-2-tiny-random/llama-2-tiny-random.gguf"
if [ ! -f "$MODEL1B" ] && [ -f "$VOCAB" ] && [ -x "$BIN/tycho" ]; then
    mkdir -p "$(dirname "$MODEL1B")"
    timeout 120 "$BIN/tycho" mkmodel --preset 1b --type f16 --vocab-from "$VOCAB" \
        --out "$MODEL1B" >"$LOG/mkmodel.log" 2>&1 || rm -f "$MODEL1B"
fi
if [ "$ONLY" != bench ]; then
    for t in "$BIN"/test_gpu_*; do
        [ -x "$t" ] || continue
        name=$(basename "$t")
        s=$(date +%s.%N)
        timeout "${GPU_CHECK_TIMEOUT:-240}" "$t" >"$LOG/$name.log" 2>&1
        rc=$?
        secs=$(awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f s", e - s}')
        case $rc in
        0) row "test $name" pass "$secs" ;;
        77) if [ "$name" = test_gpu_attn_sm90 ] && grep -q "not sm_90" "$LOG/$name.log"; then
                row "test $name" "n/a" "$secs: not an sm_90 device" # Hopper-only kernel
            else
                row "test $name" SKIP "$secs: $(tail -1 "$LOG/$name.log")"; status=1
            fi ;;
        *) row "test $name" FAIL "rc=$rc $secs"; status=1
           grep -E "FAILED|Failure|error|rror:|nerr" "$LOG/$name.log" | head -8 | sed 's/^/    /'
           if [ "${GPU_CHECK_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null &&
              [ "$name" != test_gpu_e2e ]; then
               timeout 120 compute-sanitizer --tool memcheck --print-limit 20 "$t" \
                   >"$LOG/$name.memcheck.log" 2>&1
               row "  memcheck $name" "rc=$?" "$(grep -m1 -E 'ERROR SUMMARY' "$LOG/$name.memcheck.log")"
           fi ;;
        esac
    done
    # On an sm_90 device the whole model once more with the Hopper prefill kernel, which
    # servers take only with TYCHO_CUDA_SM90_PREFILL=1 until it has passed here.
    if [ -x "$BIN/test_gpu_e2e" ] && grep -q "PASSED" "$LOG/test_gpu_attn_sm90.log" 2>/dev/null &&
       ! grep -q "FAILED\|not sm_90" "$LOG/test_gpu_attn_sm90.log"; then
        s=$(date +%s.%N)
        TYCHO_CUDA_SM90_PREFILL=1 timeout "${GPU_CHECK_TIMEOUT:-240}" "$BIN/test_gpu_e2e" \
            >"$LOG/test_gpu_e2e.sm90.log" 2>&1
        rc=$?
        secs=$(awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f s", e - s}')
        if [ $rc = 0 ]; then row "test test_gpu_e2e, sm90 prefill" pass "$secs"
        else row "test test_gpu_e2e, sm90 prefill" FAIL "rc=$rc $secs"; status=1; fi
    fi
fi

# The disaggregated cluster on the GPU: Conductor + prefill (cuda) + decode (cuda) processes
# against `tycho generate --backend cuda` and the CPU engine (tests/integration/cluster,
# case gpu: 8 x 256 tokens of stories260K, 4 x 64 of the 1.1B model, tcp forced, a pool hit,
# a decode node killed mid-stream).
if [ "$ONLY" != bench ] && [ -x "$BIN/tycho-decode" ]; then
    s=$(date +%s.%N)
    TYCHO_BIN_DIR="$BIN" TYCHO_GPU_1B_MODEL="$MODEL1B" timeout "${GPU_CHECK_TIMEOUT:-240}" \
        python3 "$SRC/tests/integration/cluster/test_cluster.py" "$BIN" gpu \
        >"$LOG/cluster_gpu.log" 2>&1
    rc=$?
    secs=$(awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f s", e - s}')
    case $rc in
    0) row "test cluster_gpu (P/D on cuda)" pass "$secs" ;;
    77) row "test cluster_gpu (P/D on cuda)" SKIP "$secs: $(tail -1 "$LOG/cluster_gpu.log")"; status=1 ;;
    *) row "test cluster_gpu (P/D on cuda)" FAIL "rc=$rc $secs"; status=1
       grep -E "^FAIL" "$LOG/cluster_gpu.log" | head -8 | sed 's/^/    /' ;;
    esac
fi

bench() { # name, command...
    local name=$1; shift
    timeout "${GPU_CHECK_TIMEOUT:-150}" "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    if [ $rc = 0 ]; then
        while read -r _ key val unit; do row "$key" "$val" "$unit"; done < <(grep '^RESULT' "$LOG/$name.log")
    else
        row "$name" "rc=$rc" "$(tail -1 "$LOG/$name.log")"
    fi
}
if [ "$ONLY" != tests ]; then
    bench bench_gpu_attn "$BIN/bench_gpu_attn"
    if python3 -c "import torch" >/dev/null 2>&1; then
        bench sdpa_ref python3 "$SRC/bench/gpu/sdpa_ref.py"
    else
        row "sdpa_ref (PyTorch SDPA)" skipped "torch not importable"
    fi
    if [ -x "$BIN/bench_gpu_decode" ] && [ -f "$MODEL1B" ]; then
        bench bench_gpu_decode "$BIN/bench_gpu_decode" "$MODEL1B" --batches 1,16,64 \
            --prompt 128 --steps 64 --tag 1b --compare-graphs
    else
        row "bench_gpu_decode (1B model)" skipped "no model: $VOCAB or tycho missing"
    fi
    # KV handoff between two processes on this GPU: CUDA IPC vs a device copy, tcp staging vs
    # iperf3 (issue 22)
    bench handoff bash "$SRC/bench/gpu/handoff.sh" "$BIN/tycho" 3
    # Where a batch-64 decode step of the 1B model spends its device time: Nsight Compute's
    # duration of each kernel launched after the prefill, summed by kernel name.
    if [ "${GPU_CHECK_PROFILE:-0}" = 1 ] && command -v ncu >/dev/null && [ -f "$MODEL1B" ]; then
        timeout 150 ncu --clock-control none --csv --metrics gpu__time_duration.sum \
            --launch-skip 600 --launch-count 500 "$BIN/bench_gpu_decode" "$MODEL1B" \
            --batches 64 --prompt 16 --steps 2 --tag prof >"$LOG/ncu_decode.csv" 2>"$LOG/ncu_decode.err"
        python3 "$SRC/bench/gpu/ncu_summary.py" "$LOG/ncu_decode.csv" >"$LOG/ncu_decode.txt" 2>&1 &&
            row "profile: decode b64 kernels" "see" "ncu_decode.txt" || row "profile" failed "$(tail -1 "$LOG/ncu_decode.err")"
    fi
fi

# Targets of issue 7, from the RESULT lines.
get() { grep -h "^RESULT $1 " "$LOG"/*.log 2>/dev/null | awk '{print $3}' | head -1; }
r=$(get decode_attn_b64_ctx4096_vs_copy)
[ -n "$r" ] && row "target: decode attn >= 0.70 x copy" "$(awk -v r="$r" 'BEGIN{print (r>=0.70)?"met":"MISSED"}')" "ratio $r"
for L in 1024 4096; do
    p=$(get prefill_attn_b4_L${L}_tflops); t=$(get sdpa_prefill_b4_L${L}_tflops)
    [ -n "$p" ] && [ -n "$t" ] && row "prefill attn / SDPA at 4 x $L" \
        "$(awk -v p="$p" -v t="$t" 'BEGIN{printf "%.2f", p/t}')" "$p vs $t TFLOP/s"
done
for k in handoff_cuda_ipc_1m_vs_d2d handoff_cuda_ipc_64k_vs_d2d handoff_tcp_staging_vs_iperf3; do
    r=$(get $k)
    [ -n "$r" ] && row "target: $k >= 0.8" "$(awk -v r="$r" 'BEGIN{print (r>=0.8)?"met":"MISSED"}')" "ratio $r"
done
p=$(get prefill_attn_b4_L2048_tflops); t=$(get sdpa_prefill_b4_L2048_tflops)
[ -n "$p" ] && [ -n "$t" ] && row "target: prefill attn >= 0.50 x SDPA" \
    "$(awk -v p="$p" -v t="$t" 'BEGIN{print (p>=0.5*t)?"met":"MISSED"}')" "$p vs $t TFLOP/s ($(awk -v p="$p" -v t="$t" 'BEGIN{printf "%.2f", p/t}')x)"

echo
printf '%-46s %-10s %s\n' "check" "result" "detail"
printf '%s\n' "--------------------------------------------------------------------------------"
printf '%s\n' "${ROWS[@]}"
echo "total $(elapsed); logs in $LOG"
exit $status
