#!/bin/sh
# Trace experiments of issue 6: cache-sim tables, the policy comparison (FAST'25 Fig. 5), the
# 2x overload admission comparison (arXiv Table 3, with bench/sim/capacity.py), the scheduler decision benchmark, and
# gnuplot PNGs. Usage: bench/sim/run.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR defaults to build, OUT_DIR to BUILD_DIR/bench-sim-out. Needs gnuplot for the PNGs.
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$SRC/build}
OUT=${2:-$BUILD/bench-sim-out}
DATA=${TYCHO_TEST_DATA:-$SRC/../shared}/data/traces
TYCHO=$BUILD/src/cli/tycho
CONV=$DATA/conversation_trace.jsonl
SYN=$DATA/synthetic_trace.jsonl
mkdir -p "$OUT"

echo "== cache-sim: conversation"
"$TYCHO" cache-sim --trace "$CONV" | tee "$OUT/cache_conversation.txt"
echo "== cache-sim: synthetic"
"$TYCHO" cache-sim --trace "$SYN" | tee "$OUT/cache_synthetic.txt"

echo "== policies, conversation trace, 8 prefill + 8 decode (FAST'25 Fig. 5)"
mkdir -p "$OUT/policies"
/usr/bin/time -f "wall %e s" "$TYCHO" sim --trace "$CONV" --config "$SRC/configs/sim/conversation-16.yaml" \
    --policy all --plot "$OUT/policies" | tee "$OUT/policies.txt"

echo "== policies with 10,000-block caches per prefill node"
"$TYCHO" sim --trace "$CONV" --config "$SRC/configs/sim/conversation-16.yaml" --policy all \
    --sweep --capacities 10000 | tee "$OUT/policies_10k.txt"

echo "== admission at 2x speed (arXiv Table 3): stage capacities, then the two settings"
python3 "$SRC/bench/sim/capacity.py" "$CONV" | tee "$OUT/capacity.txt"
for cfg in overload-2x overload-2x-tbt25; do
    mkdir -p "$OUT/$cfg"
    "$TYCHO" sim --trace "$CONV" --config "$SRC/configs/sim/$cfg.yaml" --admission all \
        --plot "$OUT/$cfg" | tee "$OUT/$cfg.txt"
    [ ! -f "$OUT/$cfg/load.dat" ] || python3 "$SRC/bench/sim/fluctuation.py" "$OUT/$cfg/load.dat" | tee "$OUT/$cfg.fluctuation.txt"
    "$TYCHO" sim --trace "$CONV" --config "$SRC/configs/sim/$cfg.yaml" --admission all \
        --json > "$OUT/$cfg.json"
done
echo "== two SLO classes on one cluster (class_mix)"
"$TYCHO" sim --trace "$CONV" --config "$SRC/configs/sim/classes-2x.yaml" --admission all \
    | tee "$OUT/classes-2x.txt"
echo "== admission sweep (robustness): P:D x TBT SLO at TTFT 30 s"
"$TYCHO" sim --trace "$CONV" --config "$SRC/configs/sim/overload-2x.yaml" --admission all \
    --sweep --ratios 8:1,8:2,8:3,8:4 --tbt-slos 25,100 --ttft-slos 30 --json > "$OUT/admission.json"
echo "== admission grid: 30 P:D ratios x TTFT 5/10/30 s x TBT 25/50/100 ms, 2x (810 runs)"
RATIOS=$(python3 -c "print(','.join(f'{p}:{d}' for p in (4,5,6,7,8,10) for d in (1,2,3,4,6)))")
"$TYCHO" sim --trace "$CONV" --config "$SRC/configs/sim/overload-2x.yaml" --admission all \
    --sweep --ratios "$RATIOS" --tbt-slos 25,50,100 --ttft-slos 5,10,30 --json \
    > "$OUT/admission_grid.json"
python3 "$SRC/bench/sim/admission_grid.py" "$OUT/admission_grid.json" | tee "$OUT/admission_grid.txt"

echo "== scheduler decision time"
for n in "32 32" "64 64"; do
    # shellcheck disable=SC2086
    "$BUILD/bench/sim/sched_bench" "$CONV" $n 2000
done | tee "$OUT/sched_bench.txt"
