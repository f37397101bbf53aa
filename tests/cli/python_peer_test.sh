#!/usr/bin/env bash
# `bench --vs-python` against the Python peer (bench/python_peer.py) on a slice of the data: the
# seed's loop with our CNN, and time to accuracy with a recipe whose batch size, lr and warm-up the
# peer must take over. Needs a python3 with torch and torchvision (scripts/setup --peer); skips
# (77) without one. What bench refuses before any peer runs is in cli_test.sh.
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPRITETORCH_RUNS_ROOT="$tmp/runs"
source "$(dirname "$0")/expect.sh"

python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c "import torch, torchvision" 2>/dev/null; then python=$candidate; break; fi
done
if [ -z "$python" ]; then
  echo "skipped: no python3 with torch and torchvision (scripts/setup --peer)"
  exit 77
fi

# The seed's loop with the CNN: the peer's time, accuracy and the ratio, faster or slower.
expect 0 "Python peer on cpu \(PyTorch [^)]+\): train [0-9.]+ s, accuracy [0-9.]+; spritetorch resident [0-9.]+ s: [0-9.]+x (faster|slower)" -- \
  bench --vs-python --model cnn --train-limit 256 --epochs 1 --repeats 1 --warmup-steps 1 --devices cpu --no-streaming --out "$tmp/peer"
check=$("$python" -c 'import json,sys; p=json.load(open(sys.argv[1]))["python_peer"][0]; print(p["model"], p["ratio"] > 0)' "$tmp/peer.json" 2>&1)
if [ "$check" = "cnn True" ]; then passes=$((passes + 1)); else
  echo "FAIL: bench --vs-python --model cnn: peer.json says '$check'"; fails=$((fails + 1)); fi

# Time to accuracy: the peer runs the recipe with our --batch-size, --lr and --lr-warmup-steps.
expect 0 "Python peer \(same recipe, same seeds\)" -- bench --recipe fast --target-accuracy 0.5 --seeds 1 --epochs 1 \
  --train-limit 1024 --batch-size 128 --lr 0.005 --lr-warmup-steps 3 --vs-python --devices cpu --out "$tmp/tta_peer"
check=$("$python" -c 'import json,sys; p=json.load(open(sys.argv[1]))["python_peer"][0]; print(p["batch_size"], p["lr"], p["warmup_steps"], p["recipe"])' "$tmp/tta_peer.json" 2>&1)
if [ "$check" = "128 0.005 3 fast" ]; then passes=$((passes + 1)); else
  echo "FAIL: bench --recipe fast --vs-python: the peer ran '$check', not 128 0.005 3 fast"; fails=$((fails + 1)); fi

# --recipe long: the peer runs it (wide's model) for the epochs ours passes on, not its own default.
# --test-limit is passed on too: the wide model's evaluation of all 10,000 images took ~90 s of the
# peer's 94 s here.
# The headline says which accuracy its figures are.
expect 0 "^spritetorch bench --target-accuracy 0.50: fastcnn-wide, recipe long, 1 epoch\(s\), 1 seed\(s\), accuracy on the first 500 test images$" -- \
  bench --recipe long --target-accuracy 0.5 --seeds 1 --epochs 1 --train-limit 512 --test-limit 500 --vs-python --devices cpu --out "$tmp/long_peer"
check=$("$python" -c 'import json,sys; j=json.load(open(sys.argv[1])); p=j["python_peer"][0]; print(p["recipe"], p["model"], len(p["evals"]), p["test_images"], j["test_limit"])' "$tmp/long_peer.json" 2>&1)
if [ "$check" = "long fastcnn-wide 1 500 500" ]; then passes=$((passes + 1)); else
  echo "FAIL: bench --recipe long --test-limit 500 --vs-python: the peer ran '$check', not long fastcnn-wide 1 500 500 (one epoch, 500 test images)"; fails=$((fails + 1)); fi

echo "python peer: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
