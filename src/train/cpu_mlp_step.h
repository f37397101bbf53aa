// The fused MLP step on the CPU in float32, written on raw buffers and split over the cores.
//
// FusedMlpStep (train_step.h) runs the same arithmetic as a dozen LibTorch ops per layer; at the
// seed's batch of 64 the dispatch of those ops and the wait between them cost about as much as the
// matrix products. Here every product is one call of a small-matrix kernel on raw pointers
// (common/small_gemm.h: no packing, bias and ReLU fused in), the element-wise parts are loops,
// and the work of one step is split over T threads in three phases (one fork-join each,
// common/shard_pool.h):
//
//   1. layer 1 forward, split by its output units: thread t computes units [u_t, u_t+1) of
//      a_1 = relu(x W_1^T + b_1) for the whole batch (x: (B, in), the largest product);
//   2. layers 2..L forward, the loss, and backward down to d a_1, split by batch rows; each thread
//      writes its own partial gradients for layers 2..L;
//   3. layer 1 backward, split by units again: thread t owns rows [u_t, u_t+1) of dW_1 (no sum
//      needed, and the product keeps the whole batch as its inner dimension); and the partial
//      gradients of layers 2..L are summed, each thread over its own share of the elements.
//
// The optimizer's update then runs on the same threads, each over the parameters whose gradients
// it has just written (update_shares): a line another core wrote costs a transfer between the
// cores' caches, and on a 2-vCPU Zen 5 VM that made the update of a split share 1.7x slower.
//
// Layer 1 holds ~90% of the seed MLP's FLOPs, so splitting it by units keeps every thread's
// products as large as the batch allows. Results equal FusedMlpStep's within float rounding
// (tests compare both with autograd). Needs at least two layers and, to be chosen by
// make_train_step, AVX2+FMA or a BLAS library (else it falls back to FusedMlpStep).
#pragma once

#include <memory>
#include <vector>

#include "common/bf16_gemm.h"
#include "common/shard_pool.h"
#include "common/small_gemm.h"
#include "train/train_step.h"

namespace spritetorch::train {

// How the step computes layer 1, the products that hold ~90% of its FLOPs: in float32, or from
// bf16 copies of x, W_1 and dL/dz_1 with float32 sums (common/bf16_gemm.h), as bf16 autocast
// computes a Linear layer; the weights, the later layers, the loss and the update stay float32.
enum class MlpCompute { fp32, bf16 };

class CpuMlpStep : public TrainStep {
 public:
  // layers: the model's Linear layers in order, ReLU between them, float32 on the CPU, gradients
  // allocated (the flat optimizer does that). threads >= 1. kernel: which code runs the matrix
  // products (tests run each; the loops are always there but slow).
  // compute: bf16 needs bf16::available() (throws Error otherwise).
  CpuMlpStep(std::vector<torch::nn::Linear> layers, int64_t max_batch, int threads,
             gemm::Kernel kernel = gemm::best_kernel(), MlpCompute compute = MlpCompute::fp32);
  ~CpuMlpStep() override;

  // Whether this step should run the given layers here (CPU float32, >= 2 layers, and AVX-512,
  // AVX2+FMA or a BLAS library for the products).
  static bool applies_to(const std::vector<torch::nn::Linear>& layers);

  void run(const data::Batch& batch, torch::Tensor& loss_sum, torch::Tensor& correct) override;
  const char* name() const override { return "fused-mlp"; }
  bool overwrites_grads() const override { return true; }
  int threads() const override { return threads_; }
  std::shared_ptr<ShardPool> thread_pool() const override { return pool_; }
  // Thread t: layer 1's rows [u_t, u_t+1) of W_1 and b_1 (phase 3 wrote their gradients) and its
  // share of the later layers' elements (phase 3 summed their partial gradients there).
  ParameterShares update_shares() const override;
  // Phases 1 and 3 of thread t read the batch from thread_inputs[t] when it has them: x is the
  // largest operand every thread reads whole, and a copy another core wrote crosses between the
  // cores' caches each step.
  bool reads_thread_inputs() const override { return pool_ != nullptr; }
  const char* kernel() const override {
    return compute_ == MlpCompute::bf16 ? "avx512_bf16" : gemm::kernel_name(kernel_);
  }
  MlpCompute compute() const { return compute_; }

 private:
  struct Layer;
  void forward_first_layer(int thread, const float* x, int batch);
  void rows_forward_backward(int thread, const int64_t* labels, int batch);
  void backward_first_layer(int thread, const float* x, int batch);

  std::vector<torch::nn::Linear> modules_;
  std::vector<std::unique_ptr<Layer>> layers_;
  int64_t max_batch_;
  int threads_;
  gemm::Kernel kernel_;
  MlpCompute compute_;
  std::shared_ptr<ShardPool> pool_;
  // bf16 only, per thread: x rounded (B, in rounded up to even) for the forward, W_1's rows of its
  // units in pairs of columns, and x and its units' dL/dz_1 in pairs of rows for dW_1.
  std::vector<std::vector<uint16_t>> x_bf16_, w1_pairs_, x_pairs_, dz_pairs_;
  std::vector<const float*> thread_x_;  // per thread: the batch it reads in phases 1 and 3
  std::vector<double> thread_loss_;     // per thread: this step's loss sum over its rows
  std::vector<int64_t> thread_correct_;
};

}  // namespace spritetorch::train
