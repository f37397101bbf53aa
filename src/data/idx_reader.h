// Reader for the IDX files of MNIST and Fashion-MNIST, plain or gzip-compressed.
//
// IDX: bytes 0-1 zero, byte 2 the element type (0x08 = uint8, the only one these datasets use),
// byte 3 the number of dimensions, then one big-endian uint32 per dimension, then the elements.
#pragma once

#include <torch/torch.h>

#include <string>

namespace spritetorch::data {

// The most dimensions an IDX file (and its cache entry, data/idx_cache.h) may have.
constexpr int kIdxMaxDims = 4;

// Returns a uint8 tensor with the file's dimensions, e.g. (60000, 28, 28) for images.
// Throws DataError naming the file for a bad magic, a zero or oversized dimension, a truncated
// payload or trailing bytes. Allocates no more than the file really holds, whatever its header
// claims.
torch::Tensor read_idx(const std::string& path);

}  // namespace spritetorch::data
