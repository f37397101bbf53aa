#!/usr/bin/env python3
"""The Python peer for `spritetorch bench --vs-python`: the seeds' Fashion-MNIST example as written
in seeds/004 (section 8) — ANN 784-128-64-10, Adam 1e-3, batch 64, shuffled torchvision DataLoader,
CrossEntropyLoss, loss.item() every step — with the plumbing a benchmark needs: the data comes from
a local folder of IDX files (no download), a --device flag, and a JSON timing line at the end.

--model cnn swaps in spritetorch's CNN (two 3x3 conv + ReLU + max-pool stages of 32 and 64
channels, fc 128, dropout 0.25: the same layers as `spritetorch train --model cnn`), written the
way a PyTorch tutorial writes it; the loop stays the seed's. --train-limit N trains on the first N
images only (a Subset), as spritetorch's --train-limit does.

Needs Python PyTorch + torchvision (Debian: apt-get install python3-torch python3-torchvision).
Last line: {"train_s": ..., "total_s": ..., "accuracy": ..., "device": ..., "torch": ...}
"""
import argparse, gzip, json, os, shutil, tempfile, time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms

RAW = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def unpacked_root(src):
    """torchvision reads ROOT/FashionMNIST/raw/<unpacked IDX>; prepare that once under the temp dir."""
    root = os.path.join(tempfile.gettempdir(), "spritetorch-peer-fmnist")
    raw = os.path.join(root, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name in RAW:
        target = os.path.join(raw, name)
        if os.path.exists(target):
            continue
        plain = os.path.join(src, name)
        if os.path.exists(plain):
            shutil.copy(plain, target)
        else:
            with gzip.open(plain + ".gz", "rb") as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout)
    return root


class ANN(nn.Module):
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


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        self.dropout = nn.Dropout(0.25)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(self.dropout(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", choices=["ann", "cnn"], default="ann")
    parser.add_argument("--train-limit", type=int, default=0, help="first N training images (0: all)")
    args = parser.parse_args()

    start = time.time()
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    print("Using:", device)

    root = unpacked_root(args.data)
    to_tensor = transforms.ToTensor()
    train_set = datasets.FashionMNIST(root=root, train=True, transform=to_tensor, download=False)
    test_set = datasets.FashionMNIST(root=root, train=False, transform=to_tensor, download=False)
    if args.train_limit > 0:
        train_set = Subset(train_set, range(min(args.train_limit, len(train_set))))
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=64)

    model = (CNN() if args.model == "cnn" else ANN()).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=0.001)

    train_start = time.time()
    for epoch in range(args.epochs):
        model.train()
        total_loss = 0
        for features, labels in train_loader:
            features, labels = features.to(device), labels.to(device)
            outputs = model(features)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
        print(f"Epoch {epoch + 1}, Loss: {total_loss / len(train_loader):.4f}", flush=True)
    train_s = time.time() - train_start

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for features, labels in test_loader:
            features, labels = features.to(device), labels.to(device)
            _, predicted = torch.max(model(features), 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    print(f"Test Accuracy: {correct / total:.4f}")
    print(json.dumps({"train_s": round(train_s, 3), "total_s": round(time.time() - start, 3),
                      "accuracy": correct / total, "device": str(device), "torch": torch.__version__,
                      "model": args.model}))


if __name__ == "__main__":
    main()
