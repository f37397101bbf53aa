#!/usr/bin/env bash
# The test binary holds the CUDA kernel's source twice over in a CUDA build: the emulated copy
# (tests/cuda/group_norm_silu_emulated_test.cpp) and the nvcc-built one in the library. Under one
# name the linker took the test's copy for both, and the library's caller ran the emulator on
# device pointers. This reads the binary's defined symbols:
#   the emulated entry point is under cuda_kernels::emulated;
#   the real one is defined where the kernels were built (KERNELS_BUILT ON: from the library's
#   nvcc-built object, the only other definition) and nowhere else.
#   tests/cuda/emulator_names_test.sh TEST_BINARY KERNELS_BUILT(ON|OFF)
set -euo pipefail
binary=$1
built=$2
symbols=$(nm -C --defined-only "$binary" | grep -F 'spritetorch::diffusion::cuda_kernels::' || true)
emulated=$(grep -c 'cuda_kernels::emulated::group_norm_silu_forward(' <<<"$symbols" || true)
real=$(grep -v 'cuda_kernels::emulated::' <<<"$symbols" | grep -c 'group_norm_silu_forward(' || true)
echo "emulated entry points: $emulated; real ones: $real (kernels built: $built)"
[ "$emulated" -ge 1 ] || { echo "FAIL: no cuda_kernels::emulated::group_norm_silu_forward in $binary"; exit 1; }
case $built in
ON) [ "$real" -ge 1 ] ||
      { echo "FAIL: the library's nvcc-built kernel is not linked into $binary"; exit 1; } ;;
*) [ "$real" -eq 0 ] ||
      { echo "FAIL: a build without CUDA kernels defines cuda_kernels::group_norm_silu_forward outside emulated"; exit 1; } ;;
esac
echo ok
