#!/usr/bin/env bash
# Training beside other busy processes: the thread governor (train/thread_governor.h) on, against
# it off and against one thread, alone and beside 1 and 2 busy processes (`yes`). The generator's
# default (--thread-governor auto) is off, the seed MLP's (fused step) on.
#   bench/beside_busy.sh BUILD SPRITE_FOLDER [RUNS]   (default 2 runs of each cell)
# SPRITE_FOLDER: a folder:PATH set for the generator rows (docs/sprites.md: the four-view set);
# the MLP rows need Fashion-MNIST. Prints train_s, the accuracy (MLP) and the number of thread
# changes per run.
set -eu
build=${1:?usage: bench/beside_busy.sh BUILD SPRITE_FOLDER [RUNS]}
sprites=${2:?usage: bench/beside_busy.sh BUILD SPRITE_FOLDER [RUNS]}
runs=${3:-2}
bin=$build/spritetorch
pids=()
trap '[ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null' EXIT

summary() {
  python3 -c "import json,sys
d = json.loads(sys.stdin.read().strip().splitlines()[-1])
print(round(d['train_s'], 2), d.get('accuracy', ''), len(d.get('thread_changes', [])), end='')"
}
generator() {
  "$bin" train --task generate --dataset "folder:$sprites" --size 32 --seed 7 --epochs 1 \
    --train-limit 800 --no-run-dir --json "$@" 2>/dev/null | summary
}
mlp() { "$bin" train --no-run-dir --json --eval-every 0 "$@" 2>/dev/null | summary; }

for busy in 0 1 2; do
  pids=()
  for _ in $(seq 1 "$busy"); do
    yes >/dev/null &
    pids+=($!)
  done
  sleep 0.3
  for _ in $(seq 1 "$runs"); do
    echo "beside $busy | generator: on $(generator --thread-governor on) | off $(generator --thread-governor off) | 1 thread $(generator --threads 1)"
    echo "beside $busy | seed MLP:  on $(mlp --thread-governor on) | off $(mlp --thread-governor off) | 1 thread $(mlp --step-threads 1)"
  done
  [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}"
done
