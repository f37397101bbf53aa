#include "data/dataset.h"

namespace spritetorch::data {

Dataset Dataset::head(int64_t count) const {
  Dataset out = *this;
  const int64_t n = std::min(count, size());
  out.inputs = inputs.narrow(0, 0, n);
  out.labels = labels.narrow(0, 0, n);
  return out;
}

torch::Tensor to_model_input(const torch::Tensor& stored) {
  if (stored.scalar_type() == torch::kUInt8) return stored.to(torch::kFloat32).mul_(1.0f / 255.0f);
  return stored;
}

}  // namespace spritetorch::data
