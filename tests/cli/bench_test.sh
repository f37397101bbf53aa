#!/usr/bin/env bash
# `spritetorch bench`: what it refuses before any row runs (exit 2, naming the option), where its
# files go, and a peer whose result it cannot read. The real Python peer: python_peer_test.sh.
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPRITETORCH_RUNS_ROOT="$tmp/runs"
source "$(dirname "$0")/expect.sh"

base=(bench --dataset dummy --model simplenn --devices cpu --epochs 1 --train-limit 256)
tiny=("${base[@]}" --repeats 1)

# A workload that train refuses is refused before the rows, not listed as rows that did not run.
expect 2 "cannot read --lr-schedule 'step:0'" -- "${tiny[@]}" --lr-schedule step:0 --out "$tmp/b"
expect 2 "cannot read --lr-schedule 'bogus'" -- "${tiny[@]}" --lr-schedule bogus --out "$tmp/b"
expect 2 "unknown augmentation 'rotate'" -- "${tiny[@]}" --augment rotate --out "$tmp/b"
expect 2 "--augment flip needs image data; dummy holds feature vectors" -- "${tiny[@]}" --augment flip --out "$tmp/b"
expect 2 "--lr: '-1' is not a number > 0" -- "${tiny[@]}" --lr -1 --out "$tmp/b"
expect 2 "--workers: '-1' is not a number from 0 to 256" -- "${tiny[@]}" --workers -1 --out "$tmp/b"
expect 2 "--workers: '99999' is not a number from 0 to 256" -- "${tiny[@]}" --workers 0,99999 --out "$tmp/b"
# --out names the files; a folder would get hidden '.json' and '.csv' files inside it.
mkdir -p "$tmp/outdir"
expect 2 "--out $tmp/outdir/ is a folder; it names the files \(OUT.json, OUT.csv\)" -- "${tiny[@]}" --out "$tmp/outdir/"
expect 2 "--out $tmp/outdir is a folder" -- "${tiny[@]}" --out "$tmp/outdir"
expect 2 "--step-threads splits the fused CPU step of ReLU MLPs; this bench's step is autograd" -- \
  "${tiny[@]}" --step autograd --step-threads 3 --out "$tmp/b"
expect 2 "needs image data; dummy holds feature vectors" -- \
  bench --dataset dummy --recipe fast --devices cpu --epochs 1 --repeats 1 --out "$tmp/b"
# Counts are never negative; --warmup-steps 0 is none.
expect 2 "--train-limit: '-5' is not a number >= 0" -- "${tiny[@]}" --train-limit -5 --out "$tmp/b"
expect 2 "--threads: '-2' is not a thread count from 0 to" -- "${tiny[@]}" --threads -2 --out "$tmp/b"
expect 2 "--warmup-steps: '-3' is not a number >= 0" -- "${tiny[@]}" --warmup-steps -3 --out "$tmp/b"
expect 0 "Wrote .*w0.json" -- "${tiny[@]}" --no-streaming --warmup-steps 0 --out "$tmp/w0"
if [ -s "$tmp/b.json" ] || [ -s "$tmp/b.csv" ]; then
  echo "FAIL: a refused bench wrote its files"; fails=$((fails + 1)); else passes=$((passes + 1)); fi

# --out: a folder that is not there is refused before any work, in both modes.
expect 2 "cannot write /nonexistent/dir/x.json \(given as --out\): the folder /nonexistent/dir does not exist" -- \
  "${tiny[@]}" --no-streaming --out /nonexistent/dir/x
expect 2 "the folder /nonexistent/dir does not exist" -- \
  "${base[@]}" --target-accuracy 0.5 --seeds 1 --out /nonexistent/dir/x
expect 2 "refusing to overwrite .*w0.json" -- "${tiny[@]}" --no-streaming --out "$tmp/w0"

# What one mode does not use is refused, not dropped.
target=("${base[@]}" --target-accuracy 0.5 --seeds 1 --out "$tmp/t")
for option in "--workers 2" "--no-streaming" "--cuda-graphs" "--repeats 2" "--warmup-steps 5"; do
  # shellcheck disable=SC2086
  expect 2 "--target-accuracy trains each seed once .*; it does not use ${option%% *}" -- "${target[@]}" $option
done
expect 2 "--target-accuracy trains at one precision; --precisions names 2" -- "${target[@]}" --precisions fp32,bf16
expect 2 "^error: --seeds only apply with --target-accuracy" -- "${tiny[@]}" --seeds 2 --out "$tmp/b"
expect 2 "^error: --eval-every-steps only apply with --target-accuracy" -- "${tiny[@]}" --eval-every-steps 5 --out "$tmp/b"
expect 2 "^error: --python --python-peer only apply with --vs-python" -- "${tiny[@]}" --python python3 --python-peer p.py --out "$tmp/b"
expect 2 "--workers sets the streaming rows; --no-streaming leaves none" -- "${tiny[@]}" --no-streaming --workers 2 --out "$tmp/b"
expect 2 "--data names the Fashion-MNIST folder; --dataset dummy does not read it" -- "${tiny[@]}" --data /nonexistent/folder --out "$tmp/b"
# Options that no row can run with: a usage error after the table, and no files.
expect 2 "no row of this bench ran: --first-conv whitened sets a model's first convolution" -- "${tiny[@]}" --no-streaming --first-conv whitened --out "$tmp/b"
expect 2 "each row above says why it did not run" -- "${tiny[@]}" --no-streaming --precisions fp16 --out "$tmp/b"
# A config file that --print-config wrote lists every option, defaults included: it replays.
"$bin" "${target[@]}" --print-config >"$tmp/target.toml"
expect 0 "Wrote .*replay_t.json" -- bench --config "$tmp/target.toml" --out "$tmp/replay_t"
"$bin" "${tiny[@]}" --no-streaming --print-config >"$tmp/plain.toml"
expect 0 "Wrote .*replay_p.json" -- bench --config "$tmp/plain.toml" --out "$tmp/replay_p"
# A value it sets that the mode does not use is refused all the same.
sed 's/^workers = .*/workers = [1]/' "$tmp/target.toml" >"$tmp/target_workers.toml"
expect 2 "it does not use --workers" -- bench --config "$tmp/target_workers.toml" --out "$tmp/replay_t2"

# --vs-python sets the peer against the resident fp32 row: a table without one is refused.
expect 2 "--precisions has no fp32" -- bench --vs-python --precisions bf16 --devices cpu --out "$tmp/g"

# A peer whose last line lacks a field the bench reads fails as a peer: the bench's files are
# still written, and it exits 1 (a script must not read the comparison as made). Fake
# interpreters stand in for python3 (they ignore the script and its options).
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  printf '#!/bin/sh\necho %s\n' "'{\"accuracy\": 0.8, \"torch\": \"fake\"}'" >"$tmp/peer_no_time"
  printf '#!/bin/sh\necho %s\n' "'{\"accuracy\": \"x\", \"torch\": 3, \"train_s\": \"slow\"}'" >"$tmp/peer_text"
  chmod +x "$tmp/peer_no_time" "$tmp/peer_text"
  : >"$tmp/unused.py"  # a --python-peer that is no file is refused before the rows
  peer=(bench --vs-python --devices cpu --no-streaming --epochs 1 --repeats 1 --warmup-steps 1 --train-limit 256
        --python-peer "$tmp/unused.py")
  expect 1 "Python peer on cpu: failed \(its result has no positive numeric train_s\)" -- \
    "${peer[@]}" --python "$tmp/peer_no_time" --out "$tmp/pa"
  expect 1 "error: the Python peer failed in 1 of 1 run\(s\) \(see above\)" -- \
    "${peer[@]}" --python "$tmp/peer_text" --out "$tmp/pb"
  if [ -s "$tmp/pa.json" ] && [ -s "$tmp/pa.csv" ] && [ -s "$tmp/pb.json" ]; then passes=$((passes + 1)); else
    echo "FAIL: bench --vs-python with a failed peer did not write its files"; fails=$((fails + 1)); fi
  expect 1 "Python peer, seed 7: failed \(its result has no positive numeric train_s\)" -- \
    bench --recipe fast --target-accuracy 0.5 --seeds 1 --epochs 1 --train-limit 256 --vs-python --devices cpu \
    --python "$tmp/peer_text" --python-peer "$tmp/unused.py" --out "$tmp/pt"
  if [ -s "$tmp/pt.json" ]; then passes=$((passes + 1)); else
    echo "FAIL: bench --target-accuracy --vs-python with a failed peer did not write its file"; fails=$((fails + 1)); fi
fi

echo "bench: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
