#!/usr/bin/env bash
# Benchmark `tycho serve` on stories260K with `tycho bench serve` (docs/benchmarks.md).
# Usage: bench/serve/run.sh [BUILD_DIR]
set -euo pipefail
B=${1:-build}
T="$B/src/cli/tycho"
M=${TYCHO_TEST_DATA:-../shared}/models/stories260K/stories260K.gguf
PORT=${PORT:-18230}
"$T" serve --model "$M" --port "$PORT" & pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
"$T" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 200 --request-rate 50 \
  --max-concurrency 32 --random-input-len 128 --random-output-len 128 \
  --goodput ttft:100 tpot:20
