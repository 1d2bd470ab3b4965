#!/usr/bin/env bash
# Install what is missing, build, and start Tycho serving on this machine.
# Usage: scripts/serve.sh [--model PATH] [--port N] [other `tycho serve` options]
# Without --model it serves the stories260K test model when ../shared has it, otherwise a
# small random-weight model made with `tycho mkmodel` (its output is noise).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/install-deps.sh
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
TYCHO="$BUILD_DIR/src/cli/tycho"
if "$TYCHO" --help | grep -q '^  serve '; then
  exec "$TYCHO" serve "$@"
fi
# The HTTP server (`tycho serve`) is not built in this version; what exists is generation.
model=${TYCHO_MODEL:-../shared/models/stories260K/stories260K.gguf}
if [ "${1:-}" = "--model" ]; then model=$2; shift 2; fi
if [ ! -e "$model" ]; then
  model="$BUILD_DIR/random-110m.gguf"
  [ -e "$model" ] || "$TYCHO" mkmodel --preset 110m --out "$model"
  echo "serve.sh: no model given; using a random-weight model, its output is noise." >&2
  echo "serve.sh: point it at a real model with: scripts/serve.sh --model FILE.gguf" >&2
fi
echo "serve.sh: this version has no HTTP server yet; generating from $model" >&2
exec "$TYCHO" generate --model "$model" --prompt "${TYCHO_PROMPT:-Once upon a time}" -n 64
