#!/usr/bin/env python3
"""Writes the golden reference for tests/train/golden_test.cpp (in the manner of llm.c).

PyTorch's own numbers for one training step of the seed network (seeds/004, section 8):
initial weights, one batch of 64 Fashion-MNIST-shaped inputs, the mean cross-entropy loss and
every gradient. The C++ test loads them and must match within 1e-5, for both of spritetorch's
step implementations (autograd and fused).

Run with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_seed_mlp_golden.py
Writes seed_mlp_step.json (names, shapes, offsets) and seed_mlp_step.bin (float32, little-endian).
"""
import json, os
import torch
import torch.nn as nn

torch.manual_seed(20261122)


class ANN(nn.Module):  # the seed's, unchanged
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 128)
        self.fc2 = nn.Linear(128, 64)
        self.out = nn.Linear(64, 10)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = x.view(x.size(0), -1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.out(x)


model = ANN()
x = torch.randint(0, 256, (64, 1, 28, 28)).float() / 255.0  # what ToTensor makes of uint8 pixels
y = torch.randint(0, 10, (64,))
loss = nn.CrossEntropyLoss()(model(x), y)
loss.backward()

tensors = [("input", x), ("labels", y.float()), ("loss", loss.detach().reshape(1))]
for name, p in model.named_parameters():
    tensors.append(("param." + name, p.detach()))
for name, p in model.named_parameters():
    tensors.append(("grad." + name, p.grad))

here = os.path.dirname(os.path.abspath(__file__))
index, offset = [], 0
with open(os.path.join(here, "seed_mlp_step.bin"), "wb") as blob:
    for name, t in tensors:
        data = t.contiguous().to(torch.float32).numpy().astype("<f4").tobytes()
        blob.write(data)
        index.append({"name": name, "shape": list(t.shape), "offset": offset})
        offset += len(data)
with open(os.path.join(here, "seed_mlp_step.json"), "w") as f:
    json.dump({"torch": torch.__version__, "tensors": index}, f, indent=1)
print("loss", loss.item(), "bytes", offset)
