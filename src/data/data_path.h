// Chooses how batches reach the device: resident (whole dataset on the device) or streaming
// (host dataset, worker threads, pinned memory, prefetching). Both yield identical batches for a
// seed, so the choice is about speed and memory only.
#pragma once

#include <memory>
#include <string>

#include "data/loader.h"
#include "data/streaming_loader.h"

namespace spritetorch::data {

struct DataPathOptions {
  std::string data_on = "auto";  // auto | device (resident) | host (streaming)
  // auto: resident when the dataset needs at most this share of free device memory
  double resident_share = 0.5;
  int workers = 2;      // streaming only
  int prefetch = 2;     // streaming only
  int pin_memory = -1;  // streaming only; -1 = on for CUDA, off elsewhere
};

struct DataPath {
  std::unique_ptr<Loader> loader;
  std::string description;  // "resident on cuda:0", "streaming: 2 workers, pinned, prefetch 2"
};

// Throws spritetorch::Error for an unknown data_on or a dataset that cannot be made resident.
DataPath make_data_path(const Dataset& dataset, torch::Device device, LoaderOptions loader,
                        const DataPathOptions& path);

}  // namespace spritetorch::data
