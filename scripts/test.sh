#!/usr/bin/env bash
# Install what is missing, build with warnings as errors, and run the whole test suite.
# Usage: scripts/test.sh [extra ctest args]   (BUILD_DIR=build by default)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/install-deps.sh
bash scripts/install-peers.sh || echo "test.sh: reference peers not installed; tests that need them skip"
cmake -S . -B "$BUILD_DIR" -DTYCHO_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j"$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
