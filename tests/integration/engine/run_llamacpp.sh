#!/bin/sh
# ctest wrapper: skip (77) without node, else run the llama.cpp comparison.
command -v node >/dev/null 2>&1 || { echo "skip: no node"; exit 77; }
exec node "$(dirname "$0")/test_llamacpp.mjs"
