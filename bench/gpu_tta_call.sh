#!/usr/bin/env bash
# One device-tool call (10 minutes) after the fused Adam kernel took its views (fused_adam_views):
# the CUDA tests of the optimizer first (FlatOptimizerCuda's buffer of 40,000 elements runs the
# kernel over 36 views, not yet run on a GPU), then the seed workload's default path against the
# Python peer (53.1x on an H200 with the 36 views, measured through a temporary build), time to
# 92% with --recipe fast (1.42 s on an H200 with the kernel over one view) and to 93% with
# --recipe mid (fastcnn-2x: never timed on a GPU; --recipe wide took 4.59 s on an H100), each
# against the peer, then the rest of the CUDA-relevant tests in what is left.
# Order: build (~250 s), tests (~20 s), default (~60 s), the two rows (~80 s and ~120 s).
#   device tool: bash bench/gpu_tta_call.sh   (carry .gpu-deps)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
t0=$SECONDS
{
  bash bench/gpu_round2.sh build
  echo "after build: $((SECONDS - t0)) s"
  timeout 60 ctest --test-dir build-gpu -j 8 --output-on-failure -R "FlatOptimizer|StepOnDevice|AdamKernels" 2>&1 |
    grep -E "tests passed|tests failed|\*\*\*Failed|Failure|Passed" | tail -30
  timeout 120 bash bench/gpu_round2.sh default
  echo "after default: $((SECONDS - t0)) s"
  TTA_ROWS="fast 0.92 40;mid 0.93 100" timeout 240 bash bench/gpu_round2.sh tta
  left=$((560 - (SECONDS - t0)))
  [ "$left" -lt 30 ] && left=30
  echo "after tta: $((SECONDS - t0)) s; $left s left for the tests"
  timeout "$left" ctest --test-dir build-gpu -j "$(nproc)" --timeout "$left" --output-on-failure \
    -R "Cuda|CudaGraphs|one_rank|DataParallel|GradScaler|Precision" 2>&1 |
    grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run" | tail -40
  echo "end: $((SECONDS - t0)) s"
} 2>&1 | tee "$OUT/tta_call.txt"
