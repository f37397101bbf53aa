#!/usr/bin/env bash
# --first-conv whitened is the same in spritetorch and in the Python peer (bench/python_peer.py
# `whitening_filters`), so that `bench --recipe fast --vs-python` times the same recipe; and the
# filters stay frozen through training: the exported conv1.weight of a trained run equals the
# Python filters of its training images. Needs a python3 with torch (no torchvision); skips (77)
# without one, and without the Fashion-MNIST files.
set -u
bin=$1
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPRITETORCH_RUNS_ROOT="$tmp/runs" XDG_CACHE_HOME="$tmp/cache"
data=/usr/share/datasets/fashion-mnist

python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c "import torch" 2>/dev/null; then python=$candidate; break; fi
done
if [ -z "$python" ] || [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: no python3 with torch, or no $data"
  exit 77
fi

# fast on 6,000 images: the filters take the first 5,000 (models::kWhiteningImages, the peer's
# WHITENING_IMAGES), so a count changed on one side only fails here. mid on 300: fewer than that,
# so the limit decides what they see. fast's fastcnn has 16 channels (8 of the 9 directions);
# fastcnn-2x 32 (the 9 repeated to 16).
for run in "fast 16 6000 5000" "mid 32 300 300"; do
  set -- $run
  if ! "$bin" train --recipe "$1" --first-conv whitened --epochs 1 --train-limit "$3" --test-limit 100 \
       --device cpu --no-run-dir --save "$tmp/$1.pt" >"$tmp/$1.log" 2>&1; then
    echo "FAIL: train --recipe $1 --first-conv whitened"; cat "$tmp/$1.log"; exit 1
  fi
  grep -q "first convolution  whitened 3x3 patches of the first $4 training images, frozen" "$tmp/$1.log" ||
    { echo "FAIL: the settings table does not name the whitened first convolution"; cat "$tmp/$1.log"; exit 1; }
  "$bin" export --checkpoint "$tmp/$1.pt" --format torch "$tmp/$1.pth" >/dev/null 2>&1 ||
    { echo "FAIL: export"; exit 1; }
  PYTHONPATH="$source_dir/bench" "$python" - "$tmp/$1.pth" "$data" "$2" "$3" <<'PY' || exit 1
import sys
import torch
import python_peer as peer

state = torch.load(sys.argv[1])
trained = peer.idx_tensor(sys.argv[2], peer.RAW[0], 16).view(-1, 1, 28, 28)[:int(sys.argv[4])]
images = trained[:peer.WHITENING_IMAGES].float() / 255
expected = peer.whitening_filters(images, int(sys.argv[3]))
got = state["conv1.weight"]
diff = (got - expected).abs().max().item()
scale = expected.abs().max().item()
print(f"{got.shape[0]} filters of conv1.weight against the peer's: max difference {diff:.3g} (largest weight {scale:.3g})")
if got.shape != expected.shape or not diff <= 1e-4 * scale:
    sys.exit("FAIL: spritetorch's whitened first convolution differs from the peer's")
PY
done
echo "whitening parity: ok"
