#!/usr/bin/env python3
"""Reads an event folder with TensorBoard's own EventAccumulator, the code behind
`tensorboard --logdir`. Prints one JSON line per scalar/image event: {"tag", "step", "value"} or
{"tag", "step", "width", "height", "png_bytes"}. Exit 77 (skip) when tensorboard is not installed
(Debian has no package; the GPU machine's pip environment has it).
"""
import json
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator as ea
except ImportError as e:
    print(f"skip: {e} (tensorboard is not installed for {sys.executable})", file=sys.stderr)
    sys.exit(77)

acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.IMAGES: 0})
acc.Reload()
tags = acc.Tags()
for tag in tags.get("scalars", []):
    for e in acc.Scalars(tag):
        print(json.dumps({"tag": tag, "step": e.step, "value": e.value}))
for tag in tags.get("images", []):
    for e in acc.Images(tag):
        print(json.dumps({"tag": tag, "step": e.step, "width": e.width, "height": e.height,
                          "png_bytes": len(e.encoded_image_string)}))
