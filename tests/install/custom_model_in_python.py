#!/usr/bin/python3
"""examples/custom_model.cpp's own module, exported by the installed CLI, loaded into the same
module written in Python (README "Use it as a library"; docs/interop.md).

    python3 tests/install/custom_model_in_python.py TINY.safetensors

load_state_dict(strict=True) must take every tensor under the names the C++ module registered, and
the loaded net must classify bars drawn here (its own RNG, the example's recipe) as well as the
example's test (> 0.9). Exit 77 (skipped) without torch.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from python_roundtrip import read_safetensors
except ImportError:
    print("SKIP: python3-torch is not installed")
    sys.exit(77)


class TinyNet(nn.Module):  # examples/custom_model.cpp's TinyNetImpl: (B, 1, 12, 12) -> (B, 2)
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 6 * 6, 2)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


def bars(n, seed):  # class 0: a horizontal bar, class 1: a vertical one, over uint8 noise
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 60, (n, 1, 12, 12), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 2, (n,), generator=g)
    where = torch.randint(1, 11, (n,), generator=g)
    for i in range(n):
        k = int(where[i])
        if labels[i] == 0:
            images[i, 0, k, :] = 255
        else:
            images[i, 0, :, k] = 255
    return images, labels


def main():
    state, _ = read_safetensors(sys.argv[1])
    model = TinyNet()
    model.load_state_dict(state, strict=True)
    model.eval()
    images, labels = bars(1000, 123)
    with torch.no_grad():
        accuracy = (model(images.float() / 255).argmax(1) == labels).float().mean().item()
    print(f"{sys.argv[1]}: keys {sorted(state)}; accuracy in Python {accuracy:.3f}")
    if accuracy <= 0.9:
        sys.exit(f"FAIL: the exported weights classify {accuracy:.3f} of the bars in Python")
    print("PASS")


if __name__ == "__main__":
    main()
