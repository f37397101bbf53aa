#!/usr/bin/env bash
# Every `train` option either takes effect for the task or is refused with exit 2 naming the option
# and the task (tasks/make_task.cpp, train/trainer.cpp). Effects are read from the settings table
# and the JSON summary; refusals from the message.
set -u
bin=$1
tmp=$(mktemp -d)
trap 'pkill -9 -P $$ 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/expect.sh"

gen_any_batch=(train --task generate --dataset sprites --sprite-count 48 --epochs 1 --unet-base 8
               --device cpu --no-run-dir --json)
gen=("${gen_any_batch[@]}" --batch-size 16)
cls=(train --task classify --dataset dummy --model simplenn --epochs 1 --device cpu --no-run-dir --json)

# --- the generator takes the trainer's options --------------------------------------------------
# (on a CPU without native bf16 the settings add a warning: "(no native bf16 on this device: ...)")
expect 0 '"precision":"bf16 autocast, fp32 weights( \(no native bf16 [^"]*\))?"' -- "${gen[@]}" --precision bf16
expect 0 '"precision":"[^"]*clip grad norm 0.5"' -- "${gen[@]}" --clip-grad-norm 0.5
expect 0 '"augment":"flip"' -- "${gen[@]}" --augment flip
expect 0 '"augment":"flip,shift 1' -- "${gen[@]}" --augment flip,shift:1
expect 0 '"data path":"streaming: 2 workers' -- "${gen[@]}" --data-on host --workers 2
expect 0 '"optimizer":"sgd lr 0.01' -- "${gen[@]}" --optimizer sgd --lr 0.01 --momentum 0.9
expect 0 '"test_loss":' -- "${gen[@]}" --eval-every 1
expect 0 '"threads":"1 intra-op' -- "${gen[@]}" --threads 1
expect 0 '"steps":2,' -- "${gen[@]}" --train-limit 32
expect 0 '"test":\{"loss":[0-9.e-]+,"samples":3\}' -- "${gen[@]}" --test-limit 3
expect 0 '"step":"autograd"' -- "${gen[@]}" --step autograd
expect 0 '"step":"autograd \(4 micro-batches a batch\)"' -- "${gen[@]}" --micro-batches 4
expect 0 '"model":"unet base 8 x [0-9,]+ \([0-9]+ parameters, attention, scale-shift norms, activation checkpointing\)"' -- "${gen[@]}" --activation-checkpointing
expect 0 '"model":"unet base 8 x [0-9,]+ \([0-9]+ parameters, scale-shift norms\)"' -- "${gen[@]}" --unet-attention 0
expect 0 '"model":"unet base 8 x [0-9,]+ \([0-9]+ parameters\)"' -- "${gen[@]}" --unet-attention 0 --unet-scale-shift 0
expect 0 '"model":"unet base 8 x [0-9,]+ \([0-9]+ parameters, attention at S/2 and S/4, scale-shift' -- "${gen[@]}" --unet-attention 2
expect 2 "--unet-attention 3: expected 0 \(none\), 1 \(at S/4\) or 2 \(at S/4 and S/2\)" -- "${gen[@]}" --unet-attention 3
# --unet-mult widens the lower levels: base 8 x 1,2,4 holds more parameters than x 1,1,1.
p111=$("$bin" "${gen[@]}" --unet-mult 1,1,1 | sed -n 's/.*"model":"unet base 8 x 1,1,1 (\([0-9]*\) parameters.*/\1/p')
p124=$("$bin" "${gen[@]}" --unet-mult 1,2,4 | sed -n 's/.*"model":"unet base 8 x 1,2,4 (\([0-9]*\) parameters.*/\1/p')
if [[ -z "$p111" || -z "$p124" || "$p124" -le "$p111" ]]; then
  echo "FAIL: --unet-mult 1,2,4 ($p124 parameters) should hold more than 1,1,1 ($p111)"; fails=$((fails + 1))
fi
expect 2 "--unet-mult: '1,2': expected three whole numbers" -- "${gen[@]}" --unet-mult 1,2
expect 2 "--unet-mult: '1,0,2': expected three whole numbers" -- "${gen[@]}" --unet-mult 1,0,2
# Checked while parsing: --print-config does not write a value the run would refuse.
expect 2 "--unet-mult: 'a': expected three whole numbers" -- train --task generate --unet-mult a --print-config
expect 0 '"task":"generate \(predicts eps, min-SNR gamma off' -- "${gen[@]}" --prediction eps --min-snr-gamma 0
expect 0 '"task":"generate \(predicts x0, min-SNR gamma 5' -- "${gen[@]}" --prediction x0
expect 0 '"schedule":"linear betas' -- "${gen[@]}" --noise-schedule linear

# ... and refuses what it cannot do, naming option and task.
expect 2 "--cuda-graphs cannot capture the step of task 'generate'" -- "${gen[@]}" --cuda-graphs
expect 2 "--model cnn does not apply to --task generate" -- "${gen[@]}" --model cnn
expect 2 "--step fused does not apply to --task generate" -- "${gen[@]}" --step fused
expect 2 "--step-threads does not apply to --task generate" -- "${gen[@]}" --step-threads 2
expect 2 "dp" -- "${gen[@]}" --strategy dp
expect 2 "--target-accuracy needs a task with an accuracy" -- "${gen[@]}" --target-accuracy 0.5
expect 2 "--label-smoothing does not apply to --task generate" -- "${gen[@]}" --label-smoothing 0.1
expect 2 "--test-time-augment flip does not apply to --task generate" -- "${gen[@]}" --test-time-augment flip
expect 2 "--first-conv whitened does not apply to --task generate" -- "${gen[@]}" --first-conv whitened
expect 2 "fp16 is not supported on the CPU" -- "${gen[@]}" --precision fp16

# --- generate's own options: bf16 sampling, and graphs that the CPU never uses ----------------------
expect 0 "Saved checkpoint" -- "${gen[@]}" --save "$tmp/g.pt"
expect 0 '"cuda_graphs":false,.*"precision":"bf16"' -- generate --checkpoint "$tmp/g.pt" --count 4 \
  --steps 2 --precision bf16 --device cpu --json --out "$tmp/bf16.png"
expect 0 '"precision":"fp32"' -- generate --checkpoint "$tmp/g.pt" --count 4 --steps 2 \
  --no-cuda-graphs --device cpu --precision fp32 --json --out "$tmp/eager.png"
expect 0 'note: --no-cuda-graphs has no effect on .*: CUDA graphs replay sampling on CUDA devices only' -- \
  generate --checkpoint "$tmp/g.pt" --count 4 --steps 2 --no-cuda-graphs --device cpu --out "$tmp/eager2.png"
# The default, auto: bf16 where `devices` says the CPU's native bf16 pays (bf16_auto), else fp32.
native=fp32
"$bin" devices --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(x.get("bf16_auto") for x in d["devices"] if x["device"].startswith("cpu")) else 1)' && native=bf16
expect 0 "\"precision\":\"$native\"" -- generate --checkpoint "$tmp/g.pt" --count 4 --steps 2 --device cpu --json --out "$tmp/auto.png"
expect 0 "Generated 4 sprites .*, $native \(auto\)" -- generate --checkpoint "$tmp/g.pt" --count 4 --steps 2 --device cpu --out "$tmp/auto.png" --overwrite
expect 2 "--precision: fp16 not in" -- generate --checkpoint "$tmp/g.pt" --precision fp16 --out "$tmp/x.png"
# channels_last sampling: said in the JSON and in the text, and a value that is not a bool refused.
expect 0 '"channels_last":true' -- generate --checkpoint "$tmp/g.pt" --count 4 --steps 2 --device cpu \
  --precision fp32 --channels-last true --json --out "$tmp/nhwc.png"
expect 0 '"channels_last":false' -- generate --checkpoint "$tmp/g.pt" --count 4 --steps 2 --device cpu \
  --precision fp32 --json --out "$tmp/nchw.png"
expect 0 "Generated 4 sprites .*, channels_last, alpha" -- generate --checkpoint "$tmp/g.pt" --count 4 \
  --steps 2 --device cpu --channels-last true --out "$tmp/nhwc.png" --overwrite
expect 2 "Could not convert: --channels-last = maybe" -- generate --checkpoint "$tmp/g.pt" \
  --channels-last maybe --out "$tmp/x.png"

# --- the classifier refuses the generator's options (and checkpoints only a CNN's stages) ----------
expect 2 "--sample-every does not apply to --task classify" -- "${cls[@]}" --sample-every 1
expect 2 "--micro-batches splits the autograd step's batches; this run's step is fused-mlp" -- "${cls[@]}" --step fused --micro-batches 2
expect 2 "--unet-base does not apply to --task classify" -- "${cls[@]}" --unet-base 32
expect 2 "--activation-checkpointing recomputes a CNN's convolution stages in backward; --model simplenn has none" -- "${cls[@]}" --activation-checkpointing
expect 0 '"model":"fastcnn \([0-9]+ parameters, activation checkpointing\)"' -- train --task classify --dataset sprites --sprite-count 48 --model fastcnn --epochs 1 --device cpu --no-run-dir --json --activation-checkpointing
expect 2 "--unet-attention does not apply to --task classify" -- "${cls[@]}" --unet-attention 0
expect 2 "--unet-scale-shift does not apply to --task classify" -- "${cls[@]}" --unet-scale-shift 0
expect 2 "--unet-mult does not apply to --task classify" -- "${cls[@]}" --unet-mult 1,2,4
expect 2 "--prediction does not apply to --task classify" -- "${cls[@]}" --prediction eps
expect 2 "--noise-schedule does not apply to --task classify" -- "${cls[@]}" --noise-schedule linear
expect 2 "--min-snr-gamma does not apply to --task classify" -- "${cls[@]}" --min-snr-gamma 1
expect 0 '"accuracy":' -- "${cls[@]}"

# --- the generator under ddp: two ranks on Gloo ---------------------------------------------------
if grep -qE "distributed \(c10d\) backends:.*\bgloo\b" <<<"$("$bin" devices)"; then
  expect 0 '"strategy":"ddp, rank 0 of 2, gloo' -- launch --nproc-per-node 2 -- "${gen_any_batch[@]}" \
    --strategy ddp --batch-size 8 --threads 1 --save "$tmp/ddp.pt"
  # Rank 0's checkpoint is a generator that `generate` samples from.
  expect 0 "Wrote " -- generate --checkpoint "$tmp/ddp.pt" --count 4 --steps 2 --out "$tmp/ddp.png"
else
  echo "skipped the ddp checks: this build has no Gloo backend"
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
