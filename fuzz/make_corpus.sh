#!/usr/bin/env bash
# Regenerates the committed seed corpora in fuzz/corpus/ (small valid inputs, one per feature, plus
# a few near misses). Seeds are inputs, not expectations: fuzzing only needs them to reach deep.
#   fuzz/make_corpus.sh BUILD_DIR     (a build with the spritetorch CLI, e.g. build)
set -euo pipefail
cd "$(dirname "$0")/.."
cli="${1:?usage: fuzz/make_corpus.sh BUILD_DIR}/spritetorch"
out=fuzz/corpus
rm -rf "$out/idx_fuzzer" "$out/idx_gz_fuzzer" "$out/checkpoint_fuzzer" "$out/checkpoint_payload_fuzzer" \
  "$out/png_fuzzer"
mkdir -p "$out/idx_fuzzer" "$out/idx_gz_fuzzer" "$out/checkpoint_fuzzer" "$out/checkpoint_payload_fuzzer" \
  "$out/png_fuzzer"

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

# PNGs of every colour type and bit depth read_png expands, written here with zlib (not by libpng).
python3 - "$out" <<'PY'
import struct, sys, zlib
out = sys.argv[1]
def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
def png(w, h, depth, colour, row_bytes, extra=b""):
    raw = b"".join(b"\x00" + bytes((r * 7 + i * 3) % 256 for i in range(row_bytes)) for r in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0))
            + extra + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
palette = chunk(b"PLTE", bytes(range(12))) + chunk(b"tRNS", b"\x00\xff")
seeds = {
    "grey-28x28": png(28, 28, 8, 0, 28),
    "rgba-16x16": png(16, 16, 8, 6, 64),
    "rgb-8x8": png(8, 8, 8, 2, 24),
    "grey-alpha-4x4": png(4, 4, 8, 4, 8),
    "grey16-3x3": png(3, 3, 16, 0, 6),
    "grey1-9x2": png(9, 2, 1, 0, 2),
    "palette-trns-4x4": png(4, 4, 2, 3, 1, palette),
    "sheet-rgba-35x18": png(35, 18, 8, 6, 140),
    "claims-60000x60000": png(60000, 60000, 8, 6, 4)[:200],
}
seeds["truncated"] = seeds["rgba-16x16"][:60]
for name, data in seeds.items():
    open(f"{out}/png_fuzzer/{name}", "wb").write(data)
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
