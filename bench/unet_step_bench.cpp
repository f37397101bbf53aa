// The generator's CPU training step with and without the fused GroupNorm + scale-shift + SiLU
// (diffusion/group_norm_silu.h), in the same process: the op alone at the UNet's shapes, forward
// and backward; the whole UNet step (forward, backward, Adam) at the CPU's batch sizes; and one
// sampling pass; and the memory a step holds between its forward and backward, with and without
// activation checkpointing.
//
//   build/bench/unet_step_bench                              # everything, LibTorch's threads
//   build/bench/unet_step_bench --benchmark_filter=step --benchmark_repetitions=5
//
// Arguments: the batch, then 1 for the fused kernel, 0 for LibTorch's ops, then (step, pass) 1 for
// the ResBlocks' convolutions through spritetorch's AVX2 3x3 kernels (models/conv3x3.h; the
// default on AVX2 CPUs), 0 for oneDNN's. `conv` compares the two on one convolution at each of the
// UNet's ResBlock shapes. Compare rows of one run, interleaved against a shared VM's drift:
//   build/bench/unet_step_bench --benchmark_filter='step|pass' --benchmark_repetitions=6
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true  (one
//     line)
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "common/malloc_tuning.h"
#include "conv_bench_main.h"
#include "diffusion/group_norm_silu.h"
#include "diffusion/unet.h"
#include "models/conv3x3.h"

namespace {

using namespace spritetorch::diffusion;

// One norm + activation at S = 32 (32 channels, 32 x 32) or S/2 (64 channels, 16 x 16).
void op(benchmark::State& state, int64_t channels, int64_t side) {
  const int64_t batch = state.range(0);
  set_group_norm_silu_fusion(state.range(1) != 0);
  torch::manual_seed(1);
  const auto x = torch::randn({batch, channels, side, side}).requires_grad_();
  const auto weight = torch::ones({channels}).requires_grad_();
  const auto bias = torch::zeros({channels}).requires_grad_();
  const auto scale = (0.1 * torch::randn({batch, channels, 1, 1})).requires_grad_();
  const auto shift = (0.1 * torch::randn({batch, channels, 1, 1})).requires_grad_();
  const auto upstream = torch::randn({batch, channels, side, side});
  for (auto _ : state) {
    const auto y = group_norm_silu(x, 8, weight, bias, 1e-5, scale, shift);
    y.backward(upstream);
    benchmark::DoNotOptimize(x.grad().data_ptr());
  }
  set_group_norm_silu_fusion(true);
}
void op_s(benchmark::State& state) { op(state, 32, 32); }
void op_s2(benchmark::State& state) { op(state, 64, 16); }

// The default generator UNet (base 32 x 1,2,2, attention, scale-shift norms) for 4 classes.
UNet default_unet() {
  UNetOptions options;
  options.base = 32;
  options.classes = 4;
  options.attention = true;
  options.scale_shift = true;
  torch::manual_seed(1);
  return UNet(options);
}

// Random inputs of the UNet at S x S: noisy sprites x and a target (B, 4, S, S), timesteps t in
// [0, 500) and classes c in [0, 4] (4: unconditional), all (B).
struct UNetInputs {
  torch::Tensor x, target, t, c;
};
UNetInputs unet_inputs(int64_t batch, int64_t side) {
  UNetInputs in;
  in.x = torch::randn({batch, 4, side, side});
  in.target = torch::randn({batch, 4, side, side});
  in.t = torch::randint(500, {batch}, torch::kInt64);
  in.c = torch::randint(5, {batch}, torch::kInt64);
  return in;
}

// One training step of the default generator UNet at 32 x 32: an MSE, backward, Adam. Arguments:
// the batch, the fused norm (1) or LibTorch's ops, the ResBlocks' 3x3 convolutions through
// spritetorch's AVX2 kernels (1, where they run) or oneDNN.
void step(benchmark::State& state) {
  const int64_t batch = state.range(0);
  set_group_norm_silu_fusion(state.range(1) != 0);
  spritetorch::models::set_conv3x3_kernel(state.range(2) != 0);
  UNet net = default_unet();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(2e-3));
  const UNetInputs in = unet_inputs(batch, 32);
  for (auto _ : state) {
    adam.zero_grad();
    torch::mse_loss(net->forward(in.x, in.t, in.c), in.target).backward();
    adam.step();
  }
  state.counters["sprites/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  set_group_norm_silu_fusion(true);
  spritetorch::models::set_conv3x3_kernel(true);
}

// One sampling pass (no grad) of the same UNet over 256 sprites: what `generate` and `eval` run
// 80 times a batch with the default sampler.
void pass(benchmark::State& state) {
  const int64_t batch = state.range(0);
  set_group_norm_silu_fusion(state.range(1) != 0);
  spritetorch::models::set_conv3x3_kernel(state.range(2) != 0);
  UNet net = default_unet();
  torch::NoGradGuard no_grad;
  const UNetInputs in = unet_inputs(batch, 32);
  for (auto _ : state) benchmark::DoNotOptimize(net->forward(in.x, in.t, in.c).data_ptr());
  state.counters["sprites/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  set_group_norm_silu_fusion(true);
  spritetorch::models::set_conv3x3_kernel(true);
}

// One ResBlock convolution of the default UNet, forward and backward, NCHW as the UNet runs it,
// through LibTorch (own_conv 0) or spritetorch's AVX2 kernels (1, where they run):
// shape 0 is up1's first (96 -> 32 at 32 x 32, the largest), 1 block2's second (64 -> 64 at
// 16 x 16), 2 mid1's (64 -> 64 at 8 x 8). Arguments: shape, batch, own_conv.
void conv(benchmark::State& state) {
  static const int64_t shapes[][3] = {{96, 32, 32}, {64, 64, 16}, {64, 64, 8}};
  const auto& shape = shapes[state.range(0)];
  const int64_t batch = state.range(1);
  spritetorch::models::set_conv3x3_kernel(state.range(2) != 0);
  torch::manual_seed(1);
  torch::nn::Conv2d layer(torch::nn::Conv2dOptions(shape[0], shape[1], 3).padding(1));
  const auto x = torch::randn({batch, shape[0], shape[2], shape[2]}).requires_grad_();
  const auto upstream = torch::randn({batch, shape[1], shape[2], shape[2]});
  if (state.range(2) != 0 && !spritetorch::models::conv3x3_fused(*layer, x))
    state.SkipWithError("the AVX2 convolutions do not run here");
  for (auto _ : state) {
    spritetorch::models::conv3x3(*layer, x).backward(upstream);
    benchmark::DoNotOptimize(x.grad().data_ptr());
  }
  const double flop = 3.0 * 2 * 9 * shape[0] * shape[1] * shape[2] * shape[2] * batch;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flop * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  spritetorch::models::set_conv3x3_kernel(true);
}

double heap_in_use_mb() {
  return static_cast<double>(spritetorch::heap_in_use_bytes()) / (1 << 20);
}

// What one training step of the default UNet keeps alive from its forward to its backward (the
// tensors autograd saves, and the output), at S x S, with and without activation checkpointing:
// the memory checkpointing exists to save, without the allocator's retained blocks that peak RSS
// also counts. Arguments: the batch, S, 1 for checkpointing.
void held(benchmark::State& state) {
  if (spritetorch::heap_in_use_bytes() < 0) {
    state.SkipWithError("needs glibc 2.33 or later (mallinfo2), and no AddressSanitizer");
    return;
  }
  const int64_t batch = state.range(0), side = state.range(1);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  UNet net = default_unet();
  net->set_activation_checkpointing(state.range(2) != 0);
  const UNetInputs in = unet_inputs(batch, side);
  double held_mb = 0;
  for (auto _ : state) {
    net->zero_grad();
    const double before = heap_in_use_mb();
    const auto loss = torch::mse_loss(net->forward(in.x, in.t, in.c), in.target);
    held_mb = heap_in_use_mb() - before;
    loss.backward();
  }
  state.counters["MB held"] = held_mb;
  state.counters["MB/sprite"] = held_mb / static_cast<double>(batch);
  at::set_num_threads(threads);
}

}  // namespace

BENCHMARK(op_s)->ArgsProduct({{16, 32}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(op_s2)->ArgsProduct({{16, 32}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(step)
    ->ArgNames({"batch", "fused", "own_conv"})
    ->ArgsProduct({{16, 32}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(pass)
    ->ArgNames({"batch", "fused", "own_conv"})
    ->ArgsProduct({{256}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(conv)
    ->ArgNames({"shape", "batch", "own_conv"})
    ->ArgsProduct({{0, 1, 2}, {16}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(held)
    ->ArgsProduct({{16, 64}, {32, 64}, {0, 1}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
int main(int argc, char** argv) { return spritetorch::bench::run_conv_benchmarks(argc, argv); }
