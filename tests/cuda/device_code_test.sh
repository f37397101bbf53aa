#!/usr/bin/env bash
# Compiles every .cu file under src/ with clang's CUDA front end and its NVPTX back end, both sides
# (the kernels to PTX for sm_80, the launchers for the host), against tests/cuda/cuda_stand_in.h in
# place of a CUDA installation: the kernels' C++ is checked on machines without nvcc or a GPU (CI),
# where CMake leaves the .cu files out of the build. Where an nvcc is found (PATH, /usr/local/cuda)
# the files also go through it, for Hopper, against CUDA's real headers. Exit 77 (skipped) when
# clang has no NVPTX back end.
#   tests/cuda/device_code_test.sh CLANG++ SOURCE_DIR
set -euo pipefail
clang=$1
root=$2
if ! "$clang" --print-targets 2>/dev/null | grep -q nvptx64; then
  echo "skipped: $clang has no NVPTX back end"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(-x cuda -nocudainc -nocudalib --cuda-gpu-arch=sm_80 -std=c++17 -O2 -Wall -Wextra -Werror
        -Wno-unknown-cuda-version -DSPRITETORCH_CUDA_STAND_IN
        -include "$root/tests/cuda/cuda_stand_in.h" -I "$root/src")
mapfile -t sources < <(find "$root/src" -name '*.cu' | sort)
[ "${#sources[@]}" -gt 0 ] || { echo "no .cu files under $root/src"; exit 1; }
for source in "${sources[@]}"; do
  name=$(basename "$source" .cu)
  # Warp shuffles with a mask need PTX 6.0 or later.
  "$clang" "${common[@]}" --cuda-device-only -Xclang -target-feature -Xclang +ptx70 \
    -S -o "$work/$name.ptx" "$source"
  "$clang" "${common[@]}" --cuda-host-only -c -o "$work/$name.o" "$source"
  entries=$(grep -c '^\.visible \.entry' "$work/$name.ptx" || true)
  [ "$entries" -gt 0 ] || { echo "$source: no kernel in its PTX"; exit 1; }
  echo "$source: $entries kernels, host side compiled"
done
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ]; then
  for source in "${sources[@]}"; do
    "$nvcc" -std=c++17 -O3 -arch=sm_90 -I "$root/src" -Werror all-warnings \
      -Xcompiler -Wall,-Wextra,-Werror -c -o "$work/nvcc.o" "$source"
    echo "$source: compiled by $("$nvcc" --version | tail -1)"
  done
fi
