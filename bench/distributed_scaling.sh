#!/usr/bin/env bash
# 1 vs 2 ranks on this machine's CPU: throughput and scaling efficiency of the CNN on a
# Fashion-MNIST subset (docs/distributed.md). Each configuration runs REPEAT times, interleaved
# with the others, so a change in background load hits all of them alike; the best run is kept.
# Besides wall-clock images/s it reports CPU time per image of the training epoch (user + system
# of every process, minus a 0-epoch run of the same command: start-up, data loading, evaluation),
# which stays meaningful when other work shares the cores.
#   bench/distributed_scaling.sh [BUILD_DIR] [TRAIN_LIMIT] [REPEAT]
set -euo pipefail
bin=${1:-build}/spritetorch
limit=${2:-4096}
repeat=${3:-2}
common=(--model cnn --device cpu --train-limit "$limit" --test-limit 500 --log-every 0 --json --no-run-dir)
declare -A best_ips best_cpu
cpu_of() {  # cpu_of ARGS...: prints "user+sys seconds" then the command's stdout
  local t; t=$(mktemp)
  /usr/bin/time -f "%U %S" -o "$t" "$@" >"$t.out" 2>/dev/null
  python3 -c 'import sys; u, s = open(sys.argv[1]).read().split()[-2:]; print(float(u) + float(s))' "$t"
  cat "$t.out"; rm -f "$t" "$t.out"
}
run() {  # run NAME PREFIX... :: TRAIN_ARGS...
  local name=$1; shift
  local prefix=(); while [ "$1" != "::" ]; do prefix+=("$1"); shift; done; shift
  local out cpu1 cpu0 ips per
  out=$(cpu_of "${prefix[@]}" "${common[@]}" --epochs 1 "$@")
  cpu1=$(head -1 <<<"$out")
  ips=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["epochs"][0]["images_per_second"])' "$(tail -1 <<<"$out")")
  cpu0=$(cpu_of "${prefix[@]}" "${common[@]}" --epochs 0 "$@" | head -1)
  per=$(python3 -c "print(1000 * ($cpu1 - $cpu0) / $limit)")
  echo "$name: $ips img/s, $per CPU-s per 1000 images" >&2
  if [ -z "${best_ips[$name]:-}" ] || python3 -c "import sys; sys.exit(0 if $ips > ${best_ips[$name]} else 1)"; then
    best_ips[$name]=$ips
    best_cpu[$name]=$per
  fi
}
names=("1 rank, 1 thread, batch 64" "2 ranks x 1 thread, batch 32 per rank (global 64)"
       "2 ranks x 1 thread, batch 64 per rank (global 128)" "2 ranks x 1 thread, batch 64 per rank, --no-overlap")
for ((i = 0; i < repeat; ++i)); do
  run "${names[0]}" "$bin" train :: --threads 1 --blas-threads 1 --batch-size 64
  run "${names[1]}" "$bin" launch --nproc-per-node 2 -- train :: --threads 1 --blas-threads 1 --batch-size 32
  run "${names[2]}" "$bin" launch --nproc-per-node 2 -- train :: --threads 1 --blas-threads 1 --batch-size 64
  run "${names[3]}" "$bin" launch --nproc-per-node 2 -- train :: --threads 1 --blas-threads 1 --batch-size 64 --no-overlap
done
echo "| configuration | images/s (wall) | vs 1 rank | CPU-s per 1000 images |"
echo "|---|---|---|---|"
for name in "${names[@]}"; do
  python3 -c "import sys; print('| %s | %.0f | %.2fx | %.2f |' % (sys.argv[1], float(sys.argv[2]), float(sys.argv[2]) / float(sys.argv[3]), float(sys.argv[4])))" \
    "$name" "${best_ips[$name]}" "${best_ips[${names[0]}]}" "${best_cpu[$name]}"
done
