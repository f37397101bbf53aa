#!/usr/bin/env bash
# The GPU-proof measurements of docs/benchmarks.md's "GPU round 2" and docs/sprites.md, on the lent
# GPU machine (device tool: repository root, `.gpu-deps` carried; see scripts/gpu-build --pack).
# Each section is one call's worth of work or less (a call is limited to 10 minutes):
#   build   scripts/gpu-build (all targets) and `devices`; with .gpu-deps/old-src (an earlier
#           commit's source: `git archive REV | tar -x -C .gpu-deps/old-src`) its CLI alongside
#           in .gpu-deps/old-src/build-gpu, for before/after rows in the same call (a later call
#           that carries .gpu-deps again replaces that build: run `sample` in the build's call)
#   ctest   the whole ctest on CUDA (summary and failures; CTEST_TIMEOUT seconds at most)
#   tta     time to accuracy, 3 seeds: 92% (--recipe fast; mid --epochs 4), 93% (mid --epochs 7,
#           wide) and 94% (long), against the same recipe in Python on the same GPU
#           (TTA_ROWS="fast 0.92 40": that row alone; rows are "RECIPE TARGET EVAL_EVERY_STEPS
#           [BENCH FLAGS]", separated by ';', e.g. "fast 0.92 20 --batch-size 512 --lr 0.02
#           --lr-warmup-steps 50": the peer takes the same batch size, lr, warm-up and epochs)
#   default the seed workload with no flag beyond --device cuda, against the Python peer
#   sample  sprite sampling: generate at 32x32, 8,192 sprites in batches of 1,024, 25 DDIM steps,
#           guidance 2 (the generator in .gpu-deps/gen32.pt when carried, else one trained for an
#           epoch on the procedural sprites); the old CLI's rows too when it was built
#   gnsilu  the fused GroupNorm + SiLU kernel against LibTorch's ops (SPRITETORCH_GROUP_NORM_SILU=0)
#           in that sampling run, bf16 and fp32, NCHW and channels_last (--channels-last true:
#           cuDNN's NHWC convolutions, the kernel's NHWC form), once (GNSILU_PASSES=2: twice);
#           and how many sheet pixels differ
#   probe   bench/sampler_probe.py: the same UNet pass in PyTorch, per variant, with kernel tables
#   layout  the generator's training step at --size 64, channels_last against NCHW
#   gen64   the generator on a real sprite set at --size 64 (.gpu-deps/dcss-items when carried)
#   ckpt    activation checkpointing at --size 64: the run's max allocated CUDA memory and step
#           time, with and without --activation-checkpointing, at batch 64 and 256 (procedural
#           sprites, 2 epochs: the memory depends on the shapes, not the art)
#   ddp     the generator under NCCL DDP with one rank against one process (DDP_FLAGS: more
#           train flags for all three runs, e.g. --time-budget 600: its plan and two revisions,
#           each an all-reduce over the ranks, printed from the JSON)
#   profile ncu's per-kernel GPU time of the 32x32 sampler in its steady state (after cuDNN's
#           algorithm search): ~2 of 25 DDIM steps at batch 1,024, guidance 2
# Usage: bench/gpu_round2.sh SECTION... (output on stdout). Scratch files stay on the machine; the
# few worth keeping (logs, sheets, JSON, the profile) are copied to $OUT when set: the device tool
# brings back at most 8 files a call.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=build-gpu/spritetorch
data=.gpu-deps/fashion-mnist
out=$(mktemp -d)
keep() { [ -n "${OUT:-}" ] && cp "$@" "$OUT/" 2>/dev/null; true; }
if [ ! -e /usr/share/datasets/fashion-mnist ] && [ -w /usr/share ]; then
  mkdir -p /usr/share/datasets && ln -s "$(realpath "$data")" /usr/share/datasets/fashion-mnist
fi
# (SPRITETORCH_RUNS_ROOT is left alone: the ctest scripts expect runs/ under their own folder)

# The 32x32 generator the sampling rows run: .gpu-deps/gen32.pt when carried, else one trained for
# an epoch on the procedural sprites (the sampler's speed depends on the net's shape, not its art).
generator32() {
  g32=.gpu-deps/gen32.pt
  if [ ! -f "$g32" ]; then
    g32=$out/g32.pt
    [ -f "$g32" ] || "$bin" train --task generate --dataset sprites --size 32 --device cuda \
      --epochs 1 --no-run-dir --save "$g32" >"$out/g32.log" 2>&1 || tail -3 "$out/g32.log"
  fi
}

# sheet_difference A.png B.png LABEL: how many pixels of two sheets of the same seed are identical.
sheet_difference() {
  python3 - "$@" <<'PY'
import sys, numpy as np
from PIL import Image
a, b = (np.asarray(Image.open(f).convert("RGBA")) for f in sys.argv[1:3])
print(f"{sys.argv[3]}: {100 * (a == b).all(-1).mean():.2f}% of pixels identical, "
      f"mean |diff| {np.abs(a.astype(int) - b.astype(int)).mean():.3f} of 255")
PY
}

json_field() {  # json_field FILE python-expression-on-r
  python3 -c "import json,sys; r=json.loads([l for l in open(sys.argv[1]) if l.startswith('{')][-1]); print($2)" "$1"
}

sections=("$@")
for section in "${sections[@]}"; do
  echo "## $section ($(date -u +%FT%TZ))"
  case $section in
  build)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda)'
    old_pid=
    if [ -d .gpu-deps/old-src ]; then
      GPU_BUILD_TARGETS=spritetorch_cli SPRITETORCH_WERROR=OFF .gpu-deps/old-src/scripts/gpu-build \
        "$(realpath .gpu-deps)" >"$out/build-old.log" 2>&1 &
      old_pid=$!
    fi
    SPRITETORCH_WERROR=${SPRITETORCH_WERROR:-OFF} scripts/gpu-build .gpu-deps >"$out/build.log" 2>&1
    echo "build exit $? after ${SECONDS} s"; grep -E "error|warning: unused" "$out/build.log" | head -20
    if [ -n "$old_pid" ]; then wait "$old_pid"; echo "old build exit $? after ${SECONDS} s"; fi
    "$bin" devices
    keep "$out/build.log"
    ;;
  ctest)
    ctest --test-dir build-gpu -j "$(nproc)" --timeout 300 --stop-time "$(date -d "+${CTEST_TIMEOUT:-400} seconds" +%T)" \
      --output-on-failure >"$out/ctest.log" 2>&1
    echo "ctest exit $?"
    grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|\(Skipped\)|Not Run" "$out/ctest.log" | tail -30
    keep "$out/ctest.log"
    ;;
  tta)
    # 92%: fast (eval every 40 steps), mid over 4 epochs (every 20); 93%: mid over 7 epochs
    # (every 40), wide (every 100); 94%: long (every 100). Each against the same recipe in Python
    # on the same GPU, same seeds (the peer takes the row's --epochs).
    IFS=';' read -ra tta_rows <<<"${TTA_ROWS:-fast 0.92 40;mid 0.92 20 --epochs 4;mid 0.93 40 --epochs 7;wide 0.93 100;long 0.94 100}"
    for run in "${tta_rows[@]}"; do
      set -- $run
      recipe=$1 target=$2 every=$3
      shift 3
      name=tta-$recipe-$target$(printf '%s' "$*" | tr -c 'a-zA-Z0-9.' '_')
      echo "tta row: --recipe $recipe --target-accuracy $target --eval-every-steps $every $*"
      "$bin" bench --data "$data" --devices cuda --recipe "$recipe" --target-accuracy "$target" \
        --seeds 3 --eval-every-steps "$every" --vs-python --out "$out/$name" --overwrite "$@" 2>&1 |
        grep -v "^  "
      keep "$out/$name.json"
    done
    ;;
  gnsilu)
    # bf16 first (the faster form, the rows that matter most if the call is cut short), each
    # layout with the kernel on and off; GNSILU_PASSES=2 alternates the whole set twice.
    generator32
    for pass in $(seq "${GNSILU_PASSES:-1}"); do
      for precision in bf16 fp32; do
        for layout in false true; do
          for fused in 1 0; do
            name=$out/gn-$precision-$layout-$fused.png
            SPRITETORCH_GROUP_NORM_SILU=$fused "$bin" generate --checkpoint "$g32" --count 8192 \
              --batch-size 1024 --steps 25 --seed 3 --guidance 2 --guidance-interval 0:1 --eta 0 \
              --precision $precision --channels-last $layout --device cuda --json --out "$name" \
              --overwrite 2>"$out/gen.err" >"$out/gen.json" && json_field "$out/gen.json" \
              '"%s channels_last=%s fused=%s pass %s: %.3f s, %6.0f sprites/s" % ("'$precision'", "'$layout'", '$fused', '$pass', r["seconds"], r["sprites_per_second"])' ||
              tail -3 "$out/gen.err"
          done
        done
        [ "$pass" = 1 ] || continue
        sheet_difference "$out/gn-$precision-false-1.png" "$out/gn-$precision-false-0.png" \
          "$precision NCHW, fused against LibTorch's ops, 8,192 sprites, seed 3"
        sheet_difference "$out/gn-$precision-true-1.png" "$out/gn-$precision-false-0.png" \
          "$precision channels_last fused against NCHW on LibTorch's ops, 8,192 sprites, seed 3"
      done
    done
    ;;
  default)
    "$bin" bench --data "$data" --devices cuda --no-streaming --epochs 5 --repeats 3 --vs-python \
      --out "$out/default" --overwrite 2>&1 | grep -v "^  "
    keep "$out/default.json"
    ;;
  sample)
    generator32
    old_bin=.gpu-deps/old-src/build-gpu/spritetorch
    # DDIM eta 0 (its loop as a CUDA graph) in fp32 and bf16, without the colour reduction, without
    # the graph; DDIM eta 1 (per-step noise from the host, eager); the default guidance (4 on
    # the middle 60% of the steps). All but the last at guidance 2 on every step.
    rows=("new|--eta 0" "new|--eta 0 --colours 0" "new|--eta 0 --precision bf16" "new|--eta 0 --no-cuda-graphs"
      "new|" "new|--eta 0 --precision bf16 --guidance 4 --guidance-interval 0.3:0.9")
    [ -x "$old_bin" ] && rows+=("old|--eta 0" "old|--eta 0 --colours 0" "old|")
    n=0
    for row in "${rows[@]}"; do
      which=${row%%|*} extra=${row#*|} n=$((n + 1))
      run=$bin; [ "$which" = old ] && run=$old_bin
      guidance=(--guidance 2 --guidance-interval 0:1)
      [[ "$extra" == *guidance* ]] && guidance=()
      "$run" generate --checkpoint "$g32" --count 8192 --batch-size 1024 --steps 25 --seed 3 \
        "${guidance[@]}" --device cuda --json --out "$out/sheet$n.png" $extra \
        2>"$out/gen.err" >"$out/gen.json" && json_field "$out/gen.json" \
        '"%-3s %-62s %5d sprites, %.3f s, %6.0f sprites/s (%s, graph %s)" % ("'"$which"'", "'"${extra:-default}"'", r["count"], r["seconds"], r["sprites_per_second"], r["precision"], r["cuda_graphs"])' ||
        tail -3 "$out/gen.err"
    done
    # bf16 against fp32 on the same seed: how many sprite bytes differ, and a sheet of each.
    for p in fp32 bf16; do
      "$bin" generate --checkpoint "$g32" --count 1024 --steps 25 --eta 0 --seed 5 --device cuda \
        --precision $p --out "$out/sheet_$p.png" >/dev/null 2>&1 || echo "generate $p failed"
      "$bin" generate --checkpoint "$g32" --count 64 --steps 50 --seed 7 --device cuda --precision $p \
        --out "$out/look_$p.png" --scale 2 >/dev/null 2>&1
    done
    sheet_difference "$out/sheet_bf16.png" "$out/sheet_fp32.png" "bf16 against fp32, 1,024 sprites, seed 5"
    keep "$out/look_fp32.png" "$out/look_bf16.png"
    ;;
  probe)
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/sampler_probe.py --profile 2>&1 | grep -v "^-\{10\}" | tee "$out/probe.txt"
    keep "$out/probe.txt"
    ;;
  layout)
    set_dir=.gpu-deps/dcss-items
    [ -d "$set_dir" ] || { echo "no $set_dir carried"; continue; }
    for cl in true false true false; do  # alternating, in case the machine warms up
      "$bin" train --task generate --dataset "folder:$set_dir" --size 64 --device cuda --epochs 20 \
        --channels-last $cl --no-run-dir --json >"$out/layout.json" 2>"$out/layout.err" || tail -3 "$out/layout.err"
      json_field "$out/layout.json" '"channels_last '$cl': train_s %.2f, steps %s, test %s" % (r.get("train_s", 0), r.get("steps"), r.get("test"))'
    done
    ;;
  gen64)
    set_dir=.gpu-deps/dcss-items
    [ -d "$set_dir" ] || { echo "no $set_dir carried"; continue; }
    start=$(date +%s)
    "$bin" train --task generate --dataset "folder:$set_dir" --size 64 --device cuda \
      --no-run-dir --save "$out/gen64.pt" --json ${GEN64_FLAGS:-} >"$out/gen64.json" 2>"$out/gen64.err" ||
      tail -5 "$out/gen64.err"
    echo "gen64 train wall $(( $(date +%s) - start )) s"; tail -3 "$out/gen64.err"
    json_field "$out/gen64.json" '"train_s %.1f, steps %s, test %s" % (r.get("train_s", 0), r.get("steps"), r.get("test"))'
    "$bin" train --task classify --dataset "folder:$set_dir" --size 64 --device cuda --no-run-dir \
      --save "$out/cls64.pt" >"$out/cls64.log" 2>&1 || tail -3 "$out/cls64.log"
    "$bin" eval --checkpoint "$out/gen64.pt" --classifier "$out/cls64.pt" --device cuda 2>&1 | tail -25
    "$bin" generate --checkpoint "$out/gen64.pt" --count 64 --device cuda --out "$out/gen64_sheet.png" --scale 2
    keep "$out/gen64_sheet.png"
    ;;
  ckpt)
    for batch in 64 256; do
      for ac in false true; do
        flag=(); [ "$ac" = true ] && flag=(--activation-checkpointing)
        "$bin" train --task generate --dataset sprites --size 64 --device cuda --epochs 2 \
          --batch-size $batch "${flag[@]}" --no-run-dir --json >"$out/ckpt.json" 2>"$out/ckpt.err" ||
          tail -3 "$out/ckpt.err"
        json_field "$out/ckpt.json" '"batch '$batch', checkpointing '$ac': %.1f MiB (%s), train_s %.2f, steps %s" % (r["peak_memory"]["bytes"] / 2**20, r["peak_memory"]["what"], r.get("train_s", 0), r.get("steps"))'
      done
    done
    ;;
  ddp)
    # One process twice (is the run itself deterministic?), then one NCCL rank.
    for mode in process process rank; do
      if [ $mode = process ]; then cmd=("$bin" train); else
        cmd=("$bin" launch --nproc-per-node 1 -- train --dist-backend nccl --dist-shard global); fi
      "${cmd[@]}" --task generate --dataset sprites --device cuda --epochs 2 --batch-size 64 \
        --no-run-dir --json ${DDP_FLAGS:-} >"$out/ddp_$mode.json" 2>"$out/ddp_$mode.err" || tail -3 "$out/ddp_$mode.err"
      json_field "$out/ddp_$mode.json" '"'$mode': " + json.dumps({k: r.get(k) for k in ("test", "loss", "train_s", "steps", "time_budget")})'
    done
    ;;
  profile)
    # Benchmark mode runs cuDNN's trials in the first step; skipping ~6 steps' kernels (about 500
    # a step) leaves a steady-state window. Without --cache-control/--clock-control none, ncu
    # flushes caches and locks base clocks: slower kernels than a real run.
    ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    [ -n "$ncu_bin" ] || { echo "no ncu"; continue; }
    [ -f "$out/g32.pt" ] || "$bin" train --task generate --dataset sprites --size 32 --device cuda \
      --epochs 1 --no-run-dir --save "$out/g32.pt" >"$out/g32.log" 2>&1
    timeout 300 "$ncu_bin" --cache-control none --clock-control none --launch-skip 3000 \
      --launch-count 1000 --metrics gpu__time_duration.sum --print-summary per-kernel \
      "$bin" generate --checkpoint "$out/g32.pt" --count 1024 --batch-size 1024 --steps 25 \
      --guidance 2 --guidance-interval 0:1 --eta 0 --no-cuda-graphs --device cuda --out "$out/p.png" >"$out/profile.txt" 2>&1
    echo "ncu exit $?"; keep "$out/profile.txt"
    python3 - "$out/profile.txt" <<'PY'
import collections, re, sys
total, count, name = collections.Counter(), collections.Counter(), None
for line in open(sys.argv[1]):
    m = re.match(r"  (\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), .*Invocations (\d+)", line)
    if m: name, calls = m.group(1)[:70], int(m.group(2))
    m = re.match(r"\s+gpu__time_duration.sum\s+(\w+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)", line)
    if m and name:
        scale = {"ms": 1000.0, "us": 1.0, "ns": 0.001}.get(m.group(1), 1.0)
        total[name] += float(m.group(2)) * scale * calls; count[name] += calls; name = None
print("kernel time in the window: %.1f ms over %d kernels" % (sum(total.values()) / 1000, sum(count.values())))
for k, v in total.most_common(15): print("%9.0f us %5d  %s" % (v, count[k], k))
PY
    ;;
  *) echo "unknown section $section" ;;
  esac
done
