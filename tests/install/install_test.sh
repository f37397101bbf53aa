#!/usr/bin/env bash
# cmake --install into a scratch prefix, then build examples/ against it with
# find_package(spritetorch) and run the example; also checks the installed CLI and its completion.
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/spritetorch-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in bin/spritetorch lib/libspritetorch.a include/spritetorch/train/trainer.h \
         include/spritetorch/spritetorch.h \
         include/spritetorch/common/error.h include/spritetorch/interop/safetensors.h \
         lib/cmake/spritetorch/spritetorchConfig.cmake lib/cmake/spritetorch/spritetorchConfigVersion.cmake \
         lib/cmake/spritetorch/spritetorchTargets.cmake share/bash-completion/completions/spritetorch; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; cat "$work/install.log"; exit 1; }
done
grep -q '^spritetorch [0-9]' <<<"$("$prefix/bin/spritetorch" --version)" || { echo "FAIL: installed --version"; exit 1; }
grep -q 'complete -F _spritetorch spritetorch' "$prefix/share/bash-completion/completions/spritetorch"

# Installed headers name each other <spritetorch/...>: a user's own data/dataset.h, first on the
# include path, must not stand in for the library's.
if grep -rlE '#include "(common|config|data|device|diffusion|distributed|interop|io|models|precision|report|runs|tasks|train)/' \
     "$prefix/include/spritetorch"; then
  echo "FAIL: installed headers above include others by their short names"; exit 1
fi

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
mkdir -p "$work/shadow/include/data"
cat > "$work/shadow/include/data/dataset.h" <<'HEADER'
#pragma once
namespace game { struct Dataset { int levels = 3; }; }
HEADER
cat > "$work/shadow/main.cpp" <<'SOURCE'
#include "data/dataset.h"  // the game's own
#include <spritetorch/train/trainer.h>
int main() { return game::Dataset{}.levels == 3 && spritetorch::train::TrainConfig{}.epochs > 0 ? 0 : 1; }
SOURCE
cat > "$work/shadow/CMakeLists.txt" <<'PROJECT'
cmake_minimum_required(VERSION 3.18)
project(shadow CXX)
find_package(spritetorch REQUIRED)
add_executable(shadow main.cpp)
target_include_directories(shadow PRIVATE include)
target_link_libraries(shadow PRIVATE spritetorch::spritetorch)
PROJECT
cmake -S "$work/shadow" -B "$work/shadow/build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  > "$work/shadow.log" 2>&1 && cmake --build "$work/shadow/build" >> "$work/shadow.log" 2>&1 \
  && "$work/shadow/build/shadow" || { echo "FAIL: a user's own data/dataset.h beside the package"; cat "$work/shadow.log"; exit 1; }
cmake -S "$source_dir/examples" -B "$work/examples" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
grep -q "$prefix" "$work/examples/CMakeCache.txt"  # it found the installed package, not the source tree
cmake --build "$work/examples" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/examples/train_and_export" "$work/simplenn.safetensors"
[ -s "$work/simplenn.safetensors" ]
# The user's own module through the trainer: accuracy, bf16 autocast, stop + resume = one run.
TMPDIR="$work" "$work/examples/custom_model"  # writes $work/custom_model_example/tiny.pt
# Its module's weights through the installed CLI's export, into the same module written in Python
# (load_state_dict strict, and it must classify as it did in C++); skipped without python3-torch.
"$prefix/bin/spritetorch" export --checkpoint "$work/custom_model_example/tiny.pt" "$work/tiny.safetensors" \
  | grep -q "model 'tinynet', 4 tensors"
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3 || true)
if [ -n "$python" ] && "$python" -c 'import torch' 2> /dev/null; then
  "$python" "$source_dir/tests/install/custom_model_in_python.py" "$work/tiny.safetensors"
fi
echo "PASS: installed to $prefix, examples/ built with find_package(spritetorch) and ran"
