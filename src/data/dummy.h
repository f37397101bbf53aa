// Seed 003's SimpleNN works on "dummy data": 3 features, 2 classes. Ours is random but learnable,
// so a run shows whether training works: the label is whether a fixed random hyperplane has the
// point on its positive side.
#pragma once

#include <cstdint>

#include "data/dataset.h"

namespace spritetorch::data {

// inputs: (count, 3) float32 ~ N(0, 1); labels: (count) int64 in {0, 1}. Same data for one seed.
Dataset make_dummy_dataset(int64_t count, uint64_t seed);

}  // namespace spritetorch::data
