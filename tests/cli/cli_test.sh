#!/usr/bin/env bash
# The CLI's contract with scripts: exit 0 on success, 2 with a clear one-line error for bad usage or
# bad input (never a stack trace), help and version on demand.
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0

# expect CODE PATTERN -- ARGS...: exit code CODE and stdout+stderr matching PATTERN (grep -E).
expect() {
  local code=$1 pattern=$2
  shift 3
  local out rc
  out=$("$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: spritetorch $* -> exit $rc (wanted $code), output:"; echo "$out" | head -20
    fails=$((fails + 1))
  elif grep -q "Exception raised from\|frame #" <<<"$out"; then
    echo "FAIL: spritetorch $* printed a stack trace"; fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}

expect 0 "Subcommands:" -- --help
expect 0 "^spritetorch [0-9]+\.[0-9]+\.[0-9]+" -- --version
expect 0 "auto picks: " -- devices
expect 0 '"auto":' -- devices --json
expect 2 "unknown device 'gpu'" -- train --device gpu --dataset dummy --model simplenn
expect 2 "available: cpu" -- train --device cuda:3 --dataset dummy --model simplenn
expect 2 "MPS" -- train --device mps --dataset dummy --model simplenn
expect 2 "--nonsense" -- train --nonsense
expect 2 "not in" -- train --model resnet
expect 2 "train-images-idx3-ubyte" -- train --data "$tmp/nowhere"
expect 2 "needs image inputs" -- train --dataset dummy --model cnn
expect 2 "fp16 is not supported on the CPU" -- train --device cpu --precision fp16 --dataset dummy --model simplenn
expect 2 "needs a CUDA device" -- train --device cpu --cuda-graphs --dataset dummy --model simplenn
expect 2 "fp32 only" -- train --device cpu --precision bf16 --step fused --dataset dummy --model simplenn
expect 0 "bf16 autocast" -- train --device cpu --precision bf16 --dataset dummy --model simplenn --epochs 1

# A file that is not ours, given to eval and to --resume.
echo "hello" > "$tmp/not-a-checkpoint.pt"
expect 2 "expected a spritetorch checkpoint" -- eval --checkpoint "$tmp/not-a-checkpoint.pt"
expect 2 "expected a spritetorch checkpoint" -- train --dataset dummy --model simplenn --resume "$tmp/not-a-checkpoint.pt"

# A real round trip on the dummy data: train, save, evaluate, resume; JSON on stdout.
expect 0 "Test Accuracy: " -- train --dataset dummy --model simplenn --epochs 2 --save "$tmp/s.pt"
expect 0 "Confusion matrix" -- eval --checkpoint "$tmp/s.pt"
expect 0 "resuming after 2" -- train --dataset dummy --resume "$tmp/s.pt" --epochs 3
expect 0 "Wrote .*b.json" -- bench --dataset dummy --model simplenn --devices cpu --workers 0 --repeats 1 --out "$tmp/b"
expect 2 "b.json exists" -- bench --dataset dummy --model simplenn --out "$tmp/b"
json=$("$bin" train --dataset dummy --model simplenn --epochs 1 --json 2>/dev/null)
if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert 0 <= d["accuracy"] <= 1 and d["epochs"][0]["epoch"] == 1' "$json"; then
  passes=$((passes + 1))
else
  echo "FAIL: train --json did not print one JSON object on stdout: $json"; fails=$((fails + 1))
fi

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
