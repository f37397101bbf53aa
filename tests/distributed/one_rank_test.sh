#!/usr/bin/env bash
# A ddp run is a real process group even with one rank (issue 6): `launch --nproc-per-node 1`
# with BACKEND on DEVICE must train exactly what a single process trains, through the whole c10d
# path (TCPStore rendezvous, parameter broadcast, bucketed all-reduce, metric sums).
#   - 1 rank = 1 process: test loss equal (1e-6 on the CPU, 1e-4 on CUDA) for the fused and the
#     autograd step, and for the CNN (five small buckets, overlapped with backward) with and
#     without --no-overlap;
#   - the settings row names the backend;
#   - with BACKEND nccl and at least 2 GPUs, also 2 ranks x batch 32 = 1 process x batch 64.
# Usage: one_rank_test.sh SPRITETORCH BACKEND DEVICE   (gloo cpu | nccl cuda)
# Skips (77) when the build lacks BACKEND or DEVICE is not there: the nccl/cuda instance runs on a
# GPU machine only.
set -u
bin=$1 backend=$2 device=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { passes=$((passes + 1)); }
json_get() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval("d"+sys.argv[2]))' "$1" "$2"; }
close() { python3 -c "import sys; sys.exit(0 if abs($1-($2)) <= $3 else 1)"; }

devices=$("$bin" devices) || { echo "spritetorch devices failed"; exit 1; }
if ! grep -E "distributed \(c10d\) backends:.*\b$backend\b" <<<"$devices" >/dev/null; then
  echo "skipped: this build has no $backend backend ($(grep -o 'distributed (c10d) backends:[^;]*' <<<"$devices"))"
  exit 77
fi
gpus=$(grep -cE "^cuda:[0-9]+ " <<<"$devices")
if [ "$device" = cuda ] && [ "$gpus" -eq 0 ]; then
  echo "skipped: no CUDA device here"
  exit 77
fi

# One rank and one process, same flags; --dist-shard global keeps the single process's data order.
# Options of the process group alone (which a single process refuses) go after "--ddp".
# Prints both JSON summaries' test loss, or fails with the run's stderr.
compare() {
  local label=$1
  shift
  local args=() ddp_only=() single ddp rc
  while [ $# -gt 0 ] && [ "$1" != --ddp ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift && ddp_only=("$@")
  single=$("$bin" train "${args[@]}" --json 2>"$tmp/single.err")
  rc=$?
  [ $rc -eq 0 ] || { fail "$label: single process exited $rc: $(tail -3 "$tmp/single.err")"; return; }
  ddp=$("$bin" launch --nproc-per-node 1 -- train "${args[@]}" "${ddp_only[@]}" --dist-backend "$backend" --dist-shard global --json 2>"$tmp/ddp.err")
  rc=$?
  [ $rc -eq 0 ] || { fail "$label: launch 1 rank exited $rc: $(tail -3 "$tmp/ddp.err")"; return; }
  local strategy a b
  strategy=$(json_get "$ddp" '["settings"]["strategy"]')
  grep -q "ddp, rank 0 of 1, $backend" <<<"$strategy" && pass || fail "$label: strategy row '$strategy'"
  a=$(json_get "$single" '["test"]["loss"]')
  b=$(json_get "$ddp" '["test"]["loss"]')
  if close "$a" "$b" "$tolerance"; then pass; else fail "$label: 1 rank test loss $b != 1 process $a (tolerance $tolerance)"; fi
  echo "$label: 1 process test loss $a, 1 $backend rank $b ($strategy)"
}

common=(--device "$device" --seed 5 --no-run-dir --threads 1 --blas-threads 1)
# The CPU is deterministic: one rank is bit-equal to one process. On CUDA two processes may differ
# in the last bits (cuBLAS/cuDNN reductions, atomics in convolution backward), so 1e-4 there, and
# cuDNN's timing-based algorithm choice is switched off so both pick the same kernels.
tolerance=1e-6
if [ "$device" = cuda ]; then
  tolerance=1e-4
  common+=(--cudnn-benchmark false)
fi
mlp_data=("${common[@]}" --dataset dummy --model simplenn --epochs 2)
mlp=("${mlp_data[@]}" --batch-size 64)
compare "simplenn, default step" "${mlp[@]}"
compare "simplenn, autograd step" "${mlp[@]}" --step autograd
cnn=("${common[@]}" --dataset sprites --sprite-count 512 --model cnn --epochs 1 --batch-size 32 --step autograd)
compare "cnn, overlapped buckets" "${cnn[@]}" --ddp --bucket-mb 0.02
compare "cnn, --no-overlap" "${cnn[@]}" --ddp --bucket-mb 0.02 --no-overlap

# Two GPUs: 2 ranks x 32 = 1 process x 64 (sums of two halves: not bitwise either).
if [ "$backend" = nccl ] && [ "$gpus" -ge 2 ]; then
  single=$("$bin" train "${mlp[@]}" --json 2>/dev/null)
  two=$("$bin" launch --nproc-per-node 2 -- train "${mlp_data[@]}" --batch-size 32 --dist-backend nccl --dist-shard global --json 2>"$tmp/two.err")
  if [ $? -eq 0 ] && close "$(json_get "$single" '["test"]["loss"]')" "$(json_get "$two" '["test"]["loss"]')" "$tolerance"; then pass; else
    fail "2 nccl ranks x 32 vs 1 process x 64: $(tail -3 "$tmp/two.err")"; fi
fi

echo "one rank ($backend on $device): $passes passed, $fails failed"
[ "$fails" -eq 0 ]
