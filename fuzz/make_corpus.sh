#!/usr/bin/env bash
# Regenerates the committed seed corpora in fuzz/corpus/ (small valid inputs, one per feature, plus
# a few near misses). Seeds are inputs, not expectations: fuzzing only needs them to reach deep.
#   fuzz/make_corpus.sh BUILD_DIR     (a build with the spritetorch CLI, e.g. build)
set -euo pipefail
cd "$(dirname "$0")/.."
cli="${1:?usage: fuzz/make_corpus.sh BUILD_DIR}/spritetorch"
out=fuzz/corpus
rm -rf "$out/idx_fuzzer" "$out/idx_gz_fuzzer" "$out/checkpoint_fuzzer" "$out/checkpoint_payload_fuzzer"
mkdir -p "$out/idx_fuzzer" "$out/idx_gz_fuzzer" "$out/checkpoint_fuzzer" "$out/checkpoint_payload_fuzzer"

python3 - "$out" <<'PY'
import gzip, struct, sys
out = sys.argv[1]
def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)
seeds = {
    "labels-5": idx([5], [0, 1, 2, 9, 3]),
    "images-2x4x4": idx([2, 4, 4], range(32)),
    "matrix-3x2": idx([3, 2], [7] * 6),
    "nchw-1x1x2x2": idx([1, 1, 2, 2], [1, 2, 3, 4]),
    "claims-1e9-images": idx([1000000000, 28, 28], range(16)),
    "truncated-3x3": idx([3, 3], range(5)),
    "int32-type": bytes([0, 0, 0x0c, 1, 0, 0, 0, 1, 0, 0, 0, 5]),
}
for name, data in seeds.items():
    open(f"{out}/idx_fuzzer/{name}", "wb").write(data)
    open(f"{out}/idx_fuzzer/{name}.gz", "wb").write(gzip.compress(data, mtime=0))
    open(f"{out}/idx_gz_fuzzer/{name}", "wb").write(data)
open(f"{out}/idx_fuzzer/gzip-truncated", "wb").write(gzip.compress(seeds["images-2x4x4"], mtime=0)[:20])
PY

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$cli" train --device cpu --model simplenn --dataset dummy --epochs 1 --checkpoint-every 40 \
  --save "$tmp/simplenn.pt" >/dev/null
"$cli" train --device cpu --model simplenn --dataset dummy --optimizer sgd --momentum 0.9 --epochs 1 \
  --save "$tmp/sgd.pt" >/dev/null
cp "$tmp/simplenn.pt" "$out/checkpoint_fuzzer/simplenn-final"
cp "$tmp/simplenn.step40.pt" "$out/checkpoint_fuzzer/simplenn-mid-run"
cp "$tmp/sgd.pt" "$out/checkpoint_fuzzer/simplenn-sgd"
head -c 40 "$tmp/simplenn.pt" > "$out/checkpoint_fuzzer/header-only"
for f in "$out"/checkpoint_fuzzer/simplenn-*; do
  tail -c +33 "$f" > "$out/checkpoint_payload_fuzzer/$(basename "$f")"  # the payload after the 32-byte header
done
du -sh "$out"/*
