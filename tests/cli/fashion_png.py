#!/usr/bin/env python3
"""Writes the first Fashion-MNIST test image of class LABEL as an 8-bit grey PNG (for cli_test.sh).

Usage: fashion_png.py DATA_DIR LABEL OUT.png [--invert]
--invert writes 255 - v: a dark item on a light ground, what `classify --invert` undoes.
Standard library only (gzip, zlib, struct): the PNG is made here, not by spritetorch.
"""
import gzip
import struct
import sys
import zlib

data, label, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
invert = "--invert" in sys.argv[4:]
images = gzip.open(data + "/t10k-images-idx3-ubyte.gz").read()[16:]
labels = gzip.open(data + "/t10k-labels-idx1-ubyte.gz").read()[8:]
i = labels.index(bytes([label]))
pixels = images[i * 784:(i + 1) * 784]
if invert:
    pixels = bytes(255 - v for v in pixels)
raw = b"".join(b"\x00" + pixels[r * 28:(r + 1) * 28] for r in range(28))  # filter 0 per row


def chunk(kind, body):
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


with open(out, "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n")
    f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", 28, 28, 8, 0, 0, 0, 0)))  # 8-bit grey
    f.write(chunk(b"IDAT", zlib.compress(raw)))
    f.write(chunk(b"IEND", b""))
