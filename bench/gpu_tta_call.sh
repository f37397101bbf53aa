#!/usr/bin/env bash
# One device-tool call (10 minutes; a session's device time is 15 minutes with the start): the
# build, the CUDA tests that no GPU has run yet, the seed workload's default path against the Python
# peer (RUN_DEFAULT=1), time-to-accuracy rows against the peer (by TTA_END s at the latest), the
# fused GroupNorm + SiLU kernel's sampling rows, then the rest of the CUDA-relevant tests in what
# is left, ending near END s (default 560; set it to the call's timeout_s less ~20 s). The first
# tests: the fused GroupNorm + SiLU kernel (NCHW and NHWC), activation checkpointing,
# micro-batches and the whitened first convolution computed on CUDA
# (PatchWhitening.OnCudaTheSameFilters). The rows (TTA_ROWS, in order; a cut row prints what it
# reached): 92% with --recipe fast (4 epochs, the whitened first convolution: 760 steps on a CPU,
# docs/benchmarks.md "A whitened first convolution"), 93% with --recipe mid --epochs 5 (whitened
# too: 950 steps on a CPU, against ~2,700 for wide on the H100) (~30 and ~40 s with their peer),
# then 94% with --recipe long (whitened too: epochs 20-21 on a CPU; ~130 s). The kernel's rows
# (RUN_GNSILU=1: `gpu_round2.sh gnsilu`, 8 runs: bf16 and fp32, NCHW and channels_last, the
# kernel on and off, ~80-120 s) take .gpu-deps/gen32.pt when carried.
# On 2026-11-26 (docs/benchmarks.md, H200) it ran with
# FIRST_TESTS="FlatOptimizer|StepOnDevice|AdamKernels" RUN_DEFAULT=1 TTA_ROWS="fast 0.92 40;mid 0.93 100".
# On 2026-12-04 (H200; 418 s) with END=440 TTA_END=340 TTA_ROWS="fast 0.92 20;mid 0.93 20 --epochs 5":
# the build 204 s, the first tests ~7 s, the two rows ~110 s, gnsilu ~77 s.
# Order: build (~175-250 s), the first tests (~10-30 s), default (~60 s), the rows, gnsilu, tests.
#   device tool: bash bench/gpu_tta_call.sh   (carry .gpu-deps: scripts/gpu-build --pack; before
#   the call, scripts/cuda-syntax-check --all here: a CUDA branch that does not compile costs a build)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
first_tests="GroupNormSilu|GraphSampling|ActivationCheckpoint|ClassifierCheckpointing"
FIRST_TESTS=${FIRST_TESTS:-$first_tests|MicroBatches|AugmentCuda|PatchWhitening|emulator}
RUN_DEFAULT=${RUN_DEFAULT:-0}
RUN_GNSILU=${RUN_GNSILU:-1}
TTA_ROWS=${TTA_ROWS:-long 0.94 100;fast 0.92 20;mid 0.93 20 --epochs 5}
# The call ends near END seconds (its timeout_s less a margin); the rows stop by TTA_END at the latest.
END=${END:-560}
TTA_END=${TTA_END:-$((END - 100))}
t0=$SECONDS
# seconds_until LIMIT [MOST]: what is left of the call until LIMIT s, at least 30 and at most MOST.
seconds_until() {
  local left=$(($1 - (SECONDS - t0)))
  [ -n "${2:-}" ] && [ "$left" -gt "$2" ] && left=$2
  echo $((left < 30 ? 30 : left))
}
{
  bash bench/gpu_round2.sh build
  echo "after build: $((SECONDS - t0)) s"
  # The whole logs come back in $OUT (a crashed suite prints no gtest Failure line).
  timeout 90 ctest --test-dir build-gpu -j 8 --output-on-failure -R "$FIRST_TESTS" \
    >"$OUT/first_tests.log" 2>&1
  grep -E "tests passed|tests failed|\*\*\*|Failure|Passed" "$OUT/first_tests.log" | tail -40
  if [ "$RUN_DEFAULT" = 1 ]; then
    timeout 120 bash bench/gpu_round2.sh default
    echo "after default: $((SECONDS - t0)) s"
  fi
  TTA_ROWS="$TTA_ROWS" timeout "$(seconds_until "$TTA_END" 300)" bash bench/gpu_round2.sh tta
  echo "after tta: $((SECONDS - t0)) s"
  if [ "$RUN_GNSILU" = 1 ]; then
    timeout "$(seconds_until "$END" 150)" bash bench/gpu_round2.sh gnsilu
    echo "after gnsilu: $((SECONDS - t0)) s"
  fi
  left=$(seconds_until "$END")
  echo "$left s left for the tests"
  timeout "$left" ctest --test-dir build-gpu -j "$(nproc)" --timeout "$left" --output-on-failure \
    -R "Cuda|CudaGraphs|one_rank|DataParallel|GradScaler|Precision|emulator" >"$OUT/tests.log" 2>&1
  grep -E "tests passed|tests failed|\*\*\*|Not Run" "$OUT/tests.log" | tail -40
  echo "end: $((SECONDS - t0)) s"
} 2>&1 | tee "$OUT/tta_call.txt"
