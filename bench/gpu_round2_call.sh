#!/usr/bin/env bash
# bench/gpu_round2.sh's sections that fit one device-tool call (10 minutes; a start costs one or
# two more of the session's 15): the build (~175 s on the H100 machine), time to 92% (~80 s), the
# generator under NCCL with a time budget (~40 s), then the whole ctest beside the size-64
# generator (neither is timed against a peer), ending near 570 s (docs/benchmarks.md).
#   device tool: bash bench/gpu_round2_call.sh   (carry .gpu-deps, with dcss-items in it)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
t0=$SECONDS
log=$OUT/round.txt
{
  bash bench/gpu_round2.sh build
  echo "after build: $((SECONDS - t0)) s"
  TTA_ROWS="fast 0.92 40" timeout 120 bash bench/gpu_round2.sh tta
  echo "after tta: $((SECONDS - t0)) s"
  DDP_FLAGS="--time-budget 600" timeout 90 bash bench/gpu_round2.sh ddp
  left=$((570 - (SECONDS - t0)))
  echo "after ddp: $((SECONDS - t0)) s; $left s left for ctest beside gen64"
  CTEST_TIMEOUT=$((left - 20)) bash bench/gpu_round2.sh ctest >"$OUT/ctest_section.txt" 2>&1 &
  timeout $((left - 25)) bash bench/gpu_round2.sh gen64
  wait
  cat "$OUT/ctest_section.txt"
  echo "end: $((SECONDS - t0)) s"
} 2>&1 | tee "$log"
