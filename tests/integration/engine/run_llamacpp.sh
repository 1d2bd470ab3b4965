#!/bin/sh
# ctest wrapper: skip (77) without node, else run a llama.cpp comparison (default
# test_llamacpp.mjs; the first argument names another script in this folder).
command -v node >/dev/null 2>&1 || { echo "skip: no node"; exit 77; }
exec node "$(dirname "$0")/${1:-test_llamacpp.mjs}"
