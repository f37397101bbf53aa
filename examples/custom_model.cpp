// Your own model through spritetorch's trainer: a small conv net defined here (its conv stage
// recomputed in backward: activation checkpointing), on images made here, trained with bf16
// autocast, checkpointed, stopped after 12 steps and resumed.
// Exits 0 only when test accuracy > 0.9, the resumed run ends with the same weights as an
// uninterrupted one, and the settings say bf16 autocast ran.
#include <spritetorch/spritetorch.h>

#include <csignal>
#include <filesystem>
#include <iostream>

namespace st = spritetorch;

struct TinyNetImpl : torch::nn::Module {  // (B, 1, 12, 12) -> (B, 2) logits
  torch::nn::Conv2d conv{torch::nn::Conv2dOptions(1, 8, 3).padding(1)};
  torch::nn::Linear fc{8 * 6 * 6, 2};
  TinyNetImpl() { register_module("conv", conv), register_module("fc", fc); }
  torch::Tensor forward(torch::Tensor x) {
    // Keeps only x from forward to backward, and runs the stage again in backward.
    auto stage = [this](const torch::Tensor& in) {
      return torch::max_pool2d(torch::relu(conv(in)), 2);
    };
    return fc(st::models::checkpointed(*this, stage, x).flatten(1));
  }
};
TORCH_MODULE(TinyNet);
// The same initial weights for every run: the trainer's seed cannot reach a module built before.
TinyNet make_net() { return torch::manual_seed(42), TinyNet(); }

// Class 0: a horizontal bar, class 1: a vertical bar, at a random place, over noise. uint8 images.
st::data::Dataset bars(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  auto images = torch::randint(0, 60, {n, 1, 12, 12}).to(torch::kUInt8);
  auto labels = torch::randint(0, 2, {n}, torch::kInt64);
  const auto where = torch::randint(1, 11, {n});
  for (int64_t i = 0; i < n; ++i) {
    auto img = images[i][0];
    const int64_t k = where[i].item<int64_t>();
    (labels[i].item<int64_t>() == 0 ? img[k] : img.select(1, k)).fill_(255);
  }
  return {images, labels, {"horizontal", "vertical"}, "bars"};
}

int main() {
  const auto dir = std::filesystem::temp_directory_path() / "custom_model_example";
  std::filesystem::remove_all(dir), std::filesystem::create_directories(dir);
  const st::train::Datasets data{bars(2048, 1), bars(512, 2)};
  st::train::TrainConfig options;  // every trainer option; the model is ours
  options.device = "cpu", options.epochs = 3, options.batch_size = 32;
  options.precision = st::precision::Precision::kBf16;
  options.save = (dir / "tiny.pt").string();
  try {
    st::train::ClassifierTask task(make_net(), "tinynet");
    const auto report = st::train::Trainer(options).fit(task, data);
    std::string precision;
    for (const auto& [key, value] : report.settings)
      if (key == "precision") precision = value;
    std::cout << "test accuracy " << report.test.accuracy << "; precision: " << precision << "\n";

    // Stop after 12 steps (an observer asks, as SIGTERM would), then resume from the checkpoint.
    struct StopAt12 : st::train::TrainObserver {
      void on_step(const st::train::StepTick& t) override {
        if (t.epoch == 1 && t.step == 12) st::train::request_interrupt(SIGTERM);
      }
    } stop;
    auto again = options;
    again.save = (dir / "again.pt").string();
    std::string stopped_at;
    try {
      st::train::ClassifierTask stopped(make_net(), "tinynet");
      st::train::Trainer(again).fit(stopped, data, &stop);
    } catch (const st::train::Interrupted& e) {
      stopped_at = e.checkpoint();
    }
    again.resume = stopped_at;
    st::train::ClassifierTask resumed(make_net(), "tinynet");  // its weights come from the file
    st::train::Trainer(again).fit(resumed, data);
    const auto a = st::train::load_checkpoint(options.save).model;
    const auto b = st::train::load_checkpoint(again.save).model;
    bool same = !stopped_at.empty() && a.size() == b.size();
    for (const auto& [name, t] : a) same = same && torch::equal(t, b.at(name));
    std::cout << "resumed from " << stopped_at << ": " << (same ? "same" : "other") << " weights\n";
    const bool bf16 = precision.find("bf16") != std::string::npos;
    return report.test.accuracy > 0.9 && same && bf16 ? 0 : 1;
  } catch (const st::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
