#!/usr/bin/env bash
# The measurements behind docs/benchmarks.md's GPU section (issue 9), in one go on the lent GPU
# machine, after `scripts/gpu-build` (the device tool's time is short: one call runs all of it).
#   0. the machine: GPU, driver, torch and CUDA versions, date
#   1. the CUDA build's whole test suite (ctest), with its summary line
#   2. `spritetorch bench` on DEVICE and cpu, every data path, median of 3, Python peer after
#   3. the seed workload on DEVICE by precision, eager vs CUDA graphs, and streamed with pinned memory
#   4. the CNN's time to 90% and 92% test accuracy on DEVICE (per-epoch evaluation, not timed)
# Usage: bench/gpu_suite.sh [BUILD_DIR] [DEVICE] [DATA] > results.txt
#   defaults: build-gpu, cuda, .gpu-deps/fashion-mnist. Sections that cannot run say why and the
#   rest go on. To try the script itself on a CPU: SUITE_QUICK=1 (1 epoch, 1 repeat) and
#   SUITE_SKIP_TESTS=1, DEVICE cpu.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
device=${2:-cuda}
data=${3:-.gpu-deps/fashion-mnist}
bin=$build/spritetorch
out=$(mktemp -d)
epochs=5 repeats=3 cnn_epochs=15
if [ "${SUITE_QUICK:-0}" = 1 ]; then epochs=1 repeats=1 cnn_epochs=2; fi

echo "## 0. machine"
date -u +%F
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null ||
  echo "python3 has no torch"
"$bin" devices

echo "## 1. test suite"
if [ "${SUITE_SKIP_TESTS:-0}" = 1 ]; then
  echo "skipped (SUITE_SKIP_TESTS=1)"
else
  ctest --test-dir "$build" -j "$(nproc)" --output-on-failure > "$out/ctest.log" 2>&1
  echo "ctest exit $?"
  grep -E "tests passed|tests failed|Failed|\(Skipped\)" "$out/ctest.log" | tail -20
fi

echo "## 2. spritetorch bench --devices $device cpu --epochs $epochs --repeats $repeats --vs-python"
"$bin" bench --data "$data" --devices "$device" cpu --epochs "$epochs" --repeats "$repeats" \
  --workers 0 2 4 --vs-python --out "$out/bench" --overwrite 2>&1 | grep -v "^  "

run_train() {  # median train_s, accuracy and ms/step of REPEATS runs of `train --json ARGS`
  for _ in $(seq "$repeats"); do
    "$bin" train --json --no-run-dir --eval-every 0 --data "$data" --device "$device" \
      --epochs "$epochs" "$@" 2>"$out/train.err" || { tail -2 "$out/train.err" >&2; return 0; }
  done | python3 -c '
import json, sys
runs = [json.loads(line) for line in sys.stdin if line.strip()]
if not runs: print("did not run"); sys.exit()
times = sorted(r["train_s"] for r in runs)
print("%.2f s  acc %.4f  [%s; %s]" % (times[len(times) // 2], runs[-1]["accuracy"],
      runs[-1]["settings"].get("precision", "?"), runs[-1]["settings"].get("data path", "?")))'
}
echo "## 3. seed workload on $device: precision x eager/graphs, and streaming (median of $repeats)"
for precision in fp32 bf16 fp16; do
  echo "$precision eager:  $(run_train --precision "$precision")"
  echo "$precision graphs: $(run_train --precision "$precision" --cuda-graphs)"
done
echo "fp32 streaming, 2 workers, pinned: $(run_train --data-on host --workers 2 --pin-memory 1)"
echo "fp32 streaming, 2 workers, pageable: $(run_train --data-on host --workers 2 --pin-memory 0)"

echo "## 4. CNN time to accuracy on $device ($cnn_epochs epochs, test set after each)"
"$bin" train --json --no-run-dir --model cnn --data "$data" --device "$device" --epochs "$cnn_epochs" \
  --eval-every 1 2>"$out/cnn.err" | python3 -c '
import json, sys
r = json.load(sys.stdin)
elapsed, reached = 0.0, {}
for e in r["epochs"]:
    elapsed += e["seconds"]
    print("epoch %d: %.2f s (train time so far %.2f s), test accuracy %.4f" % (e["epoch"], e["seconds"], elapsed, e.get("test_accuracy", float("nan"))))
    for goal in (0.90, 0.92):
        if goal not in reached and e.get("test_accuracy", 0) >= goal:
            reached[goal] = (elapsed, e["epoch"])
for goal in (0.90, 0.92):
    print("time to %.0f%%: %s" % (goal * 100, "%.2f s (epoch %d)" % reached[goal] if goal in reached else "not reached"))
' || tail -3 "$out/cnn.err"
echo "## done (logs in $out)"
