// Golden parity with PyTorch (llm.c's habit): tests/golden/make_seed_mlp_golden.py ran the seed
// network for one step in Python PyTorch and saved weights, batch, loss and gradients. Both of our
// step implementations must reproduce them within 1e-5.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "models/classifier.h"
#include "train/flat_optimizer.h"
#include "train/train_step.h"

namespace spritetorch::train {
namespace {

std::map<std::string, torch::Tensor> load_golden() {
  const std::string dir = std::string(SPRITETORCH_TEST_DIR) + "/golden/";
  std::ifstream index_file(dir + "seed_mlp_step.json");
  std::ifstream blob_file(dir + "seed_mlp_step.bin", std::ios::binary);
  if (!index_file || !blob_file) throw std::runtime_error("golden files missing in " + dir);
  const auto index = nlohmann::json::parse(index_file);
  const std::string blob((std::istreambuf_iterator<char>(blob_file)),
                         std::istreambuf_iterator<char>());
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : index.at("tensors")) {
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offset = entry.at("offset").get<size_t>();
    auto t = torch::empty(shape, torch::kFloat32);
    if (offset + t.nbytes() > blob.size()) throw std::runtime_error("golden blob too short");
    std::memcpy(t.data_ptr(), blob.data() + offset, t.nbytes());
    out[entry.at("name").get<std::string>()] = t;
  }
  return out;
}

void check_against_golden(const std::string& step_kind) {
  const auto golden = load_golden();
  auto model = models::make_model({"ann", {1, 28, 28}, 10});
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) p.value().copy_(golden.at("param." + p.key()));
  }
  FlatOptimizer optimizer(model->parameters(), {});  // allocates the gradients the steps fill
  auto step = make_train_step(model, 64, parse_choice<StepKind>(step_kind, "step"));
  data::Batch batch{golden.at("input"), golden.at("labels").to(torch::kInt64)};
  auto loss_sum = torch::zeros({});
  auto correct = torch::zeros({}, torch::kInt64);
  step->run(batch, loss_sum, correct);

  const double loss = loss_sum.item<double>() / 64.0;
  EXPECT_NEAR(loss, golden.at("loss").item<double>(), 1e-5) << step->name();
  for (auto& p : model->named_parameters()) {
    const auto& expected = golden.at("grad." + p.key());
    const double diff = (p.value().grad() - expected).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5) << step->name() << " gradient of " << p.key();
  }
}

TEST(GoldenSeedMlp, AutogradStepMatchesPyTorch) { check_against_golden("autograd"); }
TEST(GoldenSeedMlp, FusedStepMatchesPyTorch) { check_against_golden("fused"); }

}  // namespace
}  // namespace spritetorch::train
