// The `--recipe fast` CNN's CPU training step with and without the fused BatchNorm + ReLU +
// max-pool (models/bn_relu_pool.h), in the same process: the op alone at each of fastcnn's three
// stages, forward and backward; a stage's convolution alone, for scale; the first stage with its
// convolution (first_conv_bn_relu_pool); and the whole step
// (forward, backward, AdamW) at the recipe's batch of 256, in fp32 and under bf16 autocast; and
// what a step holds from forward to backward with and without activation checkpointing (`held`).
//
//   build/bench/fastcnn_step_bench                              # everything, LibTorch's threads
//   build/bench/fastcnn_step_bench --benchmark_filter=step --benchmark_repetitions=5
//
// Arguments: 1 for bf16 (autocast in the step), then 1 for the fused op, 0 for LibTorch's ops;
// the op and the convolution take the stage (0, 1, 2) first; the op and the step then 1 for
// channels_last (the fused op's NHWC form with the avx512 and avx2 code; elsewhere LibTorch's ops
// either way); the convolution and the step then take 1 for models/conv3x3.h's AVX2 kernels where
// they apply (fp32 channels_last on a CPU whose matrix kernel is avx2), 0 for LibTorch's; the first
// stage and the step take 1 for a frozen first convolution (`--first-conv whitened`, as the
// recipes train), the first stage then 1 for channels_last.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <array>

#include "common/malloc_tuning.h"
#include "conv_bench_main.h"
#include "models/bn_relu_pool.h"
#include "models/classifier.h"
#include "models/conv3x3.h"
#include "precision/autocast_guard.h"

namespace {

using namespace spritetorch;

// fastcnn's stages on a batch of 256 Fashion-MNIST images: (channels in, channels out, side).
constexpr int64_t kBatch = 256;
constexpr std::array<std::array<int64_t, 3>, 3> kStages = {
    {{1, 16, 28}, {16, 32, 14}, {32, 64, 7}}};

torch::ScalarType dtype_of(int64_t bf16) { return bf16 ? torch::kBFloat16 : torch::kFloat32; }

torch::MemoryFormat layout_of(int64_t channels_last) {
  return channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
}

// The norm + ReLU + pool of one stage on the convolution's output, forward and backward.
void op(benchmark::State& state) {
  const auto& stage = kStages[state.range(0)];
  models::set_bn_relu_pool_fusion(state.range(2) != 0);
  const auto layout = layout_of(state.range(3));
  torch::manual_seed(1);
  torch::nn::BatchNorm2d bn(stage[1]);
  const auto x = torch::randn({kBatch, stage[1], stage[2], stage[2]})
                     .to(dtype_of(state.range(1)))
                     .contiguous(layout)
                     .requires_grad_();
  const auto upstream = torch::randn({kBatch, stage[1], stage[2] / 2, stage[2] / 2})
                            .to(dtype_of(state.range(1)))
                            .contiguous(layout);
  for (auto _ : state) {
    models::bn_relu_pool(*bn, x).backward(upstream);
    benchmark::DoNotOptimize(x.grad().data_ptr());
  }
  models::set_bn_relu_pool_fusion(true);
}

// The same stage's 3x3 convolution, forward and backward (input and weight gradients; under bf16
// autocast for bf16), in either layout; with `own`, models/conv3x3.h's kernels where they apply
// (fp32 channels_last on an AVX2 CPU, from the second stage on), else LibTorch's (oneDNN's).
void conv(benchmark::State& state) {
  const auto& stage = kStages[state.range(0)];
  const bool bf16 = state.range(1) != 0;
  const auto layout = layout_of(state.range(2));
  models::set_conv3x3_kernel(state.range(3) != 0);
  torch::manual_seed(1);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(stage[0], stage[1], 3).padding(1).bias(false));
  {
    torch::NoGradGuard no_grad;
    conv->weight.set_data(conv->weight.contiguous(layout));
  }
  const auto x =
      torch::randn({kBatch, stage[0], stage[2], stage[2]}).contiguous(layout).requires_grad_();
  for (auto _ : state) {
    torch::Tensor y;
    {
      precision::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16, bf16);
      y = models::conv3x3(*conv, x);
    }
    y.backward(torch::ones_like(y));
    benchmark::DoNotOptimize(conv->weight.grad().data_ptr());
  }
  models::set_conv3x3_kernel(true);
}

// The first stage whole: the 1-channel images' convolution, norm, ReLU and pool, forward and
// backward; fused, or LibTorch's convolution (under bf16 autocast for bf16) and the other three;
// the convolution learned, or frozen as `--first-conv whitened` leaves it (no weight gradient);
// the output NCHW, or channels_last as the trainer asks for on CPUs with AVX2 or AVX-512.
void first(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  models::set_bn_relu_pool_fusion(state.range(1) != 0);
  torch::manual_seed(1);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 16, 3).padding(1).bias(false));
  conv->weight.set_requires_grad(state.range(2) == 0);
  torch::nn::BatchNorm2d bn(16);
  const auto x = torch::rand({kBatch, 1, 28, 28});
  const auto upstream = torch::randn({kBatch, 16, 14, 14});
  for (auto _ : state) {
    torch::Tensor y;
    {
      precision::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16, bf16);
      y = models::first_conv_bn_relu_pool(*conv, *bn, x, gemm::best_kernel(),
                                          layout_of(state.range(3)));
    }
    y.backward(upstream.to(y.scalar_type()));
    benchmark::DoNotOptimize(bn->weight.grad().data_ptr());
  }
  models::set_bn_relu_pool_fusion(true);
}

// One training step of fastcnn as the recipe runs it: label-smoothed cross-entropy, AdamW.
void step(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  models::set_bn_relu_pool_fusion(state.range(1) != 0);
  models::set_conv3x3_kernel(state.range(3) != 0);
  torch::manual_seed(1);
  auto model = models::make_model({"fastcnn", {1, 28, 28}, 10});
  model->train();
  // The first convolution frozen, as `--first-conv whitened` leaves it (its values do not matter
  // to the step's cost): AdamW then holds the other parameters only.
  const bool frozen = state.range(4) != 0;
  std::vector<torch::Tensor> trained;
  for (auto& item : model->named_parameters()) {
    if (frozen && item.key() == "conv1.weight") item.value().set_requires_grad(false);
    if (item.value().requires_grad()) trained.push_back(item.value());
  }
  // channels_last weights and batch, as the trainer runs conv nets on CPUs with AVX2 or AVX-512
  // (where the fused op has its NHWC form).
  const bool channels_last = state.range(2) != 0;
  const auto layout = layout_of(state.range(2));
  if (channels_last) {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(layout));
  }
  torch::optim::AdamW adamw(trained, torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  const auto x = torch::rand({kBatch, 1, 28, 28}).contiguous(layout);
  const auto y = torch::randint(10, {kBatch}, torch::kInt64);
  for (auto _ : state) {
    torch::Tensor logits;
    {
      precision::AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16, bf16);
      logits = model->forward(x);
    }
    const auto loss = torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat32), y,
        torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(0.1));
    adamw.zero_grad();
    loss.backward();
    adamw.step();
  }
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(kBatch),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  models::set_bn_relu_pool_fusion(true);
  models::set_conv3x3_kernel(true);
}

// What one training step keeps from the end of its forward to its backward, with and without
// --activation-checkpointing (each stage but the last keeps only its input), on one thread (the
// heap statistics count the main arena's blocks): fp32, the layout of the run's default.
// Arguments: the model (0 fastcnn, 1 fastcnn-2x, 2 fastcnn-wide), 1 for checkpointing.
void held(benchmark::State& state) {
  if (heap_in_use_bytes() < 0) {
    state.SkipWithError("needs glibc 2.33 or later (mallinfo2), and no AddressSanitizer");
    return;
  }
  const char* names[] = {"fastcnn", "fastcnn-2x", "fastcnn-wide"};
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::manual_seed(1);
  auto model = models::make_model({names[state.range(0)], {1, 28, 28}, 10});
  model->train();
  model->set_activation_checkpointing(state.range(1) != 0);
  const auto x = torch::rand({kBatch, 1, 28, 28});
  const auto y = torch::randint(10, {kBatch}, torch::kInt64);
  double held_mb = 0;
  for (auto _ : state) {
    model->zero_grad();
    const double before = static_cast<double>(heap_in_use_bytes());
    const auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    held_mb = (static_cast<double>(heap_in_use_bytes()) - before) / (1 << 20);
    loss.backward();
  }
  state.counters["MB held"] = held_mb;
  at::set_num_threads(threads);
}

}  // namespace

BENCHMARK(held)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->ArgNames({"model", "checkpointing"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(op)
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {0, 1}, {0, 1}})
    ->ArgNames({"stage", "bf16", "fused", "channels_last"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(conv)
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {0, 1}, {0, 1}})
    ->ArgNames({"stage", "bf16", "channels_last", "own"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(first)
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {0, 1}})
    ->ArgNames({"bf16", "fused", "frozen", "channels_last"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(step)
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}})
    ->ArgNames({"bf16", "fused", "channels_last", "own_conv", "frozen"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

int main(int argc, char** argv) { return spritetorch::bench::run_conv_benchmarks(argc, argv); }
