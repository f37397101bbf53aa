#!/usr/bin/python3
"""A model written in Python, trained by spritetorch (`--model script:FILE`), back in Python.

    python3 tests/interop/torchscript_model.py path/to/spritetorch

Python (Debian's python3-torch) writes a small BatchNorm CNN with torch.jit.script and an MLP with
torch.jit.trace; spritetorch trains them on a slice of Fashion-MNIST, evaluates and classifies
with the checkpoint alone (the file removed), and exports the weights twice: as a TorchScript
module (torch.jit.load) and as safetensors (load_state_dict(strict=True) into the same class
written in Python). Both must classify the 10,000 test images as spritetorch's eval does. Bad
files and models that do not fit the data exit 2 with the file named. Exit 77 (ctest: skipped)
without torch or without the dataset.
"""
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("SKIP: python3-torch is not installed (apt-get install python3-torch; scripts/setup does)")
    sys.exit(77)

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
if not os.path.exists(os.path.join(FASHION_MNIST, "t10k-images-idx3-ubyte.gz")):
    print("SKIP: no Fashion-MNIST at " + FASHION_MNIST)
    sys.exit(77)

BIN = os.path.abspath(sys.argv[1])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(*args, expect=0):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    if p.returncode != expect:
        print(p.stdout[-2000:], p.stderr[-2000:])
    check(p.returncode == expect, " ".join(args[:3]) + f"... exits {expect} (got {p.returncode})")
    return p


class Net(nn.Module):  # the user's model: nothing of spritetorch's in it
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        return self.head(self.drop(self.features(x).flatten(1)))


def idx(name):
    data = gzip.open(os.path.join(FASHION_MNIST, name)).read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    dtypes = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
    out = {}
    for key, v in header.items():
        if key == "__metadata__":
            continue
        start, end = v["data_offsets"]
        out[key] = torch.frombuffer(bytearray(raw[8 + n + start:8 + n + end]),
                                    dtype=dtypes[v["dtype"]]).reshape(v["shape"])
    return out


def write_grey_png(path, pixels):  # pixels: (H, W) uint8
    h, w = pixels.shape
    rows = b"".join(b"\0" + bytes(pixels[r].tolist()) for r in range(h))
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data +
                                struct.pack(">I", zlib.crc32(kind + data)))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


images = idx("t10k-images-idx3-ubyte.gz").unsqueeze(1).float() / 255
labels = idx("t10k-labels-idx1-ubyte.gz").long()


def accuracy(model):
    model.eval()
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item()


with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    torch.manual_seed(0)
    torch.jit.script(Net()).save("net.pt")
    train = run("train", "--model", "script:net.pt", "--epochs", "2", "--train-limit", "6000",
                "--device", "cpu", "--save", "run.pt", "--no-run-dir", "--json")
    trained = json.loads(train.stdout)["test"]["accuracy"]
    check(trained > 0.75, f"the scripted CNN trains: test accuracy {trained:.4f} > 0.75")
    check("TorchScript net.pt" in train.stderr, "the settings name the TorchScript file")

    os.remove("net.pt")  # the checkpoint carries the model
    evaluated = json.loads(run("eval", "--checkpoint", "run.pt", "--json").stdout)["accuracy"]
    check(abs(evaluated - trained) < 1e-9, f"eval without net.pt: {evaluated:.4f}")

    run("export", "--checkpoint", "run.pt", "--format", "torchscript", "trained.pt", "--reference",
        "ref.safetensors")
    got = accuracy(torch.jit.load("trained.pt"))
    check(abs(got - evaluated) <= 5e-4, f"torch.jit.load of the export: {got:.4f} (eval {evaluated:.4f})")
    ref = read_safetensors("ref.safetensors")
    with torch.no_grad():
        gap = (torch.jit.load("trained.pt").eval()(ref["inputs"].float() / 255) - ref["logits"]).abs().max().item()
    check(gap < 1e-5, f"--reference logits against torch.jit.load's: max difference {gap:.2e}")

    # A module trained elsewhere (here: the export) is evaluated and checkpointed by --epochs 0.
    again = run("train", "--model", "script:trained.pt", "--epochs", "0", "--device", "cpu",
                "--save", "as_is.pt", "--no-run-dir", "--json")
    got = json.loads(again.stdout)["test"]["accuracy"]
    check(abs(got - evaluated) < 1e-9, f"train --epochs 0 of the export: {got:.4f}")

    run("export", "--checkpoint", "run.pt", "weights.safetensors")
    net = Net()
    net.load_state_dict(read_safetensors("weights.safetensors"), strict=True)
    got = accuracy(net)
    check(abs(got - evaluated) <= 5e-4, f"Net().load_state_dict(strict=True): {got:.4f}")

    # classify with the checkpoint: the same class as Python's model for a test image.
    write_grey_png("item.png", (images[0, 0] * 255).round().to(torch.uint8))
    line = run("classify", "--checkpoint", "run.pt", "item.png", "--json").stdout.splitlines()[0]
    with torch.no_grad():
        probabilities = net(images[:1]).softmax(1)[0]
    names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
             "Bag", "Ankle boot"]
    answer = json.loads(line)
    check(answer["class"] == names[probabilities.argmax().item()] and
          abs(answer["confidence"] - probabilities.max().item()) < 1e-4,
          f"classify item.png: {line[:100]} (Python: {names[probabilities.argmax().item()]}, "
          f"{probabilities.max().item():.6f})")

    # A traced MLP trains too, and resuming continues it.
    torch.jit.trace(nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10)),
                    torch.zeros(1, 1, 28, 28)).save("mlp.pt")
    run("train", "--model", "script:mlp.pt", "--epochs", "1", "--train-limit", "2000", "--device",
        "cpu", "--save", "mlp_run.pt", "--no-run-dir")
    resumed = run("train", "--resume", "mlp_run.pt", "--epochs", "2", "--train-limit", "2000",
                  "--device", "cpu", "--no-run-dir", "--json")
    check(json.loads(resumed.stdout)["test"]["accuracy"] > 0.6, "the traced MLP resumed to epoch 2")

    # bench times it (CPU against GPU where there is one); the Python peer runs its own models only.
    run("bench", "--model", "script:mlp.pt", "--train-limit", "1024", "--epochs", "1", "--repeats",
        "1", "--devices", "cpu", "--no-streaming", "--out", "bench")
    rows = json.load(open("bench.json"))["rows"]
    check(len(rows) == 1 and rows[0]["accuracy"] > 0.3, f"bench --model script:mlp.pt: {len(rows)} row(s)")
    bad = run("bench", "--model", "script:mlp.pt", "--vs-python", "--out", "bench2", expect=2)
    check("this bench differs: --model script:mlp.pt" in bad.stderr, "bench --vs-python is refused")

    # Bad input: the file named, exit 2, no trace.
    open("notes.txt", "w").write("not a model\n")
    bad = run("train", "--model", "script:notes.txt", "--no-run-dir", expect=2)
    check("notes.txt: expected a TorchScript module" in bad.stderr, "a text file: " + bad.stderr.strip()[:160])
    torch.jit.script(Net()).save("net.pt")
    bad = run("train", "--model", "script:net.pt", "--dataset", "sprites", "--no-run-dir", expect=2)
    check("net.pt: expected a forward that maps this dataset's (B, 4, 16, 16)" in bad.stderr and
          "Traceback" not in bad.stderr, "a model for other images: " + bad.stderr.strip()[:200])
    bad = run("train", "--model", "script:missing.pt", expect=2)
    check("missing.pt: expected a TorchScript file, found no such file" in bad.stderr,
          "a missing file: " + bad.stderr.strip()[:160])

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
