#!/usr/bin/env bash
# Install what is missing, build, and start `tycho serve` (the OpenAI API on this machine).
# Usage: scripts/serve.sh [--model PATH] [--port N] [--host H] [other `tycho serve` options]
# Without --model it serves the stories260K test model when ../shared has it; otherwise
# `tycho serve` makes a small random-weight model (its output is noise) and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/install-deps.sh
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target tycho
TYCHO="$BUILD_DIR/src/cli/tycho"
stories=../shared/models/stories260K/stories260K.gguf
case " $* " in
  *" --model "*|*" --model="*|*" --config "*|*" --config="*) exec "$TYCHO" serve "$@" ;;
esac
if [ -e "$stories" ]; then
  exec "$TYCHO" serve --model "$stories" "$@"
fi
exec "$TYCHO" serve "$@"
