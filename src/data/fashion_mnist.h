// Fashion-MNIST (and MNIST, which shares the format) from a folder of IDX files, plain or .gz.
#pragma once

#include <string>

#include "data/dataset.h"
#include "data/idx_cache.h"

namespace spritetorch::data {

// Where Debian's dataset-fashion-mnist package puts the files.
inline const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { kTrain, kTest };

// Reads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. Images become (N, 1, 28, 28) uint8.
// Throws DataError when a file is missing, when image and label counts differ, or when a label is
// outside 0..9. `.gz` files go through `cache` (data/idx_cache.h; the default: none).
Dataset load_fashion_mnist(const std::string& dir, Split split, const IdxCache& cache = {});

// "T-shirt/top", "Trouser", ... "Ankle boot".
const std::vector<std::string>& fashion_mnist_classes();

}  // namespace spritetorch::data
