#!/usr/bin/env bash
# How to split the CPU's cores between LibTorch's intra-op pool and OpenBLAS for conv nets
# (docs/benchmarks.md "Threads for conv nets"): the CNN classifier on 12,000 Fashion-MNIST images
# and the generator's UNet on the built-in sprites, 2 epochs each, with the default split and the
# two others; train seconds, median of 3. The MLP's side of the question is cpu_suite.sh's section 2.
# Usage: bench/conv_threads.sh [BUILD_DIR] > results.txt
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build}/spritetorch")
cores=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$out"

median_train_s() {  # median train_s of 3 runs of `train --json ARGS`, and the threads row
  for _ in 1 2 3; do "$bin" train --json --no-run-dir --device cpu "$@" 2>/dev/null; done |
    python3 -c 'import json,sys; r=[json.loads(l) for l in sys.stdin]; t=sorted(x["train_s"] for x in r); print("%.2f s  [%s]" % (t[1], r[-1]["settings"]["threads"]))'
}

echo "## machine"; grep -m1 "model name" /proc/cpuinfo; echo "$cores cores"; date -u +%F
for workload in "--model cnn --epochs 2 --train-limit 12000" \
                "--task generate --dataset sprites --epochs 2 --batch-size 64 --unet-base 16"; do
  echo "## $workload"
  for split in "" "--threads 1 --blas-threads $cores" "--threads $cores --blas-threads $cores"; do
    # shellcheck disable=SC2086  # the words are separate arguments
    echo "${split:-default}: $(median_train_s $workload $split)"
  done
done
