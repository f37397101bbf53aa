// Activation checkpointing of the UNet's blocks: the same output and gradients as the plain
// forward (fp32, and bf16 autocast with the backward outside the autocast scope, as the Trainer
// runs it), the recomputing node really in the graph, and the option through the Trainer.
#include <gtest/gtest.h>

#include "common/error.h"
#include "diffusion/generator_task.h"
#include "diffusion/unet.h"
#include "precision/autocast_guard.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace spritetorch::diffusion {
namespace {

using spritetorch::testing::ScratchDir;

UNet make_net(bool checkpointing) {
  torch::manual_seed(5);
  UNetOptions o;
  o.base = 8;
  o.embed = 16;
  o.classes = 3;
  UNet net(o);
  {
    torch::NoGradGuard no_grad;
    net->out_conv->weight.normal_(0, 0.1);  // zero at init: no gradient would reach the blocks
  }
  net->set_activation_checkpointing(checkpointing);
  return net;
}

struct Pass {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // registration order
  bool checkpoint_node = false;      // the backward graph has the recomputing node
};

Pass forward_backward(UNet& net, bool bf16) {
  torch::manual_seed(6);
  const auto x = torch::randn({4, 4, 16, 16});
  const auto t = torch::tensor({0, 10, 200, 499}, torch::kInt64);
  const auto c = torch::tensor({0, 1, 2, 3}, torch::kInt64);
  const auto target = torch::randn({4, 4, 16, 16});
  net->zero_grad();
  Pass p;
  torch::Tensor loss;
  {
    std::optional<precision::AutocastGuard> autocast;
    if (bf16) autocast.emplace(c10::DeviceType::CPU, torch::kBFloat16);
    p.out = net->forward(x, t, c);
    loss = torch::mse_loss(p.out.to(torch::kFloat32), target);
  }
  p.checkpoint_node = spritetorch::testing::backward_graph_has(loss, "ActivationCheckpoint");
  loss.backward();  // outside the autocast scope, as in the Trainer
  for (const auto& param : net->parameters()) p.grads.push_back(param.grad().clone());
  return p;
}

void expect_same(const Pass& plain, const Pass& checkpointed, double rtol, double atol) {
  EXPECT_TRUE(torch::allclose(plain.out, checkpointed.out, rtol, atol));
  ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_GT(plain.grads[i].abs().max().item<double>(), 0) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(plain.grads[i], checkpointed.grads[i], rtol, atol))
        << "parameter " << i << ": max difference "
        << (plain.grads[i] - checkpointed.grads[i]).abs().max().item<double>();
  }
}

TEST(ActivationCheckpointing, SameGradientsAsThePlainForward) {
  auto plain_net = make_net(false), checkpointed_net = make_net(true);
  const auto plain = forward_backward(plain_net, false);
  const auto checkpointed = forward_backward(checkpointed_net, false);
  EXPECT_FALSE(plain.checkpoint_node);
  EXPECT_TRUE(checkpointed.checkpoint_node);
  // Only the order in which the shared embedding's gradients are summed may differ.
  expect_same(plain, checkpointed, 1e-5, 1e-7);
  // Without grad mode (sampling) the blocks run plainly.
  torch::NoGradGuard no_grad;
  const auto out =
      checkpointed_net->forward(torch::zeros({1, 4, 16, 16}), torch::zeros({1}, torch::kInt64),
                                torch::zeros({1}, torch::kInt64));
  EXPECT_FALSE(out.requires_grad());
}

TEST(ActivationCheckpointing, RecomputesUnderTheForwardsAutocast) {
  auto plain_net = make_net(false), checkpointed_net = make_net(true);
  const auto plain = forward_backward(plain_net, true);
  const auto checkpointed = forward_backward(checkpointed_net, true);
  EXPECT_TRUE(checkpointed.checkpoint_node);
  EXPECT_EQ(checkpointed.out.scalar_type(), torch::kBFloat16);
  // A recomputation in fp32 would differ from the bf16 forward by bf16's rounding (~1e-2).
  expect_same(plain, checkpointed, 1e-4, 1e-6);
}

train::TrainConfig tiny_run(const ScratchDir& dir, bool checkpointing, const std::string& save) {
  train::TrainConfig c;
  c.task = train::TaskKind::kGenerate;
  c.dataset = "sprites";
  c.sprites.count = 64;
  c.unet_base = 8;
  c.epochs = 1;
  c.batch_size = 16;
  c.device = "cpu";
  c.activation_checkpointing = checkpointing;
  c.save = dir.file(save);
  return c;
}

TEST(ActivationCheckpointing, ThroughTheTrainerGivesTheSameWeights) {
  ScratchDir dir;
  const auto plain = run_training(tiny_run(dir, false, "plain.pt"));
  const auto checkpointed = run_training(tiny_run(dir, true, "checkpointed.pt"));
  EXPECT_EQ(plain.steps, checkpointed.steps);
  EXPECT_NEAR(plain.epochs.at(0).loss, checkpointed.epochs.at(0).loss, 1e-6);
  const auto a = train::load_checkpoint(dir.file("plain.pt")),
             b = train::load_checkpoint(dir.file("checkpointed.pt"));
  ASSERT_EQ(a.model.size(), b.model.size());
  for (const auto& [name, t] : a.model)
    EXPECT_TRUE(torch::allclose(t, b.model.at(name), 1e-4, 1e-6)) << name;
}

}  // namespace
}  // namespace spritetorch::diffusion
