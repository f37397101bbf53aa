#!/usr/bin/env bash
# The measurements behind docs/benchmarks.md's CPU tables, in one go on one machine:
#   1. `spritetorch bench` on the seed workload (every data path, median of 3, Python peer after);
#   2. thread settings and step kinds on the seed workload (median of 3 each);
#   3. seeds 0-9 with the default settings (accuracy spread).
# Usage: bench/cpu_suite.sh [BUILD_DIR] > results.txt   (needs scripts/setup --peer for the peer)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/spritetorch
out=$(mktemp -d)

echo "## machine"; grep -m1 "model name" /proc/cpuinfo; nproc; date -u +%F

echo "## 1. spritetorch bench --epochs 5 --repeats 3 --vs-python"
"$bin" bench --epochs 5 --repeats 3 --workers 0,2,4 --vs-python --out "$out/bench" --overwrite

median_train() {  # median train_s and the accuracy of 3 runs of `train --json ARGS`
  for _ in 1 2 3; do "$bin" train --json --no-run-dir "$@" 2>/dev/null; done |
    python3 -c 'import json,sys; r=[json.loads(l) for l in sys.stdin]; t=sorted(x["train_s"] for x in r); last=r[-1]; print("%.2f s  acc %.4f  [%s; %s]" % (t[1], last["accuracy"], last["settings"]["step"], last["settings"]["threads"]))'
}
echo "## 2. thread settings x step (seed workload, 5 epochs, median of 3)"
for step in autograd fused; do
  for t in "1 1" "1 2" "2 2" "2 1"; do
    set -- $t
    echo "step $step, --threads $1 --blas-threads $2 --step-threads 1: $(median_train --step $step --threads "$1" --blas-threads "$2" --step-threads 1)"
  done
done
echo "fused, 2 step threads x 1 BLAS: $(median_train --step fused --step-threads 2 --blas-threads 1)"
echo "defaults: $(median_train)"

echo "## 3. accuracy over seeds (defaults)"
for s in 0 1 2 3 4 5 6 7 8 9; do
  "$bin" train --json --no-run-dir --seed $s 2>/dev/null | python3 -c "import json,sys; print($s, json.load(sys.stdin)['accuracy'])"
done
