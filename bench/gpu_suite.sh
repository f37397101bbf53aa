#!/usr/bin/env bash
# The measurements behind docs/benchmarks.md's GPU section (issue 9), in one go on the lent GPU
# machine, after `scripts/gpu-build` (the device tool's time is short: one call runs all of it).
#   0. the machine: GPU, driver, torch and CUDA versions, date
#   1. the CUDA build's whole test suite (ctest), with its summary line
#   2. `spritetorch bench` on DEVICE and cpu: every data path, each precision eager and as a CUDA
#      graph, median of 3, the Python peer after (JSON and CSV copied to $OUT when set)
#   3. the CNN's time to 90% and 92% test accuracy on DEVICE (per-epoch evaluation, not timed)
#   4. issue 6's NCCL proof: the CNN as 1 process and as 1 NCCL rank (`launch --nproc-per-node 1`),
#      test loss and img/s of each (the process group's overhead); 2 ranks when there are 2 GPUs
#   5. the fused CPU step's threads on this machine's cores (--step-threads 2, 4, 8, all)
#   6. the CNN against the same CNN in Python (bench --vs-python --model cnn) on DEVICE
#   7. sprite sampling: sprites/s of `generate` at batch 1,024 on DEVICE
# Usage: bench/gpu_suite.sh [BUILD_DIR] [DEVICE] [DATA] > results.txt
#   On the device tool, two calls keep each under its 10 minutes: `scripts/gpu-build && ctest
#   --test-dir build-gpu -j 16` (or this script), then `SUITE_SKIP_TESTS=1 bench/gpu_suite.sh`.
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
# The tests that need the real dataset look at Debian's path; on the GPU machine (root, no such
# package) the carried copy is linked there so that they run instead of skipping.
if [ ! -e /usr/share/datasets/fashion-mnist ] && [ -w /usr/share ]; then
  mkdir -p /usr/share/datasets && ln -s "$(realpath "$data")" /usr/share/datasets/fashion-mnist &&
    echo "linked $data at /usr/share/datasets/fashion-mnist for the tests"
fi
if [ "${SUITE_SKIP_TESTS:-0}" = 1 ]; then
  echo "skipped (SUITE_SKIP_TESTS=1)"
else
  ctest --test-dir "$build" -j "$(nproc)" --output-on-failure > "$out/ctest.log" 2>&1
  echo "ctest exit $?"
  grep -E "tests passed|tests failed|Failed|\(Skipped\)" "$out/ctest.log" | tail -20
fi

echo "## 2. spritetorch bench --devices $device cpu --precisions fp32,bf16,fp16 --cuda-graphs --vs-python"
# Resident rows per precision, eager and graphed; streaming rows (0/2/4 workers, pinned and
# pageable on CUDA); rows a device cannot run say why. The Python peer runs after, per device.
"$bin" bench --data "$data" --devices "$device" cpu --epochs "$epochs" --repeats "$repeats" \
  --precisions fp32,bf16,fp16 --cuda-graphs --workers 0,2,4 --vs-python --out "$out/bench" \
  --overwrite 2>&1 | grep -v "^  "
cp "$out/bench.json" "$out/bench.csv" "${OUT:-$out}/" 2>/dev/null || true

echo "## 3. CNN time to accuracy on $device ($cnn_epochs epochs, test set after each)"
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
echo "## 4. NCCL: the CNN as 1 process and as NCCL ranks on $device (--dist-shard global, 2 epochs)"
# World size 1 is still a real process group: same test loss as one process (the ctest
# distributed.one_rank_nccl asserts it); the img/s ratio is the process group's
# overhead: here one all-reduce per bucket per step. Two ranks run only where two GPUs are.
dist_run() {
  ${runner:-"$bin"} "$@" --json --no-run-dir --model cnn --data "$data" --device "$device" --epochs 2 \
    --eval-every 0 2>"$out/dist.err" | python3 -c '
import json, sys
lines = [l[l.index("{"):] for l in sys.stdin if "{" in l]  # torchrun may prefix "[default0]:"
if not lines: sys.exit("no JSON summary on stdout")
r = json.loads(lines[-1])
e = r["epochs"][-1]
print("%-28s test loss %.6f, accuracy %.4f, last epoch %.0f img/s (%s)" % (sys.argv[1], r["test"]["loss"], r["test"]["accuracy"], e["images_per_second"], r["settings"]["strategy"]))
' "$label" || tail -3 "$out/dist.err"
}
label="1 process" dist_run train --batch-size 64
label="1 nccl rank" dist_run launch --nproc-per-node 1 -- train --batch-size 64 --dist-backend nccl --dist-shard global
label="1 nccl rank, --no-overlap" dist_run launch --nproc-per-node 1 -- train --batch-size 64 --dist-backend nccl --dist-shard global --no-overlap
# The same rank under PyTorch's own torchrun (its agent hosts the store; the rank joins as a client).
label="1 nccl rank under torchrun" runner="python3 -m torch.distributed.run --nproc_per_node 1 --no_python $bin" \
  dist_run train --batch-size 64 --dist-backend nccl --dist-shard global
gpus=$("$bin" devices | grep -cE "^cuda:[0-9]+ ")
if [ "$gpus" -ge 2 ]; then
  label="2 nccl ranks x 32" dist_run launch --nproc-per-node 2 -- train --batch-size 32 --dist-backend nccl --dist-shard global
else
  echo "2 ranks: not run ($gpus GPU here; NCCL needs one GPU per rank)"
fi

echo "## 5. the fused CPU step's threads (cores: $(nproc); default: one per core)"
for t in 2 4 8 0; do
  echo "--step-threads $t:"
  "$bin" bench --data "$data" --devices cpu --no-streaming --epochs "$epochs" --repeats "$repeats" \
    --step-threads "$t" --out "$out/threads$t" --overwrite 2>&1 | grep -E "^cpu |floor"
done
echo "## 6. the CNN against the same CNN in Python on $device (12,000 images, 2 epochs)"
# bench/python_peer.py --model cnn: the seed's loop with our CNN's layers (on the 2-core CPU
# spritetorch was 2.3x faster, both sides running the same oneDNN convolutions).
"$bin" bench --data "$data" --model cnn --train-limit 12000 --epochs 2 --repeats "$repeats" \
  --devices "$device" --no-streaming --vs-python --out "$out/cnn-peer" --overwrite 2>&1 | grep -v "^  "
echo "## 7. sprite sampling on $device (docs/sprites.md: >= 10,000 sprites/s at batch 1,024)"
# A generator trained for 2 epochs (what it draws does not change the arithmetic), then 25 DDIM
# steps with the default guidance; the larger count shows the rate once cuDNN is warm.
"$bin" train --task generate --dataset sprites --device "$device" --epochs 2 --batch-size 64 \
  --no-run-dir --save "$out/g.pt" >"$out/g.log" 2>&1 || tail -3 "$out/g.log"
for count in 1024 8192; do
  "$bin" generate --checkpoint "$out/g.pt" --count "$count" --batch-size 1024 --steps 25 \
    --device "$device" --json --out "$out/sheet$count.png" 2>"$out/gen.err" | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("%d sprites at batch 1024: %.2f s, %.0f sprites/s" % (r["count"], r["seconds"], r["sprites_per_second"]))
' || tail -3 "$out/gen.err"
done
echo "## done (logs in $out)"
