#include "data/dummy.h"

namespace spritetorch::data {

Dataset make_dummy_dataset(int64_t count, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Dataset out;
  out.inputs = at::randn({count, 3}, gen, torch::kFloat32);
  // The plane does not depend on the seed: train and test sets made with two seeds agree.
  auto plane_gen = at::make_generator<at::CPUGeneratorImpl>(0x5eed);
  auto normal = at::randn({3}, plane_gen, torch::kFloat32);
  out.labels = (out.inputs.matmul(normal) > 0.25).to(torch::kInt64);
  out.class_names = {"negative", "positive"};
  out.name = "dummy";
  return out;
}

}  // namespace spritetorch::data
