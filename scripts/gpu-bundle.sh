#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --prebuilt needs into one archive, for a GPU machine that
# cannot build Tycho itself (no Debian -dev packages, no network): the GPU tests and
# benchmarks and `tycho` built here with CUDA, the shared libraries they load that are not part
# of glibc or the CUDA driver/toolkit, and the two small test models.
#
# usage: scripts/gpu-bundle.sh BUILD_DIR OUT.tar.xz
#   BUILD_DIR: configured with -DTYCHO_CUDA=ON and built (targets tycho, test_gpu_*,
#   bench_gpu_*); TYCHO_TEST_DATA (default ../shared) holds the models.
# On the GPU machine: mkdir B && tar -xJf OUT.tar.xz -C B && scripts/gpu-check.sh --prebuilt B
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:?usage: gpu-bundle.sh BUILD_DIR OUT.tar.xz}"
OUTF="${2:?usage: gpu-bundle.sh BUILD_DIR OUT.tar.xz}"
DATA="${TYCHO_TEST_DATA:-$SRC/../shared}"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/data"

bins=("$BUILD/src/cli/tycho" "$BUILD/src/conductor/tycho-conductor"
      "$BUILD/src/prefill/tycho-prefill" "$BUILD/src/decode/tycho-decode"
      "$BUILD/src/store/tycho-store")
while IFS= read -r f; do bins+=("$f"); done < <(find "$BUILD/tests/gpu" "$BUILD/bench/gpu" \
    -maxdepth 2 -type f -perm -u+x \( -name 'test_gpu_*' -o -name 'bench_gpu_*' \) | sort)
for b in "${bins[@]}"; do
    [ -x "$b" ] || { echo "gpu-bundle: $b missing (build it first)" >&2; exit 1; }
    cp "$b" "$STAGE/bin/"
done

# Libraries: everything ldd resolves except glibc's own, the C++/GCC runtime and zlib (present
# on any machine with CUDA), and cuBLAS (the GPU machine's toolkit provides its own).
skip='^(ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libz|libcublas|libcublasLt|linux-vdso)\.'
ldd "${bins[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
while IFS= read -r lib; do
    base=$(basename "$lib")
    echo "$base" | grep -qE "$skip" && continue
    cp -L "$lib" "$STAGE/lib/$base"
done

for m in stories260K/stories260K.gguf llama-2-tiny-random/llama-2-tiny-random.gguf; do
    if [ -f "$DATA/models/$m" ]; then
        mkdir -p "$STAGE/data/models/$(dirname "$m")"
        cp "$DATA/models/$m" "$STAGE/data/models/$m"
    else
        echo "gpu-bundle: $DATA/models/$m missing; the tests that need it will skip" >&2
    fi
done
tar -cJf "$OUTF" -C "$STAGE" bin lib data
echo "gpu-bundle: $OUTF ($(du -h "$OUTF" | cut -f1); ${#bins[@]} programs, $(ls "$STAGE/lib" | wc -l) libraries)"
