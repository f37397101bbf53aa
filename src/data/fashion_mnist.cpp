#include "data/fashion_mnist.h"

#include <filesystem>

#include "common/error.h"
#include "data/idx_reader.h"

namespace spritetorch::data {

namespace {

// What a missing folder or file asks for: the two files of the split being read, since eval reads
// the t10k files alone and training reads both splits.
std::string files_hint(const std::string& prefix) {
  return "install Debian's dataset-fashion-mnist, or point --data at a folder holding " + prefix +
         "-images-idx3-ubyte and " + prefix +
         "-labels-idx1-ubyte (plain or .gz; training reads the train- and the t10k- files, "
         "eval the t10k- files alone)";
}

std::string find_idx_file(const std::string& dir, const std::string& prefix,
                          const std::string& stem) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError(dir, "a folder holding Fashion-MNIST's " + prefix + " IDX files (--data)",
                    fs::exists(dir, ec) ? "a file" : "no such folder", files_hint(prefix));
  for (const auto& candidate : {stem, stem + ".gz"}) {
    const fs::path p = fs::path(dir) / candidate;
    if (fs::exists(p)) return p.string();
  }
  throw DataError((std::filesystem::path(dir) / stem).string(), "an IDX file (plain or .gz)",
                  "no such file", files_hint(prefix));
}

}  // namespace

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> kNames = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                  "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                  "Bag",         "Ankle boot"};
  return kNames;
}

Dataset load_fashion_mnist(const std::string& dir, Split split, const IdxCache& cache) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = find_idx_file(dir, prefix, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(dir, prefix, prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx_cached(images_path, cache);
  torch::Tensor labels = read_idx_cached(labels_path, cache);

  if (images.dim() != 3)
    throw DataError(images_path, "3 dimensions (N, rows, cols)", std::to_string(images.dim()));
  if (labels.dim() != 1)
    throw DataError(labels_path, "1 dimension (N)", std::to_string(labels.dim()));
  if (images.size(0) != labels.size(0))
    throw DataError(
        labels_path,
        std::to_string(images.size(0)) + " labels (as many as images in " + images_path + ")",
        std::to_string(labels.size(0)));
  const int64_t max_label = labels.max().item<uint8_t>();
  if (max_label >= static_cast<int64_t>(fashion_mnist_classes().size()))
    throw DataError(labels_path, "labels 0..9", "label " + std::to_string(max_label));

  Dataset out;
  out.inputs = images.unsqueeze(1);  // (N, 1, 28, 28) uint8
  out.labels = labels.to(torch::kInt64);
  out.class_names = fashion_mnist_classes();
  out.name = "fashion-mnist/" + prefix;
  return out;
}

}  // namespace spritetorch::data
