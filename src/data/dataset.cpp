#include "data/dataset.h"

namespace spritetorch::data {

Dataset Dataset::head(int64_t count) const {
  Dataset out = *this;
  const int64_t n = std::min(count, size());
  out.inputs = inputs.narrow(0, 0, n);
  out.labels = labels.narrow(0, 0, n);
  return out;
}

Dataset Dataset::spread(int64_t count) const {
  const int64_t n = size();
  if (count >= n) return *this;
  // Sample i of `count` is floor(i * n / count): strictly increasing, as n > count.
  const torch::Tensor index =
      torch::arange(count, torch::kLong).mul_(n).div_(count, /*rounding_mode=*/"floor");
  Dataset out = *this;
  out.inputs = inputs.index_select(0, index.to(inputs.device()));
  out.labels = labels.index_select(0, index.to(labels.device()));
  return out;
}

torch::Tensor to_model_input(const torch::Tensor& stored) {
  if (stored.scalar_type() == torch::kUInt8) return stored.to(torch::kFloat32).mul_(1.0f / 255.0f);
  return stored;
}

}  // namespace spritetorch::data
