#include "data/dataset.h"

#include <algorithm>
#include <numeric>
#include <vector>

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
  // Each class's sample positions, in the set's order.
  const torch::Tensor cpu_labels = labels.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t* label = cpu_labels.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> by_class;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(label[i] >= 0, "Dataset::spread: negative label ", label[i]);
    if (label[i] >= static_cast<int64_t>(by_class.size()))
      by_class.resize(static_cast<size_t>(label[i]) + 1);
    by_class[static_cast<size_t>(label[i])].push_back(i);
  }
  std::vector<const std::vector<int64_t>*> present;  // the classes the set has, in label order
  for (const auto& members : by_class)
    if (!members.empty()) present.push_back(&members);
  const auto classes = static_cast<int64_t>(present.size());
  std::vector<int64_t> take(present.size(), 0);  // samples kept of each present class
  if (count < classes) {
    // Fewer samples than classes: one sample of each of `count` classes at even steps over them.
    for (int64_t i = 0; i < count; ++i) take[static_cast<size_t>(i * classes / count)] = 1;
  } else {
    // One of every class, and the rest shared in proportion to what each class has beyond it,
    // by largest remainders (ties to the earlier class). A share never exceeds what is left, as
    // rest < n - classes.
    const int64_t rest = count - classes, beyond = n - classes;
    std::vector<int64_t> remainder(present.size());
    int64_t given = 0;
    for (size_t c = 0; c < present.size(); ++c) {
      const int64_t quota = rest * (static_cast<int64_t>(present[c]->size()) - 1);
      take[c] = 1 + quota / beyond;
      remainder[c] = quota % beyond;
      given += quota / beyond;
    }
    std::vector<size_t> order(present.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
    for (int64_t k = 0; k < rest - given; ++k) ++take[order[static_cast<size_t>(k)]];
  }
  // A class's k samples at even steps over it (sample j of m: floor(j * m / k)), and the whole
  // in the set's order, so a set ordered by class stays so.
  std::vector<int64_t> keep;
  keep.reserve(static_cast<size_t>(count));
  for (size_t c = 0; c < present.size(); ++c) {
    const auto m = static_cast<int64_t>(present[c]->size());
    for (int64_t j = 0; j < take[c]; ++j)
      keep.push_back((*present[c])[static_cast<size_t>(j * m / take[c])]);
  }
  std::sort(keep.begin(), keep.end());
  const torch::Tensor index = torch::tensor(keep, torch::kLong);
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
