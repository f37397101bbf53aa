// Activation checkpointing of any module (models/activation_checkpoint.h): the gradients, the
// BatchNorm statistics and the random-number stream of a plain step; less memory held from the
// forward to the backward; the refusals.
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/malloc_tuning.h"
#include "device/device.h"
#include "models/activation_checkpoint.h"
#include "test_util.h"

namespace spritetorch::models {
namespace {

namespace nn = torch::nn;

// conv, norm, ReLU, dropout twice, then a linear layer: parameters, buffers and random draws.
nn::Sequential make_net() {
  torch::manual_seed(3);
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 6, 3).padding(1)), nn::BatchNorm2d(6),
                        nn::ReLU(), nn::Dropout(0.3),
                        nn::Conv2d(nn::Conv2dOptions(6, 6, 3).padding(1)), nn::BatchNorm2d(6),
                        nn::ReLU(), nn::Dropout(0.3), nn::Flatten(), nn::Linear(6 * 8 * 8, 3));
}

struct Step {
  torch::Tensor out;
  std::vector<torch::Tensor> grads, buffers;  // registration order
  torch::Tensor next_draw;                    // the generator's next numbers after the step
  bool checkpoint_node = false;
};

// One forward and backward of `net` on a fixed batch (which needs no gradient itself), forward
// given as plain or checkpointed, on the device the net is on. What it returns is on the CPU.
Step step(nn::Sequential& net,
          const std::function<torch::Tensor(nn::Sequential&, const torch::Tensor&)>& forward) {
  const auto device = net->parameters().front().device();
  torch::manual_seed(11);  // every device's generator
  const auto x = torch::rand({5, 1, 8, 8}, device);
  const auto target = torch::tensor({0, 1, 2, 1, 0}, torch::kInt64).to(device);
  net->train();
  net->zero_grad();
  Step s;
  s.out = forward(net, x);
  s.checkpoint_node = spritetorch::testing::backward_graph_has(s.out, "ActivationCheckpoint");
  torch::nn::functional::cross_entropy(s.out, target).backward();
  s.next_draw = torch::rand({4}, device).cpu();
  s.out = s.out.detach().cpu();
  for (const auto& p : net->parameters()) s.grads.push_back(p.grad().cpu());
  for (const auto& b : net->buffers()) s.buffers.push_back(b.cpu());
  return s;
}

torch::Tensor plain(nn::Sequential& net, const torch::Tensor& x) { return net->forward(x); }

void expect_equal(const Step& a, const Step& b) {
  EXPECT_TRUE(torch::equal(a.out, b.out));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_GT(a.grads[i].abs().max().item<double>(), 0) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(a.grads[i], b.grads[i], 1e-6, 1e-8))
        << "parameter " << i << ": max difference "
        << (a.grads[i] - b.grads[i]).abs().max().item<double>();
  }
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i)
    EXPECT_TRUE(torch::equal(a.buffers[i], b.buffers[i])) << "buffer " << i;
  EXPECT_TRUE(torch::equal(a.next_draw, b.next_draw));
}

TEST(ActivationCheckpoint, SequentialSegmentsStepLikeThePlainForward) {
  auto a = make_net(), b = make_net();
  const Step reference = step(a, plain);
  EXPECT_FALSE(reference.checkpoint_node);
  for (const int64_t segments : {2, 3, 10}) {
    b = make_net();
    const Step result = step(b, [segments](nn::Sequential& net, const torch::Tensor& x) {
      return checkpointed_sequential(net, segments, x);
    });
    SCOPED_TRACE("segments " + std::to_string(segments));
    EXPECT_TRUE(result.checkpoint_node);
    // The same dropout masks, the running statistics updated once, and the generator where the
    // plain step left it.
    expect_equal(reference, result);
  }
}

// On a GPU the CUDA generator's state is kept too: the same dropout masks, the generator where
// the plain step left it.
TEST(ActivationCheckpointCuda, SequentialSegmentsStepLikeThePlainForward) {
  if (device::probe_availability().cuda_devices == 0) GTEST_SKIP() << "no CUDA device";
  auto a = make_net(), b = make_net();
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  const Step reference = step(a, plain);
  const Step result = step(b, [](nn::Sequential& net, const torch::Tensor& x) {
    return checkpointed_sequential(net, 3, x);
  });
  EXPECT_TRUE(result.checkpoint_node);
  expect_equal(reference, result);
}

// The segment is the net's second half, its module the whole net: the buffers of the first
// half's BatchNorm, which ran plainly and saved them for its backward, are put back untouched.
TEST(ActivationCheckpoint, AWholeModelAsTheModuleOfOneOfItsSegments) {
  auto a = make_net(), b = make_net();
  const Step reference = step(a, plain);
  auto run = [](nn::Sequential& net, int64_t begin, int64_t end, torch::Tensor h) {
    for (auto it = net->begin() + begin; it != net->begin() + end; ++it) h = it->forward(h);
    return h;
  };
  const Step result = step(b, [&run](nn::Sequential& net, const torch::Tensor& x) {
    const auto h = run(net, 0, 4, x);
    return checkpointed(
        *net, [&run, &net](const torch::Tensor& in) { return run(net, 4, 10, in); }, h);
  });
  EXPECT_TRUE(result.checkpoint_node);
  expect_equal(reference, result);
}

TEST(ActivationCheckpoint, WithoutTheForwardsRngStateDropoutDrawsAnotherMask) {
  auto a = make_net(), b = make_net();
  const Step reference = step(a, plain);
  CheckpointOptions options;
  options.preserve_rng = false;
  const Step result = step(b, [&options](nn::Sequential& net, const torch::Tensor& x) {
    return checkpointed(
        *net, [&net](const torch::Tensor& in) { return net->forward(in); }, x, options);
  });
  EXPECT_TRUE(torch::equal(reference.out, result.out));  // the forward itself is the same
  bool all_close = true;
  for (size_t i = 0; i < reference.grads.size(); ++i)
    all_close = all_close && torch::allclose(reference.grads[i], result.grads[i]);
  EXPECT_FALSE(all_close) << "the recomputation drew the forward's masks without its RNG state";
}

TEST(ActivationCheckpoint, SeveralInputsAndOutputsOnlyThoseUsedDifferentiated) {
  torch::manual_seed(4);
  nn::Linear layer(4, 4);
  const auto a = torch::randn({3, 4}, torch::requires_grad()), b = torch::randn({3, 4});
  // Three outputs: one the loss uses, one it does not, and an integer one.
  auto segment = [&layer](const std::vector<torch::Tensor>& in) {
    const auto h = torch::tanh(layer(in[0])) * in[1];
    return std::vector<torch::Tensor>{h.sum(1), torch::sigmoid(h), h.argmax(1)};
  };
  torch::Tensor plain_a_grad, plain_w_grad;
  {
    const auto out = segment({a, b});
    out[0].pow(2).sum().backward();
    plain_a_grad = a.grad().clone();
    plain_w_grad = layer->weight.grad().clone();
  }
  a.mutable_grad().reset();
  layer->zero_grad();
  const auto out = checkpointed(*layer, segment, {a, b});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].scalar_type(), torch::kInt64);
  EXPECT_FALSE(out[2].requires_grad());
  out[0].pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(a.grad(), plain_a_grad, 1e-6, 1e-8));
  EXPECT_TRUE(torch::allclose(layer->weight.grad(), plain_w_grad, 1e-6, 1e-8));
}

TEST(ActivationCheckpoint, WithoutGradModeRunsPlainly) {
  auto net = make_net();
  torch::NoGradGuard no_grad;
  const auto out = checkpointed_sequential(net, 3, torch::rand({2, 1, 8, 8}));
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(out.grad_fn(), nullptr);
}

TEST(ActivationCheckpoint, RefusesDoubleBackwardAndABadSegmentCount) {
  nn::Linear layer(3, 1);
  const auto x = torch::randn({2, 3}, torch::requires_grad());
  const auto y = checkpointed(
      *layer, [&layer](const torch::Tensor& in) { return torch::tanh(layer(in)); }, x);
  try {
    torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    ADD_FAILURE() << "a double backward went through a checkpointed segment";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differentiated twice"), std::string::npos) << e.what();
  }
  auto net = make_net();  // 10 modules
  for (const int64_t segments : {0, 11}) {
    try {
      checkpointed_sequential(net, segments, torch::rand({2, 1, 8, 8}));
      ADD_FAILURE() << segments << " segments were taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected 1 to 10"), std::string::npos) << e.what();
    }
  }
}

double heap_in_use_mb() { return static_cast<double>(heap_in_use_bytes()) / (1 << 20); }

// What a step keeps from the end of its forward to its backward: the point of checkpointing.
// Four blocks of three linear + ReLU pairs; checkpointed, each block keeps only its input.
TEST(ActivationCheckpoint, HoldsLessFromForwardToBackward) {
  if (heap_in_use_bytes() < 0) GTEST_SKIP() << "no heap statistics here (mallinfo2; ASan)";
  const int threads = at::get_num_threads();
  at::set_num_threads(1);  // one thread: every tensor from the main arena mallinfo2 counts
  torch::manual_seed(6);
  std::vector<nn::Sequential> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.push_back(nn::Sequential(nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 512),
                                    nn::ReLU(), nn::Linear(512, 512), nn::ReLU()));
  const auto x = torch::rand({512, 512});  // 1 MB, as each activation
  auto held_mb = [&](bool checkpointing) {
    for (auto& block : blocks) block->zero_grad();
    const double before = heap_in_use_mb();
    torch::Tensor h = x;
    for (auto& block : blocks)
      h = checkpointing
              ? checkpointed(
                    *block, [&block](const torch::Tensor& in) { return block->forward(in); }, h)
              : block->forward(h);
    const auto loss = h.square().mean();
    const double held = heap_in_use_mb() - before;
    loss.backward();
    return held;
  };
  held_mb(false);  // the gradients' own memory, allocated once
  const double plain = held_mb(false), kept = held_mb(true);
  at::set_num_threads(threads);
  // Plain: 12 activations of 1 MB. Checkpointed: the 3 later blocks' inputs and the output.
  EXPECT_GT(plain, 10.0);
  EXPECT_LT(kept, 0.5 * plain) << "plain " << plain << " MB, checkpointed " << kept;
}

}  // namespace
}  // namespace spritetorch::models
