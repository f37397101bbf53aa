#include "tensorboard_output.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "distributed/dist_env.h"
#include "io/png.h"
#include "train/trainer.h"

namespace spritetorch::cli {

std::string tensorboard_dir(const std::string& run_folder, const std::string& runs_root) {
  if (!run_folder.empty()) return run_folder;
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d_%H-%M-%S", &local);
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0')
    std::snprintf(host, sizeof host, "localhost");
  return (std::filesystem::path(runs_root) / (std::string(stamp) + "_" + host)).string();
}

std::unique_ptr<report::EventWriter> open_tensorboard(const std::string& run_folder,
                                                      const std::string& runs_root) {
  const auto env = distributed::process_env();
  if (distributed::launched_as_rank(env) && distributed::read_dist_env(env).rank != 0)
    return nullptr;
  return std::make_unique<report::EventWriter>(tensorboard_dir(run_folder, runs_root));
}

constexpr int64_t kSampleImages = 64;

void log_training_samples(report::EventWriter& events, const data::Dataset& train) {
  const int64_t n = std::min<int64_t>(kSampleImages, train.size());
  const torch::Tensor images = train.inputs.slice(0, 0, n);  // (n, C, H, W) uint8
  if (images.dim() != 4 || images.scalar_type() != torch::kUInt8) return;
  torch::Tensor rgba;  // (N, 4, H, W): make_sheet's layout
  const int64_t channels = images.size(1);
  const auto opaque =
      torch::full({images.size(0), 1, images.size(2), images.size(3)}, 255, images.options());
  if (channels == 4)
    rgba = images;
  else if (channels == 3)
    rgba = torch::cat({images, opaque}, 1);
  else if (channels == 1)
    rgba = torch::cat({images, images, images, opaque}, 1);
  else
    return;
  events.add_image("data/train_samples",
                   io::make_sheet(rgba.cpu(), {/*columns=*/8, /*padding=*/1, /*scale=*/2}), 0);
}

}  // namespace spritetorch::cli
