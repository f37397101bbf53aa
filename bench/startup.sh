#!/usr/bin/env bash
# Whole-process wall and CPU time of what every run pays before and after its epochs:
#   bench/startup.sh BUILD [RUNS]     (default 5 runs each; prints the medians)
# Rows: LibTorch's load alone (`--version`), then a minimal `train --json --no-run-dir` on
# Fashion-MNIST (one step of 64 images, a test set of 64: everything but the epochs) without the
# dataset cache (SPRITETORCH_CACHE=0) and with a warm one, and the same with a run folder and its
# pictures. The cache lives in a scratch XDG_CACHE_HOME, never the user's.
set -eu
build=${1:?usage: bench/startup.sh BUILD [RUNS]}
runs=${2:-5}
bin=$build/spritetorch
xdg=$(mktemp -d)
trap 'rm -rf "$xdg"' EXIT

# median of the numbers on stdin
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# time_it LABEL CMD...: RUNS runs; medians of wall, user+sys seconds
time_it() {
  local label=$1; shift
  local walls=() cpus=()
  for _ in $(seq "$runs"); do
    local out
    /usr/bin/time -o "$xdg/time" -f "%e %U %S" "$@" >/dev/null 2>&1
    out=$(tail -1 "$xdg/time")
    walls+=("$(awk '{print $1}' <<<"$out")")
    cpus+=("$(awk '{print $2 + $3}' <<<"$out")")
  done
  printf '%-44s wall %6.2f s   cpu %6.2f s   (median of %d)\n' "$label" \
    "$(printf '%s\n' "${walls[@]}" | median)" "$(printf '%s\n' "${cpus[@]}" | median)" "$runs"
}

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
time_it "spritetorch --version" "$bin" --version
small=(train --json --epochs 1 --train-limit 64 --test-limit 64)
time_it "minimal train --no-run-dir, no cache" env SPRITETORCH_CACHE=0 "$bin" "${small[@]}" --no-run-dir
XDG_CACHE_HOME=$xdg "$bin" "${small[@]}" --no-run-dir >/dev/null 2>&1  # fills the cache
time_it "minimal train --no-run-dir, warm cache" env XDG_CACHE_HOME="$xdg" "$bin" "${small[@]}" --no-run-dir
time_it "minimal train, run folder + pictures, warm" env XDG_CACHE_HOME="$xdg" SPRITETORCH_RUNS_ROOT="$xdg/runs" "$bin" "${small[@]}"
