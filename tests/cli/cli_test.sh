#!/usr/bin/env bash
# The CLI's contract with scripts: exit 0 on success, 2 with a clear one-line error for bad usage or
# bad input (never a stack trace), help and version on demand.
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Every training run below keeps its run folder here (docs/runs.md), not in the working directory.
export SPRITETORCH_RUNS_ROOT="$tmp/runs"
source "$(dirname "$0")/expect.sh"
check() {  # check DESCRIPTION COMMAND...: a shell condition that must hold
  local what=$1; shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

expect 0 "Subcommands:" -- --help
expect 0 "^spritetorch [0-9]+\.[0-9]+\.[0-9]+" -- --version
expect 0 "auto picks: " -- devices
# ... and what --precision auto resolves to there, with its reason.
expect 0 "auto picks: .*; --precision auto there: (bf16 autocast, fp32 weights|fp32) \(auto: " -- devices
expect 0 '"auto":' -- devices --json
# The fused CPU step's matrix kernel: `devices` names it; SPRITETORCH_GEMM_KERNEL picks another one
# this CPU runs, or is a usage error.
expect 0 "matrix kernels \(CPU\): (avx512|avx2|blas|loops) \(this CPU runs: .*loops\)" -- devices
SPRITETORCH_GEMM_KERNEL=loops expect 0 "matrix kernels \(CPU\): loops " -- devices
SPRITETORCH_GEMM_KERNEL=loops expect 0 '"cpu_gemm_kernel": "loops"' -- devices --json
SPRITETORCH_GEMM_KERNEL=loops expect 0 '"cpu_adam_kernel": "loops"' -- devices --json
SPRITETORCH_GEMM_KERNEL=loops expect 0 "its Adam update: loops" -- devices
SPRITETORCH_GEMM_KERNEL=sse9 expect 2 "SPRITETORCH_GEMM_KERNEL=sse9: expected avx512, avx2, blas or loops" -- devices
SPRITETORCH_CACHE=maybe expect 2 "SPRITETORCH_CACHE=maybe: expected 0" -- train --data "$tmp/nowhere"
check "SPRITETORCH_CACHE=maybe is refused with the other machine variables, before the run makes its folder" \
  bash -c '! SPRITETORCH_CACHE=maybe "$1" train --data "$2/nowhere" --run-dir "$2/bad-cache-run" 2>&1 | grep -q "Run folder"' _ "$bin" "$tmp"
expect 0 "BatchNorm \+ ReLU \+ max-pool in training \(CPU\): fused, ((avx512|avx2) \(NCHW and channels_last\)|loops \(NCHW; channels_last takes LibTorch's ops\))" -- devices
SPRITETORCH_GEMM_KERNEL=avx2 expect 0 "max-pool in training \(CPU\): fused, (avx2 \(NCHW and channels_last\)|loops \(NCHW; channels_last takes)" -- devices
SPRITETORCH_GEMM_KERNEL=loops expect 0 "max-pool in training \(CPU\): fused, loops \(NCHW; channels_last takes LibTorch's ops\)" -- devices
SPRITETORCH_FUSED_BN_POOL=0 expect 0 '"cpu_bn_relu_pool": "off"' -- devices --json
SPRITETORCH_FUSED_BN_POOL=0 expect 0 '"cpu_bn_relu_pool_channels_last": false' -- devices --json
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  SPRITETORCH_GEMM_KERNEL=avx2 expect 0 "the UNet's ResBlocks \(CPU, fp32\): avx2 kernels" -- devices
fi
SPRITETORCH_GEMM_KERNEL=loops expect 0 "the UNet's ResBlocks \(CPU, fp32\): LibTorch's \(oneDNN\)$" -- devices
SPRITETORCH_CONV3X3=0 expect 0 "the UNet's ResBlocks \(CPU, fp32\): LibTorch's \(oneDNN\) \(SPRITETORCH_CONV3X3=0\)" -- devices
SPRITETORCH_CONV3X3=0 expect 0 '"cpu_conv3x3": "off"' -- devices --json
# The UNet's fused GroupNorm + SiLU (SPRITETORCH_GROUP_NORM_SILU, read like the switches above).
expect 0 "the UNet's GroupNorm \+ SiLU: fused on the CPU \(fp32\)" -- devices
SPRITETORCH_GROUP_NORM_SILU=0 expect 0 "GroupNorm \+ SiLU: LibTorch's ops \(SPRITETORCH_GROUP_NORM_SILU=0\)" -- devices
SPRITETORCH_GROUP_NORM_SILU=0 expect 0 '"group_norm_silu": "off"' -- devices --json
SPRITETORCH_GROUP_NORM_SILU=yes expect 2 "SPRITETORCH_GROUP_NORM_SILU=yes: expected 0 \(LibTorch's ops\) or 1" -- devices
SPRITETORCH_CONV3X3=on expect 2 "SPRITETORCH_CONV3X3=on: expected 0 \(LibTorch's 3x3 convolutions\) or 1" -- train --dataset dummy --model fastcnn
SPRITETORCH_FUSED_BN_POOL=yes expect 2 "SPRITETORCH_FUSED_BN_POOL=yes: expected 0" -- train --dataset dummy --model fastcnn
# An OMP_NUM_THREADS OpenMP cannot read drew a LibTorch stack trace (its own default, read at the
# first parallel op); libgomp's one line about it stays (it prints it as it loads).
omp_out=$(OMP_NUM_THREADS=0 "$bin" train --dataset dummy --model simplenn --epochs 1 --no-run-dir 2>&1); omp_rc=$?
check "OMP_NUM_THREADS=0: exit 0 and no stack trace (got $omp_rc: $(head -c 600 <<<"$omp_out"))" \
  bash -c '[ "$1" = 0 ] && ! grep -qE "frame #|Exception raised" <<<"$2"' _ "$omp_rc" "$omp_out"
# Integers are decimal: CLI11 read "010" as octal 8, and config.toml kept "010", which TOML refuses.
expect 0 "^epochs = 10$" -- train --dataset dummy --model simplenn --epochs 010 --batch-size 010 --no-run-dir --print-config
expect 0 "Epoch 9/9" -- train --dataset dummy --model simplenn --epochs 09 --no-run-dir
# --target-accuracy says in the text where it stopped the run (inside an epoch here), as --json does.
expect 0 "Target accuracy 0\.5 reached at step [0-9]+ \(epoch 0\.[0-9]+\) after [0-9.]+ s of training: test accuracy 0\.[5-9]" -- train --dataset dummy --model simplenn --epochs 3 --no-run-dir --target-accuracy 0.5 --eval-every-steps 4
expect 0 "Target accuracy 0\.9999 not reached" -- train --dataset dummy --model simplenn --epochs 1 --no-run-dir --target-accuracy 0.9999
# The matrix kernel's switch too, before any work: a run made its folder first, and eval and
# classify, which never multiply with it, took any value.
SPRITETORCH_GEMM_KERNEL=yes expect 2 "SPRITETORCH_GEMM_KERNEL=yes: expected avx512, avx2, blas or loops" -- train --dataset dummy --model simplenn --epochs 1 --runs-root "$tmp/gemm-runs"
check "a bad SPRITETORCH_GEMM_KERNEL leaves no run folder" bash -c '[ -z "$(ls -A "$1" 2>/dev/null)" ]' _ "$tmp/gemm-runs"
SPRITETORCH_GEMM_KERNEL=yes expect 2 "SPRITETORCH_GEMM_KERNEL=yes: expected" -- runs --dir "$tmp/gemm-runs"
expect 2 "unknown device 'gpu'" -- train --device gpu --dataset dummy --model simplenn
expect 2 "available: cpu" -- train --device cuda:3 --dataset dummy --model simplenn
expect 2 "MPS" -- train --device mps --dataset dummy --model simplenn
expect 2 "--nonsense" -- train --nonsense
expect 2 "--model: 'resnet': expected one of ann, cnn, .*simplenn, or script:FILE \(a TorchScript module\)" -- train --model resnet
expect 2 "--model: nope.pt: expected a TorchScript file, found no such file" -- train --model script:nope.pt
expect 2 "expected a TorchScript module \(torch.jit.script\(model\).save\(FILE\), or torch.jit.trace\), found an archive LibTorch's TorchScript reader refuses" -- train --model "script:$0" --dataset dummy
expect 2 "nowhere: expected a folder holding Fashion-MNIST's train IDX files \(--data\), found no such folder" -- train --data "$tmp/nowhere"
expect 2 "needs image inputs" -- train --dataset dummy --model cnn
expect 2 "fp16 is not supported on the CPU" -- train --device cpu --precision fp16 --dataset dummy --model simplenn
expect 2 "needs a CUDA device" -- train --device cpu --cuda-graphs --dataset dummy --model simplenn
# --step fused under bf16: layer 1 in bf16 where the CPU has AVX512_BF16 (devices' cpu_gemm_bf16).
if "$bin" devices --json | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["cpu_gemm_bf16"] else 1)'; then
  expect 0 "fused-mlp \(.*avx512_bf16 kernel\)" -- train --device cpu --precision bf16 --step fused --dataset dummy --model simplenn --epochs 1 --no-run-dir
else
  expect 2 "fp32, or in bf16 on a CPU with AVX512_BF16" -- train --device cpu --precision bf16 --step fused --dataset dummy --model simplenn
fi
expect 0 "bf16 autocast|bf16 in layer 1's products" -- train --device cpu --precision bf16 --dataset dummy --model simplenn --epochs 1
# --time-budget: a budget no step fits in ends the run after the epoch in progress when the plan is
# made (after 70 steps: the first of 128, of at most 20) and when it is revised (halfway through
# the 58 steps left, and through the 29 left then), said in the settings, the plan lines and the
# JSON; a text that is no duration is refused.
expect 0 "Time budget 0:00.0: used up, so the run ends with epoch 1: 1 epoch, 128 steps at .* s a step \(of at most 20\)" -- train --device cpu --dataset dummy --model simplenn --batch-size 32 --epochs 20 --time-budget 0.0000001
expect 0 "Time budget 0:00.0, revised at step 113: used up, so the run ends with epoch 1: 1 epoch, 128 steps at .* s a step \(of at most 20\)" -- train --device cpu --dataset dummy --model simplenn --batch-size 32 --epochs 20 --time-budget 0.0000001
expect 0 '"time_budget":\{"budget_s":1e-07,"epochs":1,"max_epochs":20,"revisions":2,"seconds_per_step":[^,]*,"spent":true,' -- train --device cpu --dataset dummy --model simplenn --batch-size 32 --epochs 20 --time-budget 0.0000001 --json --quiet
# Used up before its steps are timed (10 an epoch: the plan would come in epoch 8), the run ends
# with the epoch in progress; used up in the last epoch, the plan line says so rather than "all of
# --epochs fit".
expect 0 "Time budget 0:00.0: used up, so the run ends with epoch 1: 1 epoch, 10 steps at .* s a step \(of at most 20\)" -- train --device cpu --dataset dummy --model simplenn --train-limit 640 --epochs 20 --time-budget 0.0000001 --no-run-dir
expect 0 "Time budget 0:00.0: used up, so the run ends with epoch 1: 1 epoch, 128 steps at .* s a step$" -- train --device cpu --dataset dummy --model simplenn --batch-size 32 --epochs 1 --time-budget 0.0000001 --no-run-dir
expect 2 "--time-budget: '15 min' is not a duration: expected one such as 900, 900s, 15m" -- train --dataset dummy --model simplenn --time-budget "15 min"
# --vs-python compares the seed's loop only (ann or cnn on Fashion-MNIST): any other workload is
# refused before anything runs.
expect 2 "this bench differs: --model simplenn --dataset dummy" -- bench --vs-python --model simplenn --dataset dummy --out "$tmp/peer"
expect 2 "this bench differs: --batch-size 32" -- bench --vs-python --batch-size 32 --out "$tmp/peer"
# Time to accuracy against the peer: the recipe's batch size, lr and warm-up are passed on to it;
# a change to anything else in the recipe is refused before anything runs.
expect 2 "runs the fast recipe in Python with only --batch-size, --lr, --lr-warmup-steps, --epochs, --precision, --train-limit, --test-limit and the seeds changed; this bench also changes: --label-smoothing 0 --augment none" -- \
  bench --recipe fast --target-accuracy 0.9 --vs-python --label-smoothing 0 --augment none --devices cpu --out "$tmp/tta_peer"
expect 2 "this bench also changes: --model fastcnn-2x" -- bench --recipe fast --model fastcnn-2x --target-accuracy 0.9 --vs-python --devices cpu --out "$tmp/tta_peer"
expect 2 "this bench also changes: --first-conv learned" -- bench --recipe fast --first-conv learned --target-accuracy 0.9 --vs-python --devices cpu --out "$tmp/tta_peer"
# The peer runs themselves: tests/cli/python_peer_test.sh.
# --first-conv whitened needs a convolution: refused before training, with what to do.
expect 2 "model ann has no Conv2d" -- train --model ann --first-conv whitened --epochs 1 --train-limit 64 --test-limit 64 --no-run-dir
expect 2 "--first-conv: random not in \\{learned,whitened\\}" -- train --first-conv random --no-run-dir
# The fused CPU step's threads: asked for (old name too), and never on top of explicit BLAS threads.
# They need the raw-buffer CPU step, i.e. a LibTorch whose BLAS exports CBLAS (Debian's OpenBLAS;
# a pip torch's bundled MKL does not, and `devices` says so).
if "$bin" devices | grep -q "^BLAS: OpenBLAS"; then
  expect 0 "fused-mlp \(3 threads, [a-z0-9]+ kernel\)" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --step-threads 3
  expect 0 "fused-mlp \(3 threads, [a-z0-9]+ kernel\)" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --step-shards 3
  cores=$(nproc)
  expect 0 "1 intra-op, $cores BLAS" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --blas-threads "$cores"
  # --precision auto for a model with the fused CPU step: its bf16 form where auto takes the CPU's
  # native bf16 and the step's bf16 kernels run, else fp32.
  if "$bin" devices --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["cpu_gemm_bf16"] and any(x.get("bf16_auto") for x in d["devices"] if x["device"].startswith("cpu")) else 1)'; then
    expect 0 "precision +bf16 in layer 1's products \(fused step\), fp32 weights and later layers \(auto: " -- train --device cpu --precision auto --dataset dummy --model simplenn --epochs 1 --no-run-dir
  else
    expect 0 "precision +fp32 \(auto: " -- train --device cpu --precision auto --dataset dummy --model simplenn --epochs 1 --no-run-dir
  fi
  expect 0 "step +fused-mlp \([a-z0-9]+ kernel\) *$" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --blas-threads "$cores"
  # The thread governor (train/thread_governor.h): on for the fused step when no count is given,
  # off with --thread-governor off; beside as many busy processes as cores it moves the step to
  # fewer threads and says so (human line, --json).
  if [ "$cores" -ge 2 ]; then
    expect 0 "thread governor +the step's $cores threads: fewer while other processes take the cores, same results \(--thread-governor off keeps them\)" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --no-run-dir
    kept=$("$bin" train --device cpu --dataset dummy --model simplenn --epochs 1 --no-run-dir --thread-governor off 2>&1)
    if grep -q "thread governor" <<<"$kept"; then echo "FAIL: --thread-governor off still governs"; fails=$((fails + 1)); else passes=$((passes + 1)); fi
    expect 2 "thread-governor" -- train --device cpu --dataset dummy --model simplenn --thread-governor sometimes
    expect 2 "thread-governor on cannot lower thread counts that were given" -- train --device cpu --dataset dummy --model simplenn --thread-governor on --threads 1 --no-run-dir
    expect 2 "thread-governor on cannot lower thread counts that were given" -- bench --devices cpu --dataset dummy --model simplenn --thread-governor on --step-threads 1 --out "$tmp/governed"
    if [ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
      busy=()
      for _ in $(seq "$cores"); do yes >/dev/null & busy+=($!); done
      governed=$("$bin" train --device cpu --epochs 3 --eval-every 0 --test-limit 500 --no-run-dir --json 2>&1)
      kill "${busy[@]}"
      if grep -qE "^Threads: $cores -> [0-9]+ at step [0-9]+ \(other processes: [0-9.]+ CPUs busy\)" <<<"$governed" &&
        grep -qE "\"thread_changes\":\[\{\"from\":$cores,\"others_cpus\":[0-9.e+-]+,\"step\":[0-9]+,\"threads\":[0-9]+\}" <<<"$governed"; then
        passes=$((passes + 1))
      else
        echo "FAIL: beside $cores busy processes the governor said no change:"; echo "$governed" | grep -v '^ ' | tail -8; fails=$((fails + 1))
      fi
    fi
  fi
else
  echo "skipped: the CPU step's thread checks (this LibTorch's BLAS is not OpenBLAS)"
fi

# Optimizers, weight decay and lr schedules: the settings row says what runs; bad schedules are
# usage errors before any work (a schedule runs under CUDA graphs too: the lr is read on the device).
expect 0 "optimizer +adamw lr 0.001, weight decay 0.01, cosine, warm-up 10 steps" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --optimizer adamw --lr-schedule cosine --warmup-steps 10 --no-run-dir
expect 0 "optimizer +sgd lr 0.1, momentum 0.9, weight decay 0.0001, step every 1 epoch x0.5" -- train --device cpu --dataset dummy --model simplenn --epochs 2 --optimizer sgd --lr 0.1 --momentum 0.9 --weight-decay 1e-4 --lr-schedule step:1:0.5 --no-run-dir
expect 2 "cannot read --lr-schedule 'step:0'" -- train --dataset dummy --model simplenn --lr-schedule step:0
expect 2 "cannot read --lr-schedule 'warm'" -- train --dataset dummy --model simplenn --lr-schedule warm
expect 2 "--weight-decay: '-1' is not a number >= 0" -- train --dataset dummy --model simplenn --weight-decay -1
expect 2 "--momentum is SGD's; --optimizer adamw keeps its own running averages" -- train --dataset dummy --model simplenn --optimizer adamw --momentum 0.9
# Number ranges refuse NaN (CLI11's own Range lets it through: every comparison with NaN is false).
expect 2 "--label-smoothing: 'nan' is not a number \(expected a number from 0 to 1\)" -- train --dataset dummy --model simplenn --label-smoothing nan
expect 2 "--lr: 'inf' is not a number \(expected a number > 0\)" -- train --dataset dummy --model simplenn --lr inf
expect 2 "--lr: '0x10' is not a number \(expected a number > 0\)" -- train --dataset dummy --model simplenn --lr 0x10
expect 2 "--time-budget: '5m5m' is not a duration" -- train --dataset dummy --model simplenn --time-budget 5m5m
# An integer past 64 bits is refused, not stored as INT64_MAX (a run without end).
expect 2 "--epochs: '99999999999999999999' is too large \(more than 64 bits\)" -- train --dataset dummy --model simplenn --epochs 99999999999999999999
# A value of the wrong kind names the option and what it takes, not CLI11's "Could not convert".
expect 2 "^error: --epochs '1\.5': expected a whole number$" -- train --dataset dummy --model simplenn --epochs 1.5
expect 2 "^error: --count '2\.5': expected a whole number$" -- generate --checkpoint nothing.pt --count 2.5
expect 2 "^error: --workers '1\.5': expected a whole number for each value$" -- bench --workers 1.5
expect 2 "^error: --batch-size '1e18': expected a whole number written in digits \(1000000, not 1e6\)$" -- train --dataset dummy --model simplenn --batch-size 1e18
expect 2 "^error: --workers '1e2': expected a whole number written in digits \(1000000, not 1e6\) for each value$" -- bench --workers 1e2
out=$(SPRITETORCH_WORKERS=1.5 "$bin" train --dataset dummy --model simplenn --print-config 2>&1); rc=$?
if [ "$rc" = 2 ] && grep -q "SPRITETORCH_WORKERS=1.5 (it sets --workers): expected a whole number$" <<<"$out"; then
  passes=$((passes + 1))
else
  echo "FAIL: SPRITETORCH_WORKERS=1.5 -> exit $rc: $out"; fails=$((fails + 1))
fi
# Memory the sizes asked for and the machine lacks: exit 2, the size in words, and the options given
# that asked for it (not LibTorch's allocator text, not options the run did not use).
out=$(ulimit -v 2500000; "$bin" train --no-run-dir --model cnn --epochs 1 --batch-size 60000 --threads 2 2>&1); rc=$?
if [ "$rc" = 2 ] && grep -qE "^error: out of memory: an allocation of [0-9.]+ GiB failed$" <<<"$out" &&
  grep -q "^hint: the sizes asked for need more memory than there is: lower --batch-size 60000$" <<<"$out"; then
  passes=$((passes + 1))
else
  echo "FAIL: train --batch-size 60000 in 2.5 GB -> exit $rc: $out"; fails=$((fails + 1))
fi
expect 2 "--limit: '-99999999999999999999' is too large" -- eval --checkpoint "$tmp/none.pt" --limit -99999999999999999999
expect 2 "--target-accuracy: '1.5' is not a number from 0 to 1" -- train --dataset dummy --model simplenn --target-accuracy 1.5
expect 2 "--holdout: 'nan' is not a number \(expected a number from 0 to 0.95\)" -- train --dataset sprites --holdout nan
expect 2 "needs a CUDA device" -- train --device cpu --dataset dummy --model simplenn --lr-schedule cosine --cuda-graphs
expect 2 "excludes" -- train --device cpu --dataset dummy --model simplenn --cuda-graphs --no-cuda-graphs

# A file that is not ours, given to eval and to --resume.
echo "hello" > "$tmp/not-a-checkpoint.pt"
expect 2 "expected a spritetorch checkpoint" -- eval --checkpoint "$tmp/not-a-checkpoint.pt"
expect 2 "expected a spritetorch checkpoint" -- train --dataset dummy --model simplenn --resume "$tmp/not-a-checkpoint.pt"
# A folder is named as one, not reported as a stream error (exit 1).
expect 2 "$tmp: expected a checkpoint file, found a folder" -- eval --checkpoint "$tmp"
expect 2 "$tmp: expected a checkpoint file, found a folder" -- classify --checkpoint "$tmp" "$tmp/bad.png"
expect 2 "$tmp: expected a checkpoint file, found a folder" -- generate --checkpoint "$tmp" --out "$tmp/x.png"

# A real round trip on the dummy data: train, save, evaluate, resume; JSON on stdout.
expect 0 "Test Accuracy: " -- train --dataset dummy --model simplenn --epochs 2 --save "$tmp/s.pt"
expect 0 "Confusion matrix" -- eval --checkpoint "$tmp/s.pt"
# eval, classify and generate take train's thread flags and say the split they ran with (an MLP by
# default: 1 intra-op thread; BLAS '?' where the BLAS is not OpenBLAS).
expect 0 "CPU threads: 1 intra-op, ([0-9]+|\?) BLAS" -- eval --checkpoint "$tmp/s.pt"
expect 0 "CPU threads: 2 intra-op, (1|\?) BLAS" -- eval --checkpoint "$tmp/s.pt" --threads 2 --blas-threads 1
expect 0 '"threads":"2 intra-op' -- eval --checkpoint "$tmp/s.pt" --threads 2 --json
threads_from_env=$(SPRITETORCH_THREADS=2 "$bin" eval --checkpoint "$tmp/s.pt" 2>&1)
if grep -q "CPU threads: 2 intra-op" <<<"$threads_from_env"; then passes=$((passes + 1)); else
  echo "FAIL: eval ignores SPRITETORCH_THREADS=2: $threads_from_env"; fails=$((fails + 1)); fi
expect 2 "--threads: .-1. is not a thread count from 0 to" -- eval --checkpoint "$tmp/s.pt" --threads -1
# The defaults share out the cores this process may use: OMP_NUM_THREADS caps them, and so does
# the CPU affinity (taskset, cpusets); a conv net's default is one intra-op thread per core.
conv_run=(train --device cpu --dataset sprites --sprite-count 32 --epochs 1 --batch-size 16 --no-run-dir --json)
if [ "$(nproc)" -ge 2 ]; then
  for limit in "env OMP_NUM_THREADS=1" "taskset -c 0"; do
    if ! command -v "${limit%% *}" >/dev/null; then continue; fi
    limited=$($limit "$bin" "${conv_run[@]}" 2>&1)
    if grep -q '"threads":"1 intra-op' <<<"$limited"; then passes=$((passes + 1)); else
      echo "FAIL: $limit: the default is not 1 intra-op thread: $(grep -o '"threads":"[^"]*"' <<<"$limited")"
      fails=$((fails + 1)); fi
  done
  expect 0 "\"threads\":\"$(nproc) intra-op" -- "${conv_run[@]}"
fi
expect 0 "resuming after 2" -- train --dataset dummy --resume "$tmp/s.pt" --epochs 3
# The learning-rate curve goes on from the checkpoint: another schedule is refused, a new --lr said.
expect 0 "Saved checkpoint" -- train --dataset dummy --model simplenn --epochs 1 --no-run-dir --lr-schedule cosine --save "$tmp/cos.pt"
expect 2 "was trained with --lr-schedule cosine --warmup-steps 0 but this run asks for --lr-schedule constant --warmup-steps 0" -- train --dataset dummy --model simplenn --epochs 2 --no-run-dir --resume "$tmp/cos.pt"
expect 0 "note: --resume $tmp/cos\.pt was trained with --lr 0\.001; this run goes on with 0\.0005" -- train --dataset dummy --model simplenn --epochs 2 --no-run-dir --resume "$tmp/cos.pt" --lr-schedule cosine --lr 0.0005
# Schedules are compared as parsed: step:1 is step:1:0.1.
expect 0 "Saved checkpoint" -- train --dataset dummy --model simplenn --epochs 1 --no-run-dir --lr-schedule step:1 --save "$tmp/step.pt"
expect 0 "resuming after 1" -- train --dataset dummy --model simplenn --epochs 2 --no-run-dir --resume "$tmp/step.pt" --lr-schedule step:1:0.1
expect 0 "Wrote .*b.json" -- bench --dataset dummy --model simplenn --devices cpu --workers 0 --repeats 1 --out "$tmp/b"
expect 2 "refusing to overwrite .*b.json" -- bench --dataset dummy --model simplenn --out "$tmp/b"
# Reliability (docs/reliability.md): hostile files and the overwrite rule, exit 2 with a clear error.
expect 2 "refusing to overwrite .*s.pt" -- train --dataset dummy --model simplenn --epochs 1 --save "$tmp/s.pt"
expect 0 "Saved checkpoint" -- train --dataset dummy --model simplenn --epochs 1 --save "$tmp/s.pt" --overwrite
python3 - "$tmp" <<'PY'
import gzip, struct, sys
t = sys.argv[1]
ck = bytearray(open(f"{t}/s.pt", "rb").read())
bad = bytearray(ck); bad[28] ^= 1; open(f"{t}/badcrc.pt", "wb").write(bad)
huge = bytearray(ck); huge[20:28] = b"\xff" * 8; open(f"{t}/hugelen.pt", "wb").write(huge)
import os
for d in ("liar", "cutgz"): os.makedirs(f"{t}/{d}", exist_ok=True)
hdr = bytes([0, 0, 8, 3]) + struct.pack(">III", 1000000000, 28, 28)
open(f"{t}/liar/train-images-idx3-ubyte", "wb").write(hdr + bytes(100))
gz = gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">III", 100, 28, 28) + bytes(range(256)) * 307)
open(f"{t}/cutgz/train-images-idx3-ubyte.gz", "wb").write(gz[: len(gz) // 2])
for d in ("liar", "cutgz"):  # valid labels, so that the images file is the one that fails
    open(f"{t}/{d}/train-labels-idx1-ubyte", "wb").write(bytes([0, 0, 8, 1, 0, 0, 0, 100]) + bytes(100))
PY
expect 2 "badcrc.pt: expected a payload matching its CRC-32" -- eval --checkpoint "$tmp/badcrc.pt"
expect 2 "hugelen.pt: expected 18446744073709551615 payload bytes" -- train --dataset dummy --resume "$tmp/hugelen.pt"
# export writes OUT, then --reference: one file for both, or for the checkpoint, is refused.
expect 2 "--reference $tmp/./same.safetensors and OUT $tmp/same.safetensors are the same file" -- export --checkpoint "$tmp/s.pt" "$tmp/same.safetensors" --reference "$tmp/./same.safetensors"
check_absent() { if [ -e "$1" ]; then echo "FAIL: $1 was written"; fails=$((fails + 1)); else passes=$((passes + 1)); fi; }
check_absent "$tmp/same.safetensors"
expect 2 "OUT $tmp/s.pt is the --checkpoint itself" -- export --checkpoint "$tmp/s.pt" "$tmp/s.pt" --format torch --overwrite
expect 2 "--reference $tmp/s.pt is the --checkpoint itself" -- export --checkpoint "$tmp/s.pt" "$tmp/s.safetensors" --reference "$tmp/s.pt" --overwrite
expect 0 "Confusion matrix" -- eval --checkpoint "$tmp/s.pt"
expect 2 "train-images-idx3-ubyte: expected at most" -- train --data "$tmp/liar"
expect 2 "train-images-idx3-ubyte.gz: expected" -- train --data "$tmp/cutgz"

json=$("$bin" train --dataset dummy --model simplenn --epochs 1 --json 2>/dev/null)
if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert 0 <= d["accuracy"] <= 1 and d["epochs"][0]["epoch"] == 1' "$json"; then
  passes=$((passes + 1))
else
  echo "FAIL: train --json did not print one JSON object on stdout: $json"; fails=$((fails + 1))
fi

# Sprites: datasets, classifier, generator, previews (tiny sizes: seconds, not minutes).
expect 2 "expected fashion-mnist, dummy, sprites" -- train --dataset pokemon
expect 2 "no such folder" -- train --dataset "folder:$tmp/nowhere"
printf '\x93NUMPY\x01\x00\x10\x00{garbage}       ' > "$tmp/bad.npy"
expect 2 "bad.npy: expected a header with 'descr'" -- train --dataset "npy:$tmp/bad.npy"
echo "not a png" > "$tmp/bad.png"
expect 2 "bad.png: expected a PNG file" -- train --dataset "sheet:$tmp/bad.png"
expect 2 "WxH" -- train --dataset sprites --tile 16by16
expect 0 "Test Accuracy: " -- train --task classify --dataset sprites --sprite-count 200 --epochs 1 --save "$tmp/c.pt"
mkdir -p "$tmp/sheetdir"
expect 0 "rows:" -- data preview --dataset sprites --sprite-count 80 --per-class 4 --out "$tmp/preview.png"
expect 0 "sprite \(" -- data preview --dataset "sheet:$(dirname "$0")/../fixtures/kenney_1bit_colored_packed.png" --out "$tmp/kenney.png"
cp "$tmp/kenney.png" "$tmp/kenney_in.png"
# 2^63 - 1 is a spacing (one tile per row and column); 2^63 is too large; a margin past the
# sheet fits no tile (both were LibTorch errors, exit 1).
expect 0 "sprite \(1 samples\)" -- data preview --dataset "sheet:$(dirname "$0")/../fixtures/kenney_1bit_colored_packed.png" --spacing 9223372036854775807 --out "$tmp/spaced.png"
expect 2 "--spacing: '9223372036854775808' is too large \(more than 64 bits\)" -- data preview --dataset "sheet:$(dirname "$0")/../fixtures/kenney_1bit_colored_packed.png" --spacing 9223372036854775808 --out "$tmp/spaced2.png"
expect 2 "kenney_1bit_colored_packed\.png: expected at least one 16x16 tile with margin 5000000000000000000" -- data preview --dataset "sheet:$(dirname "$0")/../fixtures/kenney_1bit_colored_packed.png" --margin 5000000000000000000 --out "$tmp/margin.png"
expect 2 "^error: --out $tmp/kenney_in.png is a file the --dataset reads: writing it would replace an input" -- data preview --dataset "sheet:$tmp/kenney_in.png" --out "$tmp/kenney_in.png" --overwrite
# Sprites of another size: area means down by default, nearest neighbour on request, nothing else.
expect 0 "rows:" -- data preview --dataset sprites --sprite-count 80 --per-class 4 --size 32 --resize nearest --out "$tmp/preview32.png"
expect 2 "--resize: bicubic not in \{area,nearest\}" -- data preview --dataset sprites --sprite-count 80 --resize bicubic --out "$tmp/x.png"
# Sizes past the documented limits are refused before anything is allocated; so is an empty split.
expect 2 "--sprite-count: Value 100000000000 not in range 1 to 1000000" -- data preview --dataset sprites --sprite-count 100000000000 --out "$tmp/x.png"
expect 2 "--per-class: Value 100000 not in range 1 to 4096" -- data preview --dataset sprites --sprite-count 80 --per-class 100000 --out "$tmp/x.png"
expect 2 "a sheet of [0-9]+x[0-9]+ pixels: sheets are at most 65536 pixels a side and 67108864 pixels in all" -- data preview --dataset sprites --sprite-count 80 --per-class 4096 --scale 64 --out "$tmp/x.png"
expect 2 "--split test of .* holds no samples \(--holdout 0 holds none out\)" -- data preview --dataset sprites --sprite-count 80 --split test --holdout 0 --out "$tmp/x.png"
check_absent "$tmp/x.png"
# So are a process group's options in one process; streaming's options on resident data are named
# in the settings (SPRITETORCH_WORKERS may set them for a machine).
expect 2 "--bucket-mb applies to ddp runs .*this run is a single process" -- train --dataset dummy --epochs 1 --no-run-dir --bucket-mb 10
expect 0 "resident on cpu \(--workers unused: streaming's, which --data-on host chooses\)" -- train --dataset dummy --epochs 1 --no-run-dir --workers 4
# --runs-root that places nothing is said (a note: a config file kept in a run folder names it
# always); from SPRITETORCH_RUNS_ROOT, set for this whole script, it is a setting and says nothing.
expect 0 "note: --runs-root places run folders .*--no-run-dir keeps none" -- train --dataset dummy --epochs 1 --no-run-dir --runs-root "$tmp/elsewhere"
expect 0 "note: --runs-root places fresh run folders; --run-dir names" -- train --dataset dummy --epochs 1 --run-dir "$tmp/exact-run" --runs-root "$tmp/elsewhere"
if "$bin" train --dataset dummy --epochs 1 --no-run-dir 2>&1 | grep -q "runs-root"; then
  echo "FAIL: a runs root from SPRITETORCH_RUNS_ROOT drew a note"; fails=$((fails + 1))
else
  passes=$((passes + 1))
fi
# A config.toml that cannot be written (files of at most 4 KiB: `ulimit -f`, with SIGXFSZ ignored
# so that the write fails with EFBIG) stops the run before any work, names the file and the reason,
# and leaves no run folder behind (one cut short was listed by `runs` and read back by --config).
full_out=$( (trap '' XFSZ; ulimit -f 4; exec "$bin" train --dataset dummy --epochs 1 --runs-root "$tmp/full-runs") 2>&1)
full_rc=$?
check "a config.toml that cannot be written: exit 2 naming it and the reason (got $full_rc: $full_out)" \
  bash -c '[ "$1" = 2 ] && grep -qE "error: cannot write .*/config\.toml: File too large" <<<"$2"' _ "$full_rc" "$full_out"
check "a config.toml that cannot be written leaves no run folder" \
  bash -c '[ -z "$(ls -A "$1" 2>/dev/null)" ]' _ "$tmp/full-runs"
# A file of the run lost during training (metrics.jsonl past a 14 KiB file-size limit) is a warning
# that --quiet prints too; the run goes on and finishes.
lost_out=$( (trap '' XFSZ; ulimit -f 14; exec "$bin" train --dataset dummy --model simplenn --epochs 60 -q --runs-root "$tmp/lost-runs") 2>&1)
lost_rc=$?
check "a metrics.jsonl cut by a file-size limit under -q: exit 0 and a warning naming it (got $lost_rc: $lost_out)" \
  bash -c '[ "$1" = 0 ] && grep -qE "^warning: cannot write .*/metrics\.jsonl: File too large; the lines from step [0-9]+ on are lost" <<<"$2"' _ "$lost_rc" "$lost_out"
# A sprite option the dataset does not read is refused, not ignored.
expect 2 "--size applies to sprite datasets .*not --dataset dummy" -- train --dataset dummy --size 32 --epochs 1 --no-run-dir
expect 2 "--tile applies to sprite sheets .*not --dataset sprites" -- data preview --dataset sprites --sprite-count 80 --tile 8x8 --out "$tmp/x.png"
expect 0 "$tmp/preview.png	[a-z]+	[01]\.[0-9]+" -- classify --checkpoint "$tmp/c.pt" "$tmp/preview.png"
expect 2 "is a generator checkpoint|expected a spritetorch checkpoint" -- classify --checkpoint "$tmp/not-a-checkpoint.pt" "$tmp/preview.png"
# Hand-edited metadata of the wrong type or range: the file and the field, exit 2.
python3 - "$tmp" <<'PY'
import json, struct, sys, zlib
t = sys.argv[1]
b = open(f"{t}/c.pt", "rb").read()
p = b[32:]; n, = struct.unpack("<I", p[:4]); meta = json.loads(p[4:4 + n]); rest = p[4 + n:]
def write(name, **changes):
    m = json.dumps(dict(meta, **changes)).encode(); q = struct.pack("<I", len(m)) + m + rest
    open(f"{t}/{name}", "wb").write(b[:20] + struct.pack("<QI", len(q), zlib.crc32(q)) + q)
write("c_names.pt", class_names=5)
write("c_sprites.pt", sprites={"size": "big"})
write("c_size.pt", sprites=dict(meta["sprites"], size=48))
write("c_task.pt", task=3)
PY
expect 2 "c_names.pt: expected metadata 'class_names' as a list of strings, found a JSON number" -- classify --checkpoint "$tmp/c_names.pt" "$tmp/preview.png"
expect 2 "c_sprites.pt: expected metadata 'sprites.size' as an integer, found a JSON string" -- eval --checkpoint "$tmp/c_sprites.pt"
expect 2 "c_size.pt: expected metadata 'sprites.size' 16, 32 or 64, found 48" -- eval --checkpoint "$tmp/c_size.pt"
expect 2 "c_task.pt: expected metadata 'task' as a string, found a JSON number" -- eval --checkpoint "$tmp/c_task.pt"
expect 2 "c_task.pt: expected metadata 'task' as a string, found a JSON number" -- generate --checkpoint "$tmp/c_task.pt" --out "$tmp/x.png"
# --data reads Fashion-MNIST only: for other data it is refused, not ignored (its variable may stay set).
expect 2 "--data is the Fashion-MNIST folder; $tmp/c.pt was trained on sprites" -- eval --checkpoint "$tmp/c.pt" --data "$tmp/nowhere"
SPRITETORCH_DATA="$tmp/nowhere" expect 0 "Confusion matrix" -- eval --checkpoint "$tmp/c.pt"
# import: the data options an export recorded are the weights' own; one given otherwise is refused.
expect 0 "Wrote $tmp/c.safetensors" -- export --checkpoint "$tmp/c.pt" "$tmp/c.safetensors"
expect 2 "--size 32: the metadata of $tmp/c.safetensors records --size 16 for sprites" -- import "$tmp/c.safetensors" "$tmp/c_back.pt" --size 32
expect 2 "--sprite-count 10: the metadata of $tmp/c.safetensors records --sprite-count 200 for sprites" -- import "$tmp/c.safetensors" "$tmp/c_back.pt" --sprite-count 10
expect 2 "--data is the Fashion-MNIST folder; these weights are for sprites" -- import "$tmp/c.safetensors" "$tmp/c_back.pt" --data "$tmp"
expect 0 "Wrote $tmp/c_back.pt: model cnn for sprites" -- import "$tmp/c.safetensors" "$tmp/c_back.pt" --size 16
expect 0 "Saved checkpoint" -- train --task generate --dataset sprites --sprite-count 64 --epochs 1 --batch-size 16 --save "$tmp/g.pt"
# Resumed without --batch-size, a generator keeps its run's batch, not the device's default.
expect 0 '"batch":"16 \(drop last\)"' -- train --task generate --dataset sprites --sprite-count 64 --epochs 2 --resume "$tmp/g.pt" --device cpu --json --no-run-dir
# A generator follows the optimizer flags too.
expect 0 '"optimizer":"adamw lr 0.002, weight decay 0.01, cosine, warm-up 100 steps \(flat buffers\)' -- train --task generate --dataset sprites --sprite-count 32 --epochs 1 --batch-size 16 --device cpu --json --no-run-dir --optimizer adamw --lr 0.002 --lr-schedule cosine
# The generator's defaults fill what is not given (UNet base 32, auto precision, lr 0.002, cosine
# after a warm-up), and each flag overrides its own.
expect 0 '"model":"unet base 32 .*"optimizer":"adam lr 0.002, cosine, warm-up 100 steps \(flat buffers\)","precision":"(bf16 autocast, fp32 weights \(auto: native|fp32 \(auto: (no native|this CPU.s native bf16 trains slower))' -- train --task generate --dataset sprites --sprite-count 32 --epochs 1 --batch-size 16 --device cpu --json --no-run-dir
expect 0 '"model":"unet base 16 .*"optimizer":"adam lr 0.001 \(flat buffers\)","precision":"fp32"' -- train --task generate --dataset sprites --sprite-count 32 --epochs 1 --batch-size 16 --device cpu --json --no-run-dir --unet-base 16 --lr-schedule constant --warmup-steps 0 --precision fp32 --lr 0.001
# A generator's --json carries its settings like a classifier's, threads split for a conv net.
expect 0 '"settings":\{"alpha":"binary \(0% of the training set.s visible pixels are partly transparent; soft from 2%\)"[^}]*"threads":"[0-9]+ intra-op, ([0-9]+|\?) BLAS"[^}]*\}.*"train_s":' -- train --task generate --dataset sprites --sprite-count 32 --epochs 1 --batch-size 16 --device cpu --json --no-run-dir
# The run's peak memory: the process's peak RSS on the CPU, in the summary and the JSON.
expect 0 'Peak memory: [0-9]+\.[0-9] MiB \(peak RSS of the process\)' -- train --task generate --dataset sprites --sprite-count 32 --epochs 1 --batch-size 16 --device cpu --no-run-dir
expect 0 '"peak_memory":\{"bytes":[1-9][0-9]*,"what":"peak RSS of the process"\}' -- train --device cpu --dataset dummy --model simplenn --epochs 1 --json --no-run-dir
# Its step evaluations have a test loss and no accuracy.
expect 0 '"evals":\[\{"epoch":1\.0,"step":1,"test_loss":[-0-9.e]+,"train_s":[-0-9.e]+\}\]' -- train --task generate --dataset sprites --sprite-count 32 --epochs 1 --batch-size 16 --device cpu --json --no-run-dir --eval-every-steps 1
expect 2 "unknown class 'dragon'" -- generate --checkpoint "$tmp/g.pt" --class dragon --out "$tmp/x.png"
expect 2 "needs --out" -- generate --checkpoint "$tmp/g.pt"
expect 2 "expected a generator checkpoint" -- generate --checkpoint "$tmp/c.pt" --out "$tmp/x.png"
expect 0 "Wrote .*sheet.png" -- generate --checkpoint "$tmp/g.pt" --class robot --count 6 --steps 2 --scale 2 --palette auto --out "$tmp/sheet.png" --out-dir "$tmp/one"
expect 0 "CPU threads: 1 intra-op, (1|\?) BLAS" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --threads 1 --out "$tmp/t1.png"
expect 0 '"threads":"[0-9]+ intra-op, (1|\?) BLAS"' -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --json --out "$tmp/t2.png"
# The samplers: each takes only its own options.
expect 0 '"eta":null,.*"sampler":"dpm\+\+2m"' -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 3 --sampler dpm++2m --spacing quadratic --json --out "$tmp/t3.png"
expect 2 "--eta is DDIM's noise; --sampler dpm\+\+2m does not take it" -- generate --checkpoint "$tmp/g.pt" --sampler dpm++2m --eta 1 --out "$tmp/x.png"
expect 2 "--steps: --sampler ddpm takes every one" -- generate --checkpoint "$tmp/g.pt" --sampler ddpm --steps 10 --out "$tmp/x.png"
expect 2 "--spacing: --sampler ddpm takes every one" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --sampler ddpm --spacing quadratic
expect 2 "--spacing: karras not in" -- generate --checkpoint "$tmp/g.pt" --spacing karras --out "$tmp/x.png"
expect 2 "needs --classifier" -- eval --checkpoint "$tmp/g.pt"
# A classifier of another sprite size cannot judge the generator's sprites: said before any sampling.
expect 0 "Saved checkpoint" -- train --task classify --dataset sprites --sprite-count 40 --size 32 --epochs 1 --no-run-dir --save "$tmp/c32.pt"
expect 2 "--classifier $tmp/c32\.pt takes inputs of shape \[4, 32, 32\]; the generator $tmp/g\.pt draws sprites of \[4, 16, 16\]" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c32.pt" --count 8 --steps 2
expect 2 "g\.pt: expected a classifier checkpoint \(train --task classify\), found a sprite generator checkpoint" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/g.pt" --count 4 --steps 2
# Guidance on part of the schedule only: reported in both commands, a bad interval refused.
expect 0 '"guidance":3\.0,"guidance_interval":\[0\.4,1\.0\]' -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 3 --guidance 3 --guidance-interval 0.4:1 --json --out "$tmp/t4.png"
expect 0 "guidance 3 at t/T 0\.4-1" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 4 --steps 3 --guidance 3 --guidance-interval 0.4:1 --no-fidelity
# The sprites' alpha: auto is the checkpoint's (binary for the procedural sprites), --alpha picks.
expect 0 '"alpha":"binary"' -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --json --out "$tmp/a1.png"
expect 0 'alpha soft;' -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --alpha soft --out "$tmp/a2.png"
expect 2 "--alpha: translucent not in" -- generate --checkpoint "$tmp/g.pt" --alpha translucent --out "$tmp/x.png"
expect 2 "cannot read --guidance-interval '1:0.4': expected FROM:TO" -- generate --checkpoint "$tmp/g.pt" --guidance-interval 1:0.4 --out "$tmp/x.png"
expect 2 "cannot read --guidance-interval 'half': expected FROM:TO" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --guidance-interval half
# Outputs are checked before any sampling: an existing sheet or sprite PNG is kept unless
# --overwrite, a missing folder or a file given as --out-dir is refused, and so is a palette PNG
# that cannot be read; a negative guidance and more DDIM steps than the schedule has, too.
expect 0 "Wrote $tmp/once.png" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --out "$tmp/once.png"
expect 2 "refusing to overwrite $tmp/once.png \(given as --out\): the file exists" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --out "$tmp/once.png"
expect 0 "Wrote $tmp/once.png" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --out "$tmp/once.png" --overwrite
expect 2 "cannot write $tmp/no-such-folder/x.png \(given as --out\): the folder $tmp/no-such-folder does not exist" -- generate --checkpoint "$tmp/g.pt" --out "$tmp/no-such-folder/x.png"
expect 2 "^error: --palette: an empty path" -- generate --checkpoint "$tmp/g.pt" --palette "" --out "$tmp/empty_palette.png"
expect 2 "--out-dir $tmp/once.png exists and is not a folder" -- generate --checkpoint "$tmp/g.pt" --out-dir "$tmp/once.png"
expect 0 "Wrote 2 PNGs to $tmp/each" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --out-dir "$tmp/each"
expect 2 "refusing to overwrite $tmp/each/[a-z]+_0000.png \(given as --out-dir\)" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --out-dir "$tmp/each"
# --out among the --out-dir PNGs: the sprite would replace the sheet.
expect 2 "--out $tmp/each/[a-z]+_0001.png is one of the --out-dir PNGs" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --out-dir "$tmp/each" --out "$tmp/each/$(ls "$tmp/each" | grep _0001)" --overwrite
expect 2 "$tmp/none.png: expected a readable PNG file" -- generate --checkpoint "$tmp/g.pt" --palette "$tmp/none.png" --out "$tmp/p.png"
expect 2 "--steps 5000: this generator's noise schedule has [0-9]+ timesteps, the most ddim can take" -- generate --checkpoint "$tmp/g.pt" --steps 5000 --out "$tmp/p.png"
expect 2 "--guidance: '-1' is not a number from 0 to 100" -- generate --checkpoint "$tmp/g.pt" --guidance -1 --out "$tmp/p.png"
# A count no run could sample is refused by its value (800 GB of labels were an allocation error).
expect 2 "--count: '100000000000' is not a number from 1 to 1000000" -- generate --checkpoint "$tmp/g.pt" --count 100000000000 --out-dir "$tmp/huge"
expect 2 "--class robot: --guidance 0 with --guidance-interval 0:1 samples every step unconditionally" -- generate --checkpoint "$tmp/g.pt" --class robot --guidance 0 --guidance-interval 0:1 --out "$tmp/p.png"
expect 0 "Wrote $tmp/p0.png" -- generate --checkpoint "$tmp/g.pt" --class robot --count 2 --steps 2 --guidance 0 --out "$tmp/p0.png"
expect 2 "refusing to overwrite $tmp/once.png \(given as --out\)" -- data preview --dataset sprites --out "$tmp/once.png"
expect 2 "--sample-every writes sample sheets into the run folder; --no-run-dir keeps none" -- train --task generate --dataset sprites --sprite-count 64 --epochs 1 --no-run-dir --sample-every 1
expect 2 "--guidance-interval places guidance on part of the schedule; --guidance 1 is no guidance" -- generate --checkpoint "$tmp/g.pt" --guidance 1 --guidance-interval 0:1 --out "$tmp/x.png"
expect 2 "--guidance-interval places guidance on part of the schedule; --guidance 1 is no guidance" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --guidance 1 --guidance-interval 0.4:1
expect 0 "Class agreement" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 8 --steps 2
# A generator trained with --holdout 0 has no held-out sprites: no real agreement (not 0).
expect 0 "Saved checkpoint" -- train --task generate --dataset sprites --sprite-count 64 --holdout 0 --epochs 1 --batch-size 16 --no-run-dir --save "$tmp/g0.pt"
expect 0 '"real_class_agreement":null,"real_held_out":0,"real_per_class_agreement":\[\]' -- eval --checkpoint "$tmp/g0.pt" --classifier "$tmp/c.pt" --count 4 --steps 2 --no-fidelity --json
expect 0 "all +[01]\.[0-9]{4}  -$" -- eval --checkpoint "$tmp/g0.pt" --classifier "$tmp/c.pt" --count 4 --steps 2 --no-fidelity
# Fewer sprites than classes cannot be judged per class: said, not a two-sample test's inner error.
expect 2 "--count 1: .*g\.pt draws [2-9] classes, and eval judges at least one sprite of each" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 1 --steps 2
# The fidelity report: both two-sample tests (real sprites weighted to the generated classes'
# mix), the distances in the classifier's features and the pixel-art statistics, in text and JSON.
expect 0 "real vs real +[01]\.[0-9]{4}" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 8 --steps 2
expect 0 "the real set allows [0-9]+ a set: --count [0-9]+ gives the critics more to learn from" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 8 --steps 2
expect 0 "Frechet distance +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2}$" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 8 --steps 2
expect 0 "recall \(real covered\) +[01]\.[0-9]{4} +[01]\.[0-9]{4}$" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 8 --steps 2
expect 0 '"fidelity":\{"c2st":[0-9.]+,"c2st_real":[0-9.]+,"class_weighted":true,"generated":\{"alpha_coverage":[0-9.]+,"colours":[0-9.]+,"sprites":8,"stray_pixels":[0-9.]+\},"judge_features":\{"dims":[0-9]+,"frechet":[0-9.e+-]+,"frechet_real":[0-9.e+-]+,"precision":[0-9.]+,"precision_real":[0-9.]+,"recall":[0-9.]+,"recall_real":[0-9.]+\},"max_per_set":[0-9]+,"per_set":8,' -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 8 --steps 2 --json
expect 0 '"eta":1\.0,.*"guidance":4\.0,"guidance_interval":\[0\.3,0\.9\],.*"sampler":"ddim".*"spacing":"uniform".*"steps":2,.*"threads":"1 intra-op' -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 8 --steps 2 --threads 1 --json
# eval samples in bf16 as generate does; an option of the other kind of checkpoint is refused.
expect 0 "Generator: .*g\.pt \(ddim 2 uniform steps, .*, bf16, alpha binary \(auto\)\)" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 4 --steps 2 --precision bf16 --no-fidelity
expect 0 '"precision":"bf16"' -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 4 --steps 2 --batch-size 3 --precision bf16 --no-fidelity --json
expect 0 '"precision":"fp32"' -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 4 --steps 2 --precision fp32 --no-fidelity --json
native=fp32  # eval's default, auto: bf16 where `devices` says the CPU's native bf16 pays (bf16_auto)
"$bin" devices --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(x.get("bf16_auto") for x in d["devices"] if x["device"].startswith("cpu")) else 1)' && native=bf16
expect 0 "Generator: .*g\.pt \(ddim 2 uniform steps, .*, $native \(auto\), alpha binary \(auto\)\)" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 4 --steps 2 --no-fidelity --device cpu
expect 2 "--steps applies to generator checkpoints; .*c\.pt is a classifier" -- eval --checkpoint "$tmp/c.pt" --steps 3
expect 2 "--classifier applies to generator checkpoints" -- eval --checkpoint "$tmp/c.pt" --classifier "$tmp/c.pt"
expect 2 "--limit applies to classifier checkpoints; .*g\.pt is a generator" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --limit 5
# Every option the generator branch registers is refused for a classifier, the last ones too.
expect 2 "--precision applies to generator checkpoints" -- eval --checkpoint "$tmp/c.pt" --precision fp32
expect 2 "--no-fidelity applies to generator checkpoints" -- eval --checkpoint "$tmp/c.pt" --no-fidelity
expect 2 "--data applies to classifier checkpoints" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --data "$tmp"
# The environment variables are settings for every command: one of the other kind passes.
SPRITETORCH_PRECISION=bf16 expect 0 "Confusion matrix" -- eval --checkpoint "$tmp/c.pt"
SPRITETORCH_DATA="$tmp/nowhere" expect 0 "Class agreement" -- eval --checkpoint "$tmp/g.pt" --classifier "$tmp/c.pt" --count 4 --steps 2 --no-fidelity
expect 2 "--blas-threads: .-2. is not a thread count from 0 to" -- classify --checkpoint "$tmp/c.pt" --blas-threads -2 "$tmp/preview.png"
expect 0 "$tmp/preview.png	[a-z]+	[01]\.[0-9]+" -- classify --checkpoint "$tmp/c.pt" --threads 1 --blas-threads 1 "$tmp/preview.png"
if [ -f "$tmp/one/robot_0005.png" ]; then passes=$((passes + 1)); else echo "FAIL: --out-dir wrote no robot_0005.png"; fails=$((fails + 1)); fi
# An MLP sprite classifier takes a PNG already of its size (it was a raw LibTorch error, exit 1).
expect 0 "Saved checkpoint" -- train --task classify --dataset sprites --sprite-count 40 --model ann --epochs 1 --no-run-dir --save "$tmp/c_ann.pt"
expect 0 "Wrote " -- generate --checkpoint "$tmp/g.pt" --class robot --count 1 --steps 2 --out "$tmp/one16.png" --out-dir "$tmp/one16"
expect 0 "robot_0000.png	[a-z]+	[01]\.[0-9]+" -- classify --checkpoint "$tmp/c_ann.pt" "$tmp/one16/robot_0000.png"
# classify --tile: each tile of the sheet (3 x 2 tiles of 16 px, padding 1, all scaled by 2) gets
# exactly what its own PNG gets; a sheet without --tile is one stretched sprite, with a note.
whole=$("$bin" classify --checkpoint "$tmp/c.pt" "$tmp"/one/robot_000[0-5].png 2>&1 | cut -f2-)
tiles=$("$bin" classify --checkpoint "$tmp/c.pt" --tile 32x32 --spacing 2 --margin 2 "$tmp/sheet.png" 2>&1)
if [ "$(cut -f2- <<<"$tiles")" = "$whole" ] && [ "$(cut -f1 <<<"$tiles" | tail -1)" = "$tmp/sheet.png#5" ] &&
  [ "$(wc -l <<<"$tiles")" = 6 ]; then passes=$((passes + 1)); else
  echo "FAIL: classify --tile on the sheet: $tiles, the single PNGs: $whole"; fails=$((fails + 1)); fi
expect 0 "\"tile\":5" -- classify --checkpoint "$tmp/c.pt" --tile 32x32 --spacing 2 --margin 2 --json "$tmp/sheet.png"
expect 0 "sheet.png is 104x70: classified as one picture, stretched to the model's 16x16.*pass --tile WxH" -- classify --checkpoint "$tmp/c.pt" "$tmp/sheet.png"
expect 2 "--invert is for grey and RGB models" -- classify --checkpoint "$tmp/c.pt" --invert "$tmp/sheet.png"
# An unreadable file among good ones: reported, skipped, the others classified, exit 2.
out=$("$bin" classify --checkpoint "$tmp/c.pt" "$tmp/nowhere.png" "$tmp" "$tmp/one/robot_0000.png" 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "robot_0000.png	" <<<"$out" && grep -q "nowhere.png: expected a readable PNG file" <<<"$out" &&
  grep -q "found a folder" <<<"$out" && grep -q "2 of 3 files could not be read" <<<"$out"; then passes=$((passes + 1)); else
  echo "FAIL: classify with unreadable files: exit $rc: $out"; fails=$((fails + 1)); fi
expect 2 "need --tile WxH" -- classify --checkpoint "$tmp/c.pt" --margin 2 "$tmp/sheet.png"
expect 2 "expected at least one 200x32 tile with margin 2, found an image of 104x70" -- classify --checkpoint "$tmp/c.pt" --tile 200x32 --margin 2 "$tmp/sheet.png"
# classify with a Fashion-MNIST model: grey PNGs of real test images (written by Python, not by
# us) get their class; an inverted picture (dark on light) needs --invert to be read right.
fmnist=/usr/share/datasets/fashion-mnist
if [ -f "$fmnist/t10k-images-idx3-ubyte.gz" ]; then
  expect 0 "Saved checkpoint" -- train --epochs 1 --train-limit 5000 --device cpu --save "$tmp/fm.pt" --no-run-dir
  png=$(dirname "$0")/fashion_png.py
  python3 "$png" "$fmnist" 1 "$tmp/trouser.png" && python3 "$png" "$fmnist" 7 "$tmp/sneaker.png" &&
    python3 "$png" "$fmnist" 1 "$tmp/trouser_inv.png" --invert
  expect 0 "trouser.png	Trouser	" -- classify --checkpoint "$tmp/fm.pt" "$tmp/trouser.png"
  expect 0 '"class":"Sneaker"' -- classify --checkpoint "$tmp/fm.pt" --json "$tmp/sneaker.png"
  # eval reads the test split alone: a folder of the two t10k files is enough.
  mkdir -p "$tmp/t10k_only" && cp "$fmnist"/t10k-* "$tmp/t10k_only/"
  expect 0 "Test loss: .* \(500 samples\)" -- eval --checkpoint "$tmp/fm.pt" --data "$tmp/t10k_only" --limit 500
  expect 0 "Ankle boot" -- eval --checkpoint "$tmp/fm.pt" --data "$tmp/t10k_only" --limit 500
  # A folder missing a t10k file: the hint names the two files eval reads, not four.
  mkdir -p "$tmp/t10k_half" && cp "$fmnist"/t10k-images-* "$tmp/t10k_half/"
  expect 2 "holding t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte \(plain or .gz; training reads" -- eval --checkpoint "$tmp/fm.pt" --data "$tmp/t10k_half"
  straight=$("$bin" classify --checkpoint "$tmp/fm.pt" "$tmp/trouser.png" | cut -f2-)
  undone=$("$bin" classify --checkpoint "$tmp/fm.pt" --invert "$tmp/trouser_inv.png" | cut -f2-)
  if [ -n "$straight" ] && [ "$straight" = "$undone" ]; then passes=$((passes + 1)); else
    echo "FAIL: classify --invert of the inverted trouser: '$undone', the trouser: '$straight'"; fails=$((fails + 1)); fi
  # The dataset cache (data/idx_cache.h): written by the first run, read silently by the next, a
  # corrupt file noted and replaced, nothing written with SPRITETORCH_CACHE=0.
  fm_run=(train --epochs 1 --train-limit 500 --test-limit 500 --device cpu --no-run-dir)
  XDG_CACHE_HOME="$tmp/xdg" expect 0 "Test Accuracy" -- "${fm_run[@]}"
  cached=$(ls "$tmp/xdg/spritetorch/"*.idxcache 2>/dev/null | wc -l)
  if [ "$cached" -eq 4 ]; then passes=$((passes + 1)); else
    echo "FAIL: the dataset cache holds $cached files after a Fashion-MNIST run (wanted 4)"; fails=$((fails + 1)); fi
  quiet=$(XDG_CACHE_HOME="$tmp/xdg" "$bin" "${fm_run[@]}" 2>&1)
  if ! grep -q "dataset cache" <<<"$quiet"; then passes=$((passes + 1)); else
    echo "FAIL: a run on a valid cache printed: $(grep "dataset cache" <<<"$quiet")"; fails=$((fails + 1)); fi
  labels_cache=$(ls "$tmp/xdg/spritetorch/"t10k-labels*.idxcache)
  head -c 200 /dev/zero >"$labels_cache"
  XDG_CACHE_HOME="$tmp/xdg" expect 0 "note: dataset cache: ignoring .*t10k-labels.*not a spritetorch cache file" -- "${fm_run[@]}"
  XDG_CACHE_HOME="$tmp/xdg" SPRITETORCH_CACHE=0 expect 0 "Test Accuracy" -- "${fm_run[@]}"
  XDG_CACHE_HOME="$tmp/xdg-off" SPRITETORCH_CACHE=0 expect 0 "Test Accuracy" -- "${fm_run[@]}"
  if [ ! -e "$tmp/xdg-off/spritetorch" ]; then passes=$((passes + 1)); else
    echo "FAIL: SPRITETORCH_CACHE=0 wrote $tmp/xdg-off/spritetorch"; fails=$((fails + 1)); fi
else
  echo "skipped the Fashion-MNIST classify and cache checks: no $fmnist"
fi
expect 0 "Saved checkpoint" -- train --dataset dummy --model simplenn --epochs 1 --device cpu --save "$tmp/dummy.pt" --no-run-dir
expect 2 "expected an image classifier .*found input shape \[3\]" -- classify --checkpoint "$tmp/dummy.pt" "$tmp/preview.png"
# The same train command on a folder of PNGs (one subfolder per class), here the generator's own output.
expect 0 "Wrote 8 PNGs" -- generate --checkpoint "$tmp/g.pt" --count 8 --steps 2 --out-dir "$tmp/gen"
for f in "$tmp"/gen/*.png; do c=$(basename "$f" | sed 's/_[0-9]*\.png$//'); mkdir -p "$tmp/folder/$c"; cp "$f" "$tmp/folder/$c/"; done
expect 0 "folder:folder/train \(7 train, 1 test, 4 classes\)" -- train --task classify --dataset "folder:$tmp/folder" --size 32 --epochs 1
# A checkpoint's relative folder: path, evaluated from another folder: named as the checkpoint's,
# with --dataset to point at the data; another kind of data is refused.
(cd "$tmp" && "$bin" train --task classify --dataset folder:folder --size 32 --epochs 1 --no-run-dir --save "$tmp/fold.pt" >/dev/null 2>&1)
expect 2 "$tmp/fold.pt was trained on --dataset folder:folder, and folder is not there \(relative to the current folder" -- eval --checkpoint "$tmp/fold.pt"
expect 0 "Confusion matrix" -- eval --checkpoint "$tmp/fold.pt" --dataset "folder:$tmp/folder"
expect 2 "--dataset sheet:$tmp/sheet.png: $tmp/fold.pt was trained on folder:folder" -- eval --checkpoint "$tmp/fold.pt" --dataset "sheet:$tmp/sheet.png"
# A sheet classifier trained with --labels, evaluated from another folder: --dataset points at the
# sheet, the recorded labels file that is not there is named as the checkpoint's, and eval
# --labels (sheet: only, as train's) reads the map from elsewhere.
mkdir -p "$tmp/pics" && cp "$(dirname "$0")/../fixtures/kenney_1bit_colored_packed.png" "$tmp/pics/sheet.png"
for i in $(seq 0 39); do echo "$i $([ "$i" -lt 20 ] && echo near || echo far)"; done >"$tmp/pics/lab.txt"
(cd "$tmp/pics" && "$bin" train --task classify --dataset sheet:sheet.png --labels lab.txt --holdout 0.5 --epochs 1 --device cpu --no-run-dir --save "$tmp/sh.pt" >/dev/null 2>&1)
sheet_eval=(eval --checkpoint "$tmp/sh.pt" --dataset "sheet:$tmp/pics/sheet.png")
expect 2 "$tmp/sh.pt was trained on --dataset sheet:sheet.png with --labels lab.txt, and that recorded labels file is not there \(relative to the current folder" -- "${sheet_eval[@]}"
expect 2 "hint: run from the folder the model was trained in, or pass --labels FILE" -- "${sheet_eval[@]}"
expect 0 '"far":.*"near":' -- "${sheet_eval[@]}" --labels "$tmp/pics/lab.txt" --json
expect 0 "Confusion matrix" -- "${sheet_eval[@]}" --labels "$tmp/pics/lab.txt" --limit 2
expect 2 "--labels applies to sheet: datasets; $tmp/fold.pt was trained on folder:folder" -- eval --checkpoint "$tmp/fold.pt" --dataset "folder:$tmp/folder" --labels "$tmp/pics/lab.txt"
# A folder of the same shape whose classes are other ones is refused, not scored under the
# checkpoint's labels.
mkdir -p "$tmp/renamed"
i=0; for d in "$tmp"/folder/*/; do i=$((i + 1)); cp -r "$d" "$tmp/renamed/class$i"; done
expect 2 "expected the classes $tmp/fold.pt was trained on \(.*\), found classes class1, class2, class3, class4" -- eval --checkpoint "$tmp/fold.pt" --dataset "folder:$tmp/renamed"
# ... and so is resuming it there (its outputs would be relabelled), and --dataset names where
# the data came from.
expect 2 "--resume $tmp/fold.pt was trained on the classes .*; the data of this run \(--dataset folder:$tmp/renamed\) has class1, class2, class3, class4" -- train --dataset "folder:$tmp/renamed" --size 32 --epochs 3 --resume "$tmp/fold.pt" --no-run-dir
# Hidden folders and files are no classes or sprites.
mkdir -p "$tmp/folder/.git" && cp "$tmp"/gen/*.png "$tmp/folder/.git/"
expect 0 "folder:folder/train \(7 train, 1 test, 4 classes\)" -- train --task classify --dataset "folder:$tmp/folder" --size 32 --epochs 1 --no-run-dir
rm -r "$tmp/folder/.git"

# Run folders, progress output and `runs` (docs/runs.md).
small=(train --dataset dummy --model simplenn --epochs 2 --log-every 20)
expect 0 "Run folder: $tmp/r1" -- "${small[@]}" --run-dir "$tmp/r1"
touch "$tmp/r_taken.pt"
check "a run refused before it starts names no run folder (and leaves none)" \
  bash -c '! "$1" train --epochs 1 --train-limit 64 --run-dir "$2/r_refused" --save "$2/r_taken.pt" 2>&1 | grep -q "Run folder" && [ ! -e "$2/r_refused" ]' _ "$bin" "$tmp"
for f in config.toml metrics.jsonl summary.json checkpoint.pt; do check "run folder has $f" test -s "$tmp/r1/$f"; done
check "metrics.jsonl: every line an object with kind, step, epoch, wall_s, values; log, epoch and eval lines" \
  python3 - "$tmp/r1/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert all({"kind", "step", "epoch", "wall_s", "values"} <= set(l) for l in lines), lines
kinds = [l["kind"] for l in lines]
assert kinds[0] == "start" and kinds[-1] == "end" and {"log", "epoch", "eval"} <= set(kinds), kinds
assert kinds.count("epoch") == 2 and kinds.count("eval") == 2, kinds
PY
check "config.toml holds the effective flags, not --run-dir" grep -q "epochs" "$tmp/r1/config.toml"
check "config.toml has no run-dir" bash -c "! grep -q '^run-dir' '$tmp/r1/config.toml'"
# stop_run PID: ends a background run promptly. SIGTERM, not SIGINT: a background job of this
# non-interactive shell starts with SIGINT ignored and the CLI takes signals only while the training
# loop runs (train/interrupt.h), so a SIGINT that came while the run was still setting up was lost
# and the generator below trained its whole 15-minute budget. A TERM then kills it at once (no
# checkpoint: these checks read what was written before the first step); within the loop it stops
# the run after the step in progress. KILL if it is still there after a minute.
stop_run() {
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 1 240); do kill -0 "$1" 2>/dev/null || break; sleep 0.25; done
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
# A sprite classifier without --epochs trains for 30 epochs, but at least 500 steps: 576 sprites,
# 9 steps an epoch
# (stopped once it has said so; train/recipe_test.cpp has the arithmetic).
"$bin" train --task classify --dataset sprites --sprite-count 640 --device cpu --no-run-dir \
  --save "$tmp/cauto.pt" > "$tmp/cauto.log" 2>&1 &
cauto=$!
for _ in $(seq 1 240); do grep -q '^Epochs:' "$tmp/cauto.log" && break; sleep 0.25; done
stop_run $cauto
check "a sprite classifier's automatic epochs" grep -q \
  "^Epochs: 56 (576 sprites in batches of 64: 30 epochs within 500-1500 steps, at least 5 epochs; --epochs sets them)" \
  "$tmp/cauto.log"
# A generator's epochs follow from its dataset's size once the data is read: config.toml records
# the number chosen (so --config repeats the run), rewritten before the first step; then SIGTERM.
"$bin" train --task generate --dataset sprites --sprite-count 64 --device cpu \
  --run-dir "$tmp/gauto" > "$tmp/gauto.log" 2>&1 &
gauto=$!
for _ in $(seq 1 240); do
  n=$(sed -n 's/^Epochs: \([0-9]*\) (about.*/\1/p' "$tmp/gauto.log")
  [ -n "$n" ] && grep -q "^epochs = $n\$" "$tmp/gauto/config.toml" 2>/dev/null && break
  sleep 0.25
done
stop_run $gauto
check "config.toml records a generator's automatic epochs ($n)" \
  bash -c "[ -n '$n' ] && [ '$n' != 5 ] && grep -q '^epochs = $n\$' '$tmp/gauto/config.toml'"
check "a generator on the CPU takes batches of 16 without --batch-size" \
  grep -q '^Epochs: [0-9]* (about 18000 steps of 16 from ' "$tmp/gauto.log"
check "config.toml records a generator's default batch" \
  grep -q '^batch-size = 16$' "$tmp/gauto/config.toml"
check "config.toml records a generator's default time budget" \
  grep -q '^time-budget = 900\(\.0\)\?$' "$tmp/gauto/config.toml"
check "config.toml records how sprites are resized (area means by default)" \
  grep -q '^resize = "area"$' "$tmp/gauto/config.toml"
check "config.toml records a generator's NCHW default (its GroupNorms run NCHW on CUDA)" \
  grep -q '^channels-last = false$' "$tmp/gauto/config.toml"
check "config.toml records a generator's default lr (0.002: docs/sprites.md, The learning rate)" \
  grep -q '^lr = 0.002$' "$tmp/gauto/config.toml"
check "a classifier keeps the lr of 0.001" grep -q '^lr = 0.001$' "$tmp/r1/config.toml"
check "a classifier keeps channels_last on" grep -q '^channels-last = true$' "$tmp/r1/config.toml"
# --channels-last applies on a CPU with AVX2 too (oneDNN's NHWC convolutions): the settings say so, the
# run learns what the NCHW run learns up to float rounding, and its checkpoint evaluates to the
# accuracy the run reported.
cl_json=$("$bin" train --dataset sprites --sprite-count 64 --epochs 2 --device cpu --no-run-dir --json \
  --save "$tmp/cl.pt" 2>/dev/null)
nchw_json=$("$bin" train --dataset sprites --sprite-count 64 --epochs 2 --device cpu --no-run-dir --json \
  --channels-last false 2>/dev/null)
# On a CPU with AVX2 or AVX-512 (the avx2 or avx512 matrix kernel can run), else it keeps NCHW and
# says so.
layout='NCHW (--channels-last applies to CUDA and to CPUs with AVX2)'
"$bin" devices --json | python3 -c 'import json,sys; k = json.load(sys.stdin)["cpu_gemm_kernels"]
sys.exit(0 if "avx512" in k or "avx2" in k else 1)' && layout=channels_last
check "a CPU conv run's settings say its memory format ($layout)" python3 -c "
import json, sys; s = json.loads(sys.argv[1])['settings']
assert s['memory format'] == sys.argv[2], s" "$cl_json" "$layout"
check "--channels-last false on the CPU: no memory format row" python3 -c "
import json, sys; assert 'memory format' not in json.loads(sys.argv[1])['settings']" "$nchw_json"
check "channels_last and NCHW on the CPU learn the same (test loss within 1e-3 relative)" python3 -c "
import json, sys; a, b = (json.loads(x)['test']['loss'] for x in sys.argv[1:3])
assert abs(a - b) <= 1e-3 * abs(b), (a, b)" "$cl_json" "$nchw_json"
cl_eval=$("$bin" eval --checkpoint "$tmp/cl.pt" --json 2>/dev/null)
check "a checkpoint trained channels_last evaluates to the accuracy its run reported" python3 -c "
import json, sys; a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert abs(a['accuracy'] - b['test']['accuracy']) < 1e-9, (a, b['test'])" "$cl_eval" "$cl_json"
every=$(( ${n:-0} / 50 > 1 ? ${n:-0} / 50 : 1 ))
check "config.toml records a generator's automatic evaluation interval ($every: epochs / 50)" \
  grep -q "^eval-every = $every\$" "$tmp/gauto/config.toml"
check "a generator's automatic epochs say the time budget" \
  grep -q "fewer if they do not fit in 15:00 of training; --epochs sets them, --time-budget the time)" "$tmp/gauto.log"
check "summary.json names the checkpoint, the test accuracy and the peak memory" python3 -c "
import json, sys; s = json.load(open('$tmp/r1/summary.json'))
assert s['status'] == 'complete' and s['checkpoint'] == 'checkpoint.pt' and 0 <= s['test']['accuracy'] <= 1, s
assert s['peak_memory']['bytes'] > 0 and s['peak_memory']['what'] == 'peak RSS of the process', s"
out=$("$bin" "${small[@]}" --run-dir "$tmp/r2" 2>&1)
check "not a terminal: no carriage returns, no escape codes" bash -c "! grep -q $'[\r\033]' <<<\"\$1\"" _ "$out"
check "not a terminal: a plain line per log interval" grep -q "epoch 1 step 20/" <<<"$out"
expect 2 "not empty" -- "${small[@]}" --run-dir "$tmp/r1"
expect 0 "Test Accuracy" -- "${small[@]}" --no-run-dir --quiet
quiet_out=$("$bin" "${small[@]}" --no-run-dir --quiet 2>&1)
check "--quiet: the results only" [ "$(grep -vc '^Train time\|^Peak memory\|^Test Accuracy' <<<"$quiet_out")" = 0 ]
expect 2 "--verbose excludes --quiet|--quiet excludes --verbose" -- "${small[@]}" --quiet --verbose
expect 2 "refusing to overwrite" -- "${small[@]}" --save "$tmp/s.pt" --run-dir "$tmp/r0"
check "a run refused before it starts leaves no folder" test ! -e "$tmp/r0"
# gnuplot hidden from PATH: the run still succeeds, with one line saying which pictures are skipped.
PATH=/nonexistent "$bin" "${small[@]}" --run-dir "$tmp/r4" >"$tmp/r4.out" 2>&1
check "without gnuplot: exit 0" [ $? = 0 ]
check "without gnuplot: one notice" [ "$(grep -c 'gnuplot not found: skipping curves.png' "$tmp/r4.out")" = 1 ]
check "without gnuplot: still a summary" test -s "$tmp/r4/summary.json"
if command -v gnuplot >/dev/null; then
  "$bin" train --dataset sprites --sprite-count 200 --epochs 2 --run-dir "$tmp/r5" >/dev/null 2>&1
  for f in curves.png confusion.png; do check "a default run draws $f" test -s "$tmp/r5/$f"; done
fi
if command -v script >/dev/null; then  # a pseudo-terminal: the bar is redrawn; colour unless NO_COLOR
  tty_out=$(script -qec "'$bin' ${small[*]} --no-run-dir" /dev/null)
  check "terminal: progress redrawn with \\r, in colour" bash -c "grep -q $'\r' <<<\"\$1\" && grep -q $'\033\\[' <<<\"\$1\"" _ "$tty_out"
  tty_out=$(NO_COLOR=1 script -qec "'$bin' ${small[*]} --no-run-dir" /dev/null)
  check "terminal with NO_COLOR: no escape codes" bash -c "! grep -q $'\033' <<<\"\$1\"" _ "$tty_out"
fi
"$bin" train --task generate --dataset sprites --sprite-count 64 --epochs 2 --batch-size 16 --unet-base 8 --run-dir "$tmp/g1" >/dev/null 2>&1
for f in samples/epoch-001.png samples/epoch-002.png summary.json; do check "generator run folder has $f" test -s "$tmp/g1/$f"; done
mkdir -p "$tmp/listing" && mv "$tmp/r1" "$tmp/g1" "$tmp/listing/"
mkdir -p "$tmp/listing/broken" && echo "{ nope" > "$tmp/listing/broken/summary.json"
mkdir -p "$tmp/listing/notes" && echo "not a run" > "$tmp/listing/notes/readme.txt"  # not listed
expect 0 "corrupt: summary.json is not valid JSON" -- runs --dir "$tmp/listing"
expect 0 "complete" -- runs --dir "$tmp/listing"
check "runs --json: one object per folder" python3 -c "
import json, subprocess; r = json.loads(subprocess.run(['$bin', 'runs', '--dir', '$tmp/listing', '--json'], capture_output=True, text=True).stdout)
assert len(r) == 3 and {x['status'] for x in r} == {'complete', 'corrupt'}, r"
# An lr beyond float's range is refused by name, not left to diverge at the first step.
expect 2 "--lr must be a number > 0 and at most 3.4e38" -- train --dataset dummy --model simplenn --epochs 1 --lr 1e300 --no-run-dir
# A run that diverges keeps why in its metrics.jsonl; runs lists it as failed with the error.
expect 2 "training diverged" -- train --dataset dummy --model simplenn --epochs 1 --optimizer sgd --lr 1e30 --run-dir "$tmp/failing/d1"
expect 0 "failed: training diverged" -- runs --dir "$tmp/failing"
mkdir -p "$tmp/no-runs-yet"
expect 0 "No runs in" -- runs --dir "$tmp/no-runs-yet"
expect 2 "nothing-here: expected a folder of run folders \(--dir\), found no such folder" -- runs --dir "$tmp/nothing-here"
expect 2 "expected a folder of run folders \(--dir\), found a file" -- runs --dir "$tmp/listing/broken/summary.json"
expect 2 "expected a folder of run folders \(--dir\), found a run folder itself" -- runs --dir "$tmp/listing/g1"
# A hand-edited metrics line of the wrong type is a damaged line, not the end of the listing.
mkdir -p "$tmp/edited/a" && echo '{"kind":"epoch","epoch":"x","values":{"loss":1}}' > "$tmp/edited/a/metrics.jsonl"
expect 0 "1 damaged line\(s\) in metrics.jsonl" -- runs --dir "$tmp/edited"

# An option the run would drop is refused, or named in the settings where a machine-wide setting
# may give it; outputs are checked before any training.
tiny=(train --device cpu --dataset dummy --model simplenn --epochs 1 --no-run-dir)
expect 2 "--data names the Fashion-MNIST folder; --dataset dummy does not read it" -- "${tiny[@]}" --data "$tmp/nowhere"
SPRITETORCH_DATA="$tmp/nowhere" expect 0 "Test Accuracy" -- "${tiny[@]}"
expect 2 "--step-threads splits the fused CPU step of ReLU MLPs; this run's step is autograd" -- "${tiny[@]}" --step autograd --step-threads 2
expect 0 "streaming: .*--pin-memory unused: pinned buffers speed copies to a CUDA device" -- "${tiny[@]}" --data-on host --pin-memory 1
expect 0 "resident on cpu \(--resident-share unused" -- "${tiny[@]}" --resident-share 0.3
expect 0 "--cudnn-benchmark false unused" -- "${tiny[@]}" --cudnn-benchmark false
expect 0 "cuda graphs +off: --no-cuda-graphs unused here, graphs are captured on CUDA only" -- "${tiny[@]}" --no-cuda-graphs
expect 2 "--workers: .100000. is not a number from 0 to 256" -- "${tiny[@]}" --data-on host --workers 100000
expect 2 "a budget of at most 8760h" -- "${tiny[@]}" --time-budget 1e300
# launch starts the ranks of one training run: any other command, or a one-process strategy in a
# rank of several, would run the same work side by side.
expect 2 "launch starts the ranks of a training run: its command is train, not 'bench'" -- launch --nproc-per-node 2 -- bench --dataset dummy --model simplenn
# A rank count far past any machine's GPUs or cores is refused before anything starts.
expect 2 "error: --nproc-per-node 100000: at most 256 ranks on one machine" -- launch --nproc-per-node 100000 -- train --dataset dummy --model simplenn
# A rendezvous address no rank could reach is refused before any starts (each waited out
# --dist-timeout, 300 s, while c10d logged its retries); .invalid never resolves (RFC 2606).
expect 2 "error: --master-addr nohost\.invalid cannot be resolved" -- launch --master-addr nohost.invalid --nproc-per-node 1 -- train --dataset dummy --model simplenn --epochs 1 --no-run-dir
expect 2 "error: --master-addr is empty" -- launch --master-addr "" --nproc-per-node 1 -- train --dataset dummy --model simplenn --epochs 1 --no-run-dir
# --print-config under launch: rank 0 prints the one config file, not one per rank.
n=$("$bin" launch --nproc-per-node 2 -- "${tiny[@]}" --print-config 2>/dev/null | grep -c '^device = ')
if [ "$n" = 1 ]; then passes=$((passes + 1)); else echo "FAIL: launch -- train --print-config printed $n configs"; fails=$((fails + 1)); fi
# A mistake every rank makes is printed once, by the first rank, not once per rank; the folder the
# other ranks left their messages in is gone afterwards.
mkdir -p "$tmp/launch-tmp"
TMPDIR="$tmp/launch-tmp" "$bin" launch --nproc-per-node 3 -- "${tiny[@]}" --lr -1 >/dev/null 2>"$tmp/launch.err"
rc=$?; n=$(grep -c "^error: --lr: '-1' is not a number > 0" "$tmp/launch.err")
if [ "$rc" = 2 ] && [ "$n" = 1 ] && [ -z "$(ls -A "$tmp/launch-tmp")" ]; then passes=$((passes + 1)); else
  echo "FAIL: launch with a bad flag: exit $rc, the error printed $n times, left: $(ls -A "$tmp/launch-tmp"); $(cat "$tmp/launch.err")"; fails=$((fails + 1)); fi
# A UNet width past any sprite model is refused before it is built (it would exhaust memory).
expect 2 "--unet-base: '100000' is not a multiple of 8 from 8 to 512" -- train --task generate --dataset sprites --unet-base 100000 --epochs 1 --no-run-dir
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 \
  expect 2 "--strategy single runs one process, but this is one of 2 ranks" -- "${tiny[@]}" --strategy single
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 \
  expect 2 "bench times one process; this is one of 2 ranks" -- bench --dataset dummy --model simplenn --out "$tmp/ranked"
expect 2 "cannot write $tmp/nodir/x.pt \(given as --save\): the folder $tmp/nodir does not exist" -- "${tiny[@]}" --save "$tmp/nodir/x.pt"
mkdir -p "$tmp/config-folder"
expect 2 "config-folder: expected a TOML config file, found a folder" -- "${tiny[@]}" --config "$tmp/config-folder"
expect 2 "--seed: '-1' is not a seed" -- "${tiny[@]}" --seed -1
expect 2 "--save: an empty path" -- "${tiny[@]}" --save ""
expect 2 "--run-dir: an empty path" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --run-dir ""
expect 2 "is not a seed" -- "${tiny[@]}" --seed 9223372036854775808
# Flags in a config file: false is a flag not given (a run folder's config.toml lists both graph
# flags as false), the command line wins over the file, and both set in one file contradict.
printf 'cuda-graphs = false\nno-cuda-graphs = false\n' > "$tmp/graphs-off.toml"
expect 0 "Test Accuracy" -- "${tiny[@]}" --config "$tmp/graphs-off.toml"
expect 2 "--cuda-graphs needs a CUDA device" -- "${tiny[@]}" --config "$tmp/graphs-off.toml" --cuda-graphs
printf 'no-cuda-graphs = true\n' > "$tmp/graphs-eager.toml"
expect 2 "--cuda-graphs needs a CUDA device" -- "${tiny[@]}" --config "$tmp/graphs-eager.toml" --cuda-graphs
printf 'cuda-graphs = true\nno-cuda-graphs = true\n' > "$tmp/graphs-both.toml"
expect 2 "graphs-both.toml:2: 'no-cuda-graphs' and 'cuda-graphs' exclude each other" -- "${tiny[@]}" --config "$tmp/graphs-both.toml"
# A resumed run trains the checkpoint's task on its data, with the same held-out split.
"$bin" "${tiny[@]}" --save "$tmp/dummy.pt" >/dev/null 2>&1
expect 2 "--resume $tmp/dummy.pt was trained on dummy; this run has --dataset fashion-mnist" -- train --resume "$tmp/dummy.pt" --epochs 2 --no-run-dir
"$bin" train --device cpu --dataset sprites --sprite-count 200 --epochs 1 --no-run-dir --save "$tmp/sprites.pt" >/dev/null 2>&1
expect 2 "was trained with --data-seed 1234 --holdout 0.1; this run has --data-seed 9 --holdout 0.3: its test split would not be the one held out" -- \
  train --device cpu --resume "$tmp/sprites.pt" --dataset sprites --sprite-count 200 --data-seed 9 --holdout 0.3 --epochs 2 --no-run-dir
expect 0 "Test Accuracy" -- train --device cpu --resume "$tmp/sprites.pt" --dataset sprites --sprite-count 200 --epochs 2 --no-run-dir
expect 2 "hint: resume it with train --task generate" -- \
  train --device cpu --resume "$tmp/listing/g1/checkpoint.pt" --dataset sprites --sprite-count 64 --epochs 3 --no-run-dir
# Replaying a run folder's config.toml (which names the runs root) beside --run-dir draws no note.
"$bin" train --device cpu --dataset dummy --model simplenn --epochs 1 --run-dir "$tmp/replayed" >/dev/null 2>&1
replay=$("$bin" train --config "$tmp/replayed/config.toml" --run-dir "$tmp/replayed2" 2>&1)
if [ $? = 0 ] && ! grep -q "runs-root" <<<"$replay"; then passes=$((passes + 1)); else
  echo "FAIL: replaying config.toml with --run-dir: $replay" | tail -5; fails=$((fails + 1)); fi

# Bad values that used to hang, crash or lose work (each refused before any work, exit 2).
expect 2 "--threads: '99999' is not a thread count from 0 to [0-9]+" -- eval --checkpoint "$tmp/s.pt" --threads 99999
SPRITETORCH_THREADS=20000 expect 2 "SPRITETORCH_THREADS=20000 .*is not a thread count" -- eval --checkpoint "$tmp/s.pt"
expect 2 "--step-threads: '100000' is not a thread count" -- "${tiny[@]}" --step-threads 100000
if [ -d /proc/self ]; then  # root's permission bits pass /proc; the check makes a file to find out
  expect 2 "cannot write /proc/x.pt \(given as --save\): the folder /proc is not writable" -- "${tiny[@]}" --save /proc/x.pt
  expect 2 "/dev/zero: expected a checkpoint file, found a device, not a file" -- eval --checkpoint /dev/zero
  expect 2 "/dev/zero: expected a readable PNG file, found a device, not a file" -- classify --checkpoint "$tmp/c.pt" /dev/zero
fi
expect 2 "nowhere.pt: expected a checkpoint file, found no such file" -- eval --checkpoint "$tmp/nowhere.pt"
"$bin" export --checkpoint "$tmp/s.pt" "$tmp/s_in.safetensors" >/dev/null 2>&1
expect 2 "OUT $tmp/s_in.safetensors is the IN itself" -- import "$tmp/s_in.safetensors" "$tmp/s_in.safetensors" --overwrite
# --model script:FILE reads FILE: a --save over it is refused before the file is even loaded.
cp "$0" "$tmp/user_net.pt"
expect 2 "--save $tmp/user_net.pt is the --model itself: writing it would replace an input, --overwrite or not" -- \
  train --model "script:$tmp/user_net.pt" --epochs 0 --no-run-dir --save "$tmp/user_net.pt" --overwrite
check "train --save over the --model script:FILE leaves the file as it was" cmp -s "$0" "$tmp/user_net.pt"
cp "$0" "$tmp/user_net.pt.json"
expect 2 "--out $tmp/user_net.pt.json is the --model itself" -- \
  bench --dataset dummy --model "script:$tmp/user_net.pt.json" --out "$tmp/user_net.pt" --overwrite
torch_python=""
for candidate in python3 /usr/bin/python3; do  # (a pyenv python3 first on PATH may lack torch)
  if "$candidate" -c "import torch" 2>/dev/null; then torch_python=$candidate; break; fi
done
if [ -n "$torch_python" ]; then
  # A model whose forward fails on export's reference batch (5 samples): nothing is written.
  # (torch.jit.script reads the class's source: a file, not stdin)
  cat >"$tmp/no5.py" <<'PY'
import sys, torch
class No5(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
    def forward(self, x):
        if x.size(0) == 5:
            raise RuntimeError("no batches of 5")
        return self.fc(x)
torch.jit.script(No5()).save(sys.argv[1])
PY
  "$torch_python" "$tmp/no5.py" "$tmp/no5.pt"
  "$bin" train --dataset dummy --model "script:$tmp/no5.pt" --epochs 1 --no-run-dir --save "$tmp/no5_ck.pt" >/dev/null 2>&1
  for format in safetensors torchscript; do
    expect 2 "no5_ck\.pt: its forward failed: no batches of 5" -- \
      export --checkpoint "$tmp/no5_ck.pt" "$tmp/no5_out.$format" --format "$format" --reference "$tmp/no5_ref.safetensors" --reference-count 5
    check_absent "$tmp/no5_out.$format"
    check_absent "$tmp/no5_ref.safetensors"
  done
fi
expect 0 "" -- import "$tmp/s_in.safetensors" "$tmp/s_back.pt" --model simplenn --dataset dummy
expect 2 "--reference-count requires --reference" -- export --checkpoint "$tmp/s.pt" "$tmp/s2.safetensors" --reference-count 5
"$bin" "${tiny[@]}" --save "$tmp/one.pt" >/dev/null 2>&1
expect 2 "nothing to train: $tmp/one.pt has 1 epochs done, and the run has 1" -- train --dataset dummy --resume "$tmp/one.pt" --epochs 1 --no-run-dir
expect 2 "--step fused needs a ReLU MLP" -- train --device cpu --dataset sprites --sprite-count 32 --model cnn --step fused --epochs 1 --no-run-dir
expect 2 "--python $tmp/no-python: expected a Python interpreter with torch and torchvision, found one that cannot be run" -- \
  bench --vs-python --python "$tmp/no-python" --out "$tmp/peer_missing"
expect 2 "--recipe fast is a classifier recipe; it does not apply to --task generate" -- train --task generate --dataset sprites --recipe fast
expect 2 "--out: an empty path" -- bench --dataset dummy --model simplenn --out ""
expect 2 "--count: '99999999999' is not a number from 1 to 1000000" -- generate --checkpoint "$tmp/g.pt" --count 99999999999 --out "$tmp/big.png"
expect 2 "--class: an empty class name" -- generate --checkpoint "$tmp/g.pt" --class "" --out "$tmp/none.png"
expect 2 "--augment flip,flip: .*names flip twice|'flip,flip' names flip twice" -- "${tiny[@]}" --augment flip,flip
# Refused when the options are read, so --print-config never writes out a value training refuses.
expect 2 "--augment: unknown augmentation 'rotate'" -- train --augment rotate --print-config
expect 2 "a shift of 9 pixels moves most of .*16x16 images out of the frame" -- train --device cpu --dataset sprites --sprite-count 32 --epochs 1 --no-run-dir --augment shift:9
expect 2 "a cutout of 16 pixels blanks most of each of .*16x16 images" -- train --device cpu --dataset sprites --sprite-count 32 --epochs 1 --no-run-dir --augment flip,cutout:16
expect 2 "a cutout of 60 pixels blanks most of each of .*16x16 images \(all of it, wherever the square falls\)" -- train --device cpu --dataset sprites --sprite-count 32 --epochs 1 --no-run-dir --augment cutout:60
expect 2 "--size: '3abc' is not a sprite size \(expected 16, 32 or 64\)" -- train --dataset sprites --size 3abc
expect 0 "--channels-last false unused: this model has no convolutions" -- "${tiny[@]}" --channels-last false
expect 0 "Test Accuracy" -- "${tiny[@]}" --batch-size 100000000  # buffers for the data's 1024 samples, not 10^8
# A checkpoint whose metadata names other data than its weights were trained on (CRC made to
# match) is refused naming both, not failed inside the first layer with LibTorch's words.
if command -v python3 >/dev/null; then
  python3 - "$tmp/one.pt" "$tmp/other_data.pt" <<'PY'
import json, struct, sys, zlib
d = open(sys.argv[1], "rb").read()
n = struct.unpack("<I", d[32:36])[0]
meta = json.loads(d[36:36 + n])
meta["dataset"] = "fashion-mnist"
body = json.dumps(meta).encode()
payload = struct.pack("<I", len(body)) + body + d[36 + n:]
head = bytearray(d[:32])
head[20:28] = struct.pack("<Q", len(payload))
head[28:32] = struct.pack("<I", zlib.crc32(payload))
open(sys.argv[2], "wb").write(bytes(head) + payload)
PY
  expect 2 "other_data.pt: expected weights for the data its metadata names \(fashion-mnist[^:]*: input \[1, 28, 28\], 10 classes\), found weights for input \[3\], 2 classes" -- eval --checkpoint "$tmp/other_data.pt" --limit 100
fi
# Another run's periodic checkpoints in the folder stop only a run that writes periodic ones too.
mkdir -p "$tmp/stray" && cp "$tmp/s.pt" "$tmp/stray/spritetorch-run.step4.pt"
pushd "$tmp/stray" >/dev/null
expect 0 "Test Accuracy" -- "${tiny[@]}"
expect 2 "refusing to overwrite the checkpoints of another run: spritetorch-run.step4.pt exists" -- "${tiny[@]}" --checkpoint-every 1
popd >/dev/null

# An output never replaces an input, --overwrite or not; a config file is refused by what it is.
expect 2 "^error: /dev/zero: expected a TOML config file, found a device, not a file" -- train --config /dev/zero --print-config
printf 'epochs = 1\n' > "$tmp/c_in.toml"
expect 2 "^error: --save $tmp/c_in.toml is the --config itself: writing it would replace an input" -- "${tiny[@]}" --config "$tmp/c_in.toml" --save "$tmp/c_in.toml" --overwrite
cp "$tmp/g.pt" "$tmp/g_in.pt"
expect 2 "^error: --out $tmp/g_in.pt is the --checkpoint itself" -- generate --checkpoint "$tmp/g_in.pt" --count 2 --steps 2 --out "$tmp/g_in.pt" --overwrite
check "generate --out over its own --checkpoint: the checkpoint is untouched" cmp -s "$tmp/g.pt" "$tmp/g_in.pt"
# Where an option the command line did not give came from; CLI11's words in this tool's.
SPRITETORCH_DEVICE=gpu expect 2 "note: --device came from SPRITETORCH_DEVICE=gpu" -- train --dataset dummy --model simplenn --epochs 1 --no-run-dir
printf 'count = 5\n' > "$tmp/count.toml"
expect 2 "note: --count 5 came from $tmp/count.toml:1" -- eval --checkpoint "$tmp/s.pt" --config "$tmp/count.toml"
expect 2 "^error: unknown command 'trian'" -- trian
expect 2 "^hint: did you mean 'train'\?" -- trian
expect 2 "^error: --epochs is given more than once" -- "${tiny[@]}" --epochs 2
expect 2 "^error: unknown option --epoch for spritetorch train" -- train --epoch 1
# A nested command's errors name it whole, and a misspelled one is an unknown command.
expect 2 "hint: spritetorch data preview --help lists what it takes" -- data preview --out "$tmp/x.png" --bogus
expect 2 "^error: unknown command 'preveiw' for spritetorch data$" -- data preveiw
expect 2 "^hint: did you mean 'preview'\? spritetorch data --help lists the commands" -- data preveiw
expect 2 "^hint: did you mean --epochs\?" -- train --epoch 1
expect 2 "^error: --resume: $tmp/nonexist.pt: expected a file, found no such file" -- train --resume "$tmp/nonexist.pt"
expect 2 "^error: --resume: $tmp: expected a file, found a folder" -- train --resume "$tmp"
expect 2 "'shift:100' in 'shift:100': expected a shift of at most 99 pixels" -- "${tiny[@]}" --augment shift:100
expect 2 "cannot write $tmp/s.pt/x.pt \(given as --save\): $tmp/s.pt is a file, not a folder" -- "${tiny[@]}" --save "$tmp/s.pt/x.pt"
expect 2 "$tmp/s.pt: expected a folder with one subfolder of PNG files per class, found a file" -- data preview --dataset "folder:$tmp/s.pt" --out "$tmp/p.png"
expect 2 "$tmp/s.pt: expected a folder holding Fashion-MNIST's train IDX files \(--data\), found a file" -- train --data "$tmp/s.pt" --no-run-dir
# Options that would do nothing are refused, not ignored: a generator option at its default value
# on a classifier, --columns without a sheet, a target accuracy without a test set.
expect 2 "--unet-base does not apply to --task classify" -- "${tiny[@]}" --unet-base 16
expect 2 "--columns lays out the --out sheet; this command writes no sheet" -- generate --checkpoint "$tmp/g.pt" --count 2 --steps 2 --out-dir "$tmp/cols" --columns 3
expect 2 "--target-accuracy is checked on the test set; this run has none" -- train --dataset sprites --sprite-count 50 --holdout 0 --epochs 1 --no-run-dir --target-accuracy 0.9
expect 2 "--eval-every-steps evaluates the test set; this run has none" -- train --dataset sprites --sprite-count 50 --holdout 0 --epochs 1 --no-run-dir --eval-every-steps 2
expect 2 "^hint: drop --test-limit, or hold out a test set \(--holdout for sprite sets\)$" -- train --dataset sprites --sprite-count 50 --holdout 0 --epochs 1 --no-run-dir --test-limit 10
# A warm-up that spans the whole run: refused when given, a settings note when a recipe chose it
# (4 epochs of batch 256 on 270 training sprites: a few steps against its 100).
expect 2 "--warmup-steps 1000 spans the whole run \(64 steps: 1 epoch of 64\): the lr only reaches 6.4% of --lr 0.001, at the last step$" -- "${tiny[@]}" --warmup-steps 1000
expect 0 "warm-up +--recipe fast's 100 warm-up steps span the whole run \([0-9]+ steps: 4 epochs of [0-9]+\): the lr only reaches [0-9.]+% of --lr 0.01, at the last step \(--warmup-steps sets the warm-up\)" -- train --device cpu --dataset sprites --sprite-count 300 --recipe fast --first-conv learned --no-run-dir
# Weights from import have no optimizer state to resume; their test-time flips survive the trip.
"$bin" export --checkpoint "$tmp/s.pt" "$tmp/s_x.safetensors" --overwrite >/dev/null 2>&1
"$bin" import "$tmp/s_x.safetensors" "$tmp/s_imported.pt" --overwrite >/dev/null 2>&1
"$bin" train --dataset sprites --sprite-count 64 --size 16 --model cnn --epochs 1 --test-time-augment flip --no-run-dir --save "$tmp/tta.pt" >/dev/null 2>&1
"$bin" export --checkpoint "$tmp/tta.pt" "$tmp/tta.safetensors" >/dev/null 2>&1
"$bin" import "$tmp/tta.safetensors" "$tmp/tta_back.pt" >/dev/null 2>&1
"$bin" export --checkpoint "$tmp/tta_back.pt" "$tmp/tta_again.safetensors" >/dev/null 2>&1
check "export -> import -> export keeps test_time_augment" python3 -c "
import json, struct
b = open('$tmp/tta_again.safetensors', 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
meta = json.loads(json.loads(b[8:8 + n])['__metadata__']['spritetorch'])
assert meta.get('test_time_augment') == 'flip', meta"
expect 2 "s_imported.pt: expected a checkpoint written by train, with the optimizer state a run continues from, found weights imported from $tmp/s_x.safetensors" -- train --dataset dummy --model simplenn --epochs 3 --resume "$tmp/s_imported.pt" --no-run-dir

# Output that could not be written is no success: a --json summary lost on a full device exits 1
# with the reason; a file-size limit (ulimit -f) fails the write with its reason instead of killing
# the process without a word (SIGXFSZ).
out=$("$bin" "${tiny[@]}" --json 2>&1 >/dev/full); rc=$?
if [ "$rc" = 1 ] && grep -q "^error: could not write the standard output" <<<"$out"; then
  passes=$((passes + 1))
else
  echo "FAIL: --json >/dev/full -> exit $rc: $out"; fails=$((fails + 1))
fi
out=$( (ulimit -f 1; "$bin" "${tiny[@]}" --save "$tmp/fsize.pt") 2>&1); rc=$?
# (the hint is the limit's, not "free some space")
if [ "$rc" = 1 ] && grep -q "^error: cannot write $tmp/fsize.pt: File too large" <<<"$out" && [ ! -e "$tmp/fsize.pt" ] &&
   grep -q "^hint: raise the file-size limit (ulimit -f)" <<<"$out"; then
  passes=$((passes + 1))
else
  echo "FAIL: --save under ulimit -f 1 -> exit $rc: $out"; fails=$((fails + 1))
fi

# Scripts around the CLI. A reader that closes the pipe early does not kill the run: it goes on
# and saves its checkpoint, and the closed pipe is no failure (SIGPIPE ignored, EPIPE handled).
out=$("$bin" train --device cpu --dataset dummy --model simplenn --epochs 3 --log-every 1 --no-run-dir \
  --save "$tmp/piped.pt" 2>&1 | head -1; echo "rc=${PIPESTATUS[0]}")
check "train | head -1: exit 0 and the checkpoint saved ($out)" \
  bash -c "grep -q 'rc=0' <<<'$out' && [ -s '$tmp/piped.pt' ]"
# A closed standard stream is held by /dev/null: nothing of the progress lands in metrics.jsonl.
"$bin" "${tiny[@]/--no-run-dir/--run-dir}" "$tmp/closed_out" >&- 2>/dev/null
check "train with stdout closed: metrics.jsonl holds JSON lines only" python3 -c "
import json
for line in open('$tmp/closed_out/metrics.jsonl'): json.loads(line)"
# --tensorboard on a run refused before it starts leaves neither events nor a folder.
: >"$tmp/taken.pt"
expect 2 "refusing to overwrite $tmp/taken.pt" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --tensorboard --save "$tmp/taken.pt" --runs-root "$tmp/tb_refused"
expect 2 "refusing to overwrite $tmp/taken.pt" -- train --device cpu --dataset dummy --model simplenn --epochs 1 --tensorboard --no-run-dir --save "$tmp/taken.pt" --runs-root "$tmp/tb_refused"
check "a refused --tensorboard run leaves nothing under its runs root" \
  bash -c "[ -z \"\$(find '$tmp/tb_refused' -mindepth 1 2>/dev/null)\" ]"
# Names that are not UTF-8 (file systems hold bytes) are replaced in JSON (U+FFFD), never an
# exception after the work; a tab in a file name is escaped in classify's tab-separated lines.
bad_name=$(printf "$tmp/r\xff")
expect 0 '"test_accuracy"' -- train --device cpu --dataset dummy --model simplenn --epochs 1 --run-dir "$bad_name" --json
check "summary.json of a run folder whose name is not UTF-8" test -s "$bad_name/summary.json"
expect 0 '"name":"r' -- runs --dir "$tmp" --json
cp "$tmp/one16/robot_0000.png" "$(printf "$tmp/tab\tand\xff.png")"
LC_ALL=C expect 0 "tab\\\\tand.*	[a-z]+	[01]\.[0-9]+" -- classify --checkpoint "$tmp/c_ann.pt" "$(printf "$tmp/tab\tand\xff.png")"
LC_ALL=C expect 0 '"file":".*tab\\tand' -- classify --checkpoint "$tmp/c_ann.pt" --json "$(printf "$tmp/tab\tand\xff.png")"
# --overwrite of a link replaces the file it leads to and keeps the link; a FIFO is written into.
ln -s "$tmp/one16.png" "$tmp/link.png"
expect 0 "Wrote " -- generate --checkpoint "$tmp/g.pt" --class robot --count 1 --steps 2 --out "$tmp/link.png" --overwrite
check "generate --out LINK --overwrite keeps the link" test -L "$tmp/link.png"
mkfifo "$tmp/sheet.fifo"
(head -c 8 "$tmp/sheet.fifo" >"$tmp/from_fifo") &
expect 0 "Wrote " -- generate --checkpoint "$tmp/g.pt" --class robot --count 1 --steps 2 --out "$tmp/sheet.fifo"
wait
check "generate --out FIFO writes a PNG into the pipe and leaves the FIFO" \
  bash -c "[ -p '$tmp/sheet.fifo' ] && head -c 4 '$tmp/from_fifo' | grep -q PNG"

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
