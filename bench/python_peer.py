#!/usr/bin/env python3
"""The Python peer for `spritetorch bench --vs-python`: the seeds' Fashion-MNIST example as written
in seeds/004 (section 8) — ANN 784-128-64-10, Adam 1e-3, batch 64, shuffled torchvision DataLoader,
CrossEntropyLoss, loss.item() every step — with the plumbing a benchmark needs: the data comes from
a local folder of IDX files (no download), a --device flag, and a JSON timing line at the end.

--model cnn swaps in spritetorch's CNN (two 3x3 conv + ReLU + max-pool stages of 32 and 64
channels, fc 128, dropout 0.25: the same layers as `spritetorch train --model cnn`), written the
way a PyTorch tutorial writes it; the loop stays the seed's. --train-limit N trains on the first N
images only (a Subset), as spritetorch's --train-limit does; --test-limit N evaluates on the first
N test images, as spritetorch's --test-limit does (both for the recipes too).

--recipe mid is the same with FastCNN at 2x the channels (32/64/128), as `spritetorch train
--recipe mid`; --recipe wide at 4x (64/128/256) with a learned first convolution and random
2-pixel shifts besides the flips, as `spritetorch train --recipe wide`; --recipe long is wide's
loop with the whitened first convolution (spritetorch's 24 epochs arrive as --epochs, as every
recipe's do).

--recipe fast is `spritetorch train --recipe fast` written the way a PyTorch user who wants speed
writes it (tensors resident on the device, torch.randperm batches, channels_last): the same
FastCNN (three 3x3 conv + BatchNorm + ReLU + max-pool stages, one linear layer), batch 256, AdamW
with linear warm-up and cosine decay, label smoothing 0.1, random horizontal flips, test-time flip
averaging, bf16 autocast with --precision bf16. --batch-size, --lr and --warmup-steps change the
recipe's 256, 0.01 and 100 as spritetorch's flags of those names do. --target-accuracy X evaluates the test set after every epoch (and every
--eval-every-steps steps) outside the timed training and reports time_to_target_s; the schedule
runs to its end unless --stop-at-target.

Needs Python PyTorch, and torchvision for the seed's loop (Debian: apt-get install python3-torch
python3-torchvision).
Last line: {"train_s": ..., "total_s": ..., "accuracy": ..., "device": ..., "torch": ...}
"""
import argparse, gzip, json, math, os, shutil, tempfile, time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Subset

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


class FastCNN(nn.Module):
    def __init__(self, widths=(16, 32, 64)):
        super().__init__()
        a, b, c = widths
        self.conv1 = nn.Conv2d(1, a, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(a)
        self.conv2 = nn.Conv2d(a, b, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(b)
        self.conv3 = nn.Conv2d(b, c, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.max_pool2d(F.relu(self.bn3(self.conv3(x))), 2)
        return self.fc(x.flatten(1))


def idx_tensor(folder, name, offset):
    path = os.path.join(folder, name)
    data = open(path, "rb").read() if os.path.exists(path) else gzip.open(path + ".gz").read()
    return torch.frombuffer(bytearray(data[offset:]), dtype=torch.uint8)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def shift_batch(x, s):
    """Each image translated by its own random offset in [-s, s] in x and y, zeros filling in
    (spritetorch's --augment shift:s)."""
    b, c, h, w = x.shape
    padded = F.pad(x, (s, s, s, s))
    dy = torch.randint(0, 2 * s + 1, (b,), device=x.device)
    dx = torch.randint(0, 2 * s + 1, (b,), device=x.device)
    rows = (torch.arange(h, device=x.device) + dy[:, None])[:, None, :, None]
    cols = (torch.arange(w, device=x.device) + dx[:, None])[:, None, None, :]
    padded = padded.gather(2, rows.expand(b, c, h, w + 2 * s))
    return padded.gather(3, cols.expand(b, c, h, w))


# FastCNN's channels and spritetorch's model name for each recipe (src/train/recipe.cpp).
RECIPE_WIDTHS = {"fast": (16, 32, 64), "mid": (32, 64, 128), "wide": (64, 128, 256)}
RECIPE_MODELS = {"fast": "fastcnn", "mid": "fastcnn-2x", "wide": "fastcnn-wide"}
# long is wide's loop (whitened); its 24 epochs arrive as --epochs.
RECIPE_WIDTHS["long"], RECIPE_MODELS["long"] = RECIPE_WIDTHS["wide"], RECIPE_MODELS["wide"]
# The recipes whose first convolution is whitened and frozen (spritetorch's --first-conv whitened).
RECIPE_WHITENED = {"fast", "mid", "long"}
WHITENING_IMAGES = 5000  # the first this many training images (spritetorch's kWhiteningImages)


def whitening_filters(images, out, eps=5e-4):
    """spritetorch's models/patch_whitening.cpp: filters (out, C, 3, 3) whitening the 3x3 patches
    (zero padding 1) of images (N, C, H, W): the out/2 directions of largest variance v, largest
    first (repeating in order when out/2 exceeds their number), each with its largest component
    positive and divided by sqrt(v + eps), then their negatives."""
    c = images.shape[1]
    dims = c * 9
    total = torch.zeros(dims, dtype=torch.float64, device=images.device)
    products = torch.zeros(dims, dims, dtype=torch.float64, device=images.device)
    h, w = images.shape[2], images.shape[3]
    chunk = max(1, (4_000_000 if images.is_cuda else 80_000) // (h * w))
    for i in range(0, len(images), chunk):
        padded = F.pad(images[i:i + chunk].float().transpose(0, 1), (1, 1, 1, 1))  # (C, n, H+2, W+2)
        n = padded.shape[1]
        shifted = [padded[:, :, dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)]
        p = torch.stack(shifted, 1).reshape(dims, n, h * w).transpose(0, 1)  # (n, dims, patches)
        total += p.sum(2).double().sum(0)
        products += torch.bmm(p, p.transpose(1, 2)).double().sum(0)
    count = len(images) * h * w
    total, products = total.cpu(), products.cpu()
    mean = total / count
    cov = products / count - mean[:, None] * mean[None, :]
    values, vectors = torch.linalg.eigh(cov)
    half = out // 2
    kept = min(half, dims)
    top = vectors[:, dims - kept:].flip(1).t()
    top_values = values[dims - kept:].flip(0).clamp_min(0)
    if kept < half:  # more channels than directions: they repeat in order (i mod dims)
        repeat = torch.arange(half) % kept
        top, top_values = top[repeat], top_values[repeat]
    largest = top.abs().argmax(1, keepdim=True)
    top = top * top.gather(1, largest).sign()
    top = top / (top_values + eps).sqrt()[:, None]
    return torch.cat([top, -top]).float().reshape(out, c, 3, 3)


def run_fast(args, device, start):
    """The fast recipe (mid: 2x the channels; wide: 4x, flips and 2-pixel shifts); returns the JSON
    summary."""
    torch.manual_seed(args.seed)
    x_train = idx_tensor(args.data, RAW[0], 16).view(-1, 1, 28, 28).to(device).float().div_(255)
    y_train = idx_tensor(args.data, RAW[1], 8).to(device).long()
    x_test = idx_tensor(args.data, RAW[2], 16).view(-1, 1, 28, 28).to(device).float().div_(255)
    y_test = idx_tensor(args.data, RAW[3], 8).to(device).long()
    if args.train_limit > 0:
        x_train, y_train = x_train[:args.train_limit], y_train[:args.train_limit]
    if args.test_limit > 0:
        x_test, y_test = x_test[:args.test_limit], y_test[:args.test_limit]
    memory = torch.channels_last
    wide = args.recipe in ("wide", "long")  # 2-pixel shifts besides the flips
    widths = RECIPE_WIDTHS[args.recipe]
    model = FastCNN(widths).to(device, memory_format=memory)
    whiten_s = 0.0
    if args.recipe in RECIPE_WHITENED:  # from the first WHITENING_IMAGES training images, frozen
        # Untimed once on a few images (the device's lazy kernel loading), as spritetorch's bench
        # warms up through the same path; then timed, as spritetorch counts it: training time.
        whitening_filters(x_train[:64], widths[0])
        sync(device)
        clock = time.time()
        with torch.no_grad():
            model.conv1.weight.copy_(whitening_filters(x_train[:WHITENING_IMAGES], widths[0]))
        model.conv1.weight.requires_grad_(False)
        sync(device)
        whiten_s = time.time() - clock
    batch, epochs, lr = args.batch_size or 256, args.epochs, args.lr or 0.01
    steps_per_epoch = (len(x_train) + batch - 1) // batch
    total = epochs * steps_per_epoch
    warmup = 100 if args.warmup_steps is None else args.warmup_steps
    optimizer = optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                            weight_decay=0.05)
    schedule = optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup
        else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / max(total - warmup, 1)))))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    def evaluate():
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(x_test), 1000):
                x = x_test[i:i + 1000].contiguous(memory_format=memory)
                p = F.softmax(model(x), 1) + F.softmax(model(x.flip(3)), 1)
                correct += (p.argmax(1) == y_test[i:i + 1000]).sum().item()
        model.train()
        return correct / len(x_test)

    # Untimed warm-up on a throwaway copy (CUDA context, lazy kernel loading, autocast), as
    # spritetorch's bench warms up before its first seed.
    spare = FastCNN(widths).to(device, memory_format=memory)
    spare_optimizer = optim.AdamW(spare.parameters(), lr=lr, weight_decay=0.05)
    for i in range(min(5, (len(x_train) + batch - 1) // batch)):  # --train-limit may leave fewer
        x = x_train[i * batch:(i + 1) * batch].contiguous(memory_format=memory)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            warm_loss = criterion(spare(x).float(), y_train[i * batch:(i + 1) * batch])
        spare_optimizer.zero_grad(set_to_none=True)
        warm_loss.backward()
        spare_optimizer.step()
    del spare, spare_optimizer

    train_s, reached, evals, step = whiten_s, None, [], 0
    sync(device)
    clock = time.time()
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), device=device)
        for i in range(steps_per_epoch):
            pick = order[i * batch:(i + 1) * batch]
            x, y = x_train[pick], y_train[pick]
            flip = torch.rand(len(pick), 1, 1, 1, device=device) < 0.5
            x = torch.where(flip, x.flip(3), x)
            if wide:
                x = shift_batch(x, 2)
            x = x.contiguous(memory_format=memory)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                logits = model(x)
            loss = criterion(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            last = i + 1 == steps_per_epoch
            if last or (args.eval_every_steps and step % args.eval_every_steps == 0):
                sync(device)
                train_s += time.time() - clock
                accuracy = evaluate()
                evals.append({"step": step, "train_s": round(train_s, 3), "test_accuracy": accuracy})
                if last:
                    print(f"Epoch {epoch + 1}, test accuracy {accuracy:.4f}, {train_s:.2f} s", flush=True)
                if reached is None and args.target_accuracy and accuracy >= args.target_accuracy:
                    reached = {"time_to_target_s": round(train_s, 3), "target_step": step}
                sync(device)
                clock = time.time()
            if reached and args.stop_at_target:
                break
        if reached and args.stop_at_target:
            break
    accuracy = evals[-1]["test_accuracy"]
    out = {"train_s": round(train_s, 3), "total_s": round(time.time() - start, 3),
           "accuracy": accuracy, "device": str(device), "torch": torch.__version__,
           "model": RECIPE_MODELS[args.recipe], "recipe": args.recipe, "seed": args.seed, "precision": args.precision,
           "batch_size": batch, "lr": lr, "warmup_steps": warmup, "test_images": len(x_test),
           "evals": evals}
    if reached:
        out.update(reached)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", choices=["ann", "cnn"], default="ann")
    parser.add_argument("--train-limit", type=int, default=0, help="first N training images (0: all)")
    parser.add_argument("--test-limit", type=int, default=0, help="first N test images (0: all)")
    parser.add_argument("--recipe", choices=["seed", "fast", "mid", "wide", "long"], default="seed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: all cores)")
    parser.add_argument("--target-accuracy", type=float, default=0)
    parser.add_argument("--eval-every-steps", type=int, default=0)
    parser.add_argument("--stop-at-target", action="store_true")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="fast recipe: bf16 autocast (fp32 weights), as spritetorch's --precision bf16")
    parser.add_argument("--batch-size", type=int, help="recipes: images per step (default 256)")
    parser.add_argument("--lr", type=float, help="recipes: peak learning rate (default 0.01)")
    parser.add_argument("--warmup-steps", type=int, help="recipes: linear warm-up steps (default 100)")
    args = parser.parse_args()
    if args.recipe not in RECIPE_WIDTHS and (args.batch_size, args.lr, args.warmup_steps) != (None,) * 3:
        parser.error("--batch-size, --lr and --warmup-steps change a recipe; the seed's loop is "
                     "fixed (batch 64, Adam 1e-3)")
    if (args.batch_size is not None and args.batch_size < 1) or (args.lr is not None and args.lr <= 0) \
            or (args.warmup_steps is not None and args.warmup_steps < 0):
        parser.error("--batch-size >= 1, --lr > 0 and --warmup-steps >= 0")

    start = time.time()
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    print("Using:", device)
    if args.recipe in RECIPE_WIDTHS:
        # All cores, as spritetorch's conv nets use them (Debian's torch starts with one thread).
        torch.set_num_threads(args.threads or os.cpu_count())
        print(json.dumps(run_fast(args, device, start)))
        return

    from torchvision import datasets, transforms  # the seed's loop only: the recipes read IDX
    root = unpacked_root(args.data)
    to_tensor = transforms.ToTensor()
    train_set = datasets.FashionMNIST(root=root, train=True, transform=to_tensor, download=False)
    test_set = datasets.FashionMNIST(root=root, train=False, transform=to_tensor, download=False)
    if args.train_limit > 0:
        train_set = Subset(train_set, range(min(args.train_limit, len(train_set))))
    if args.test_limit > 0:
        test_set = Subset(test_set, range(min(args.test_limit, len(test_set))))
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
                      "model": args.model, "test_images": total}))


if __name__ == "__main__":
    main()
