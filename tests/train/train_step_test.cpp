#include "train/train_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <utility>

#include "common/bf16_gemm.h"
#include "common/compat.h"
#include "common/error.h"
#include "common/small_gemm.h"
#include "test_util.h"
#include "train/cpu_mlp_step.h"
#include "train/flat_optimizer.h"

namespace spritetorch::train {
namespace {

using StepMaker =
    std::function<std::unique_ptr<TrainStep>(const models::Classifier&, int64_t batch)>;

// Two models of one spec with the same weights (the first's).
std::pair<models::Classifier, models::Classifier> twin_models(const models::ModelSpec& spec) {
  auto a = models::make_model(spec), b = models::make_model(spec);
  torch::NoGradGuard no_grad;
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  return {a, b};
}

// Trains two copies of one model for a few steps, autograd's and the given step's, with batches of
// the given sizes, and compares losses, correct counts and weights.
void expect_matches_autograd(const models::ModelSpec& spec, int64_t batch, const StepMaker& make,
                             const std::vector<int64_t>& batches) {
  torch::manual_seed(11);
  auto [a, b] = twin_models(spec);
  FlatOptimizer oa(a->parameters(), {}), ob(b->parameters(), {});
  auto autograd = make_train_step(a, batch, train::StepKind::kAutograd);
  auto fused = make(b, batch);
  ASSERT_STREQ(fused->name(), "fused-mlp");
  ob.use_thread_pool(fused->thread_pool());
  // The fused CPU step's threads each update what they wrote, as in the trainer.
  if (fused->thread_pool()) {
    EXPECT_TRUE(ob.use_thread_shares(fused->update_shares()));
  }
  auto shape = spec.input_shape;
  auto la = torch::zeros({}), lb = torch::zeros({});
  auto ca = torch::zeros({}, torch::kInt64), cb = torch::zeros({}, torch::kInt64);
  for (int64_t rows : batches) {
    std::vector<int64_t> dims{rows};
    dims.insert(dims.end(), shape.begin(), shape.end());
    data::Batch x{torch::rand(dims), torch::randint(0, spec.classes, {rows}, torch::kInt64)};
    oa.zero_grad();
    autograd->run(x, la, ca);
    oa.step();
    fused->run(x, lb, cb);  // overwrites the gradients: no zero_grad
    EXPECT_LT((oa.grads() - ob.grads()).abs().max().item<double>(), 1e-6) << rows << " rows";
    ob.step();
  }
  EXPECT_NEAR(la.item<double>(), lb.item<double>(), 1e-4);
  EXPECT_EQ(ca.item<int64_t>(), cb.item<int64_t>());
  EXPECT_LT((oa.values() - ob.values()).abs().max().item<double>(), 1e-5);
}

StepMaker torch_ops_step() {
  return [](const models::Classifier& m, int64_t batch) {
    return std::make_unique<FusedMlpStep>(m->relu_mlp_layers(), batch);
  };
}
StepMaker cpu_step(int threads, gemm::Kernel kernel = gemm::best_kernel()) {
  return [threads, kernel](const models::Classifier& m, int64_t batch) {
    auto step = std::make_unique<CpuMlpStep>(m->relu_mlp_layers(), batch, threads, kernel);
    EXPECT_EQ(step->threads(), threads);
    EXPECT_EQ(step->thread_pool() != nullptr, threads > 1);
    return step;
  };
}

// Every matrix kernel this machine can run (the plain loops always can).
std::vector<gemm::Kernel> kernels_here() {
  std::vector<gemm::Kernel> out;
  for (auto k : {gemm::Kernel::avx512, gemm::Kernel::avx2, gemm::Kernel::blas, gemm::Kernel::loops})
    if (gemm::available(k)) out.push_back(k);
  return out;
}

const models::ModelSpec kSeedNetwork{"ann", {1, 28, 28}, 10};
const models::ModelSpec kSimpleNn{"simplenn", {3}, 2};

TEST(FusedMlpStep, MatchesAutogradOnTheSeedNetwork) {
  expect_matches_autograd(kSeedNetwork, 64, torch_ops_step(), {64, 64, 33});
}
TEST(FusedMlpStep, MatchesAutogradOnSimpleNn) {
  expect_matches_autograd(kSimpleNn, 32, torch_ops_step(), {32, 32, 17});
}

// The raw-buffer CPU step: one thread, and threads that split units and rows unevenly, with short
// batches, a batch smaller than the thread count (threads without rows) and a batch of one.
TEST(CpuMlpStep, MatchesAutogradOnTheSeedNetwork) {
  for (auto kernel : kernels_here())
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(std::string(gemm::kernel_name(kernel)) + " kernel, " + std::to_string(threads) +
                   " threads");
      expect_matches_autograd(kSeedNetwork, 64, cpu_step(threads, kernel), {64, 64, 33, 2, 1});
    }
}
TEST(CpuMlpStep, MatchesAutogradOnSimpleNn) {
  for (auto kernel : kernels_here())
    for (int threads : {1, 2, 5}) {
      SCOPED_TRACE(std::string(gemm::kernel_name(kernel)) + " kernel, " + std::to_string(threads) +
                   " threads");
      expect_matches_autograd(kSimpleNn, 32, cpu_step(threads, kernel), {32, 17, 3});
    }
}

// The optimizer's update split as the step wrote the gradients, against the even split: the same
// weights to the last bit (each element's update does not depend on the thread that runs it), and
// every parameter element in exactly one thread's share (use_thread_shares checks that).
TEST(CpuMlpStep, UpdateSharesTileTheParametersAndTrainAsTheEvenSplit) {
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    torch::manual_seed(5);
    auto [a, b] = twin_models(kSeedNetwork);
    FlatOptimizer oa(a->parameters(), {}), ob(b->parameters(), {});
    CpuMlpStep sa(a->relu_mlp_layers(), 64, threads), sb(b->relu_mlp_layers(), 64, threads);
    oa.use_thread_pool(sa.thread_pool());
    ob.use_thread_pool(sb.thread_pool());
    const auto shares = sb.update_shares();
    ASSERT_EQ(static_cast<int>(shares.size()), threads);
    // Thread t's first share is its units' rows of W_1, as phase 3 wrote them.
    EXPECT_EQ(shares[0][0].begin, 0);
    EXPECT_EQ(shares[threads - 1][0].end, 128 * 784);
    ASSERT_TRUE(ob.use_thread_shares(shares));
    const auto initial = ob.values().clone();
    auto loss = torch::zeros({});
    auto correct = torch::zeros({}, torch::kInt64);
    for (int64_t rows : {64, 64, 37}) {
      data::Batch x{torch::rand({rows, 1, 28, 28}), torch::randint(0, 10, {rows}, torch::kInt64)};
      sa.run(x, loss, correct);
      oa.step();
      sb.run(x, loss, correct);
      ob.step();
    }
    EXPECT_TRUE(torch::equal(oa.values(), ob.values()));
    EXPECT_FALSE(torch::equal(ob.values(), initial));  // the steps moved the weights
  }
}

// Each thread's own copy of the batch (data::Batch::thread_inputs, as the resident loader makes
// them): the same weights to the last bit as the batch alone; copies that no longer copy the
// inputs (the inputs replaced) are left unread; and thread 1's copy is what thread 1 reads.
TEST(CpuMlpStep, ReadsEachThreadsCopyOfTheBatchWhileTheyCopyIt) {
  torch::manual_seed(6);
  auto [a, b] = twin_models(kSeedNetwork);
  auto [c, d] = twin_models(kSeedNetwork);
  {  // c, d: a's weights too
    torch::NoGradGuard no_grad;
    for (auto& m : {c, d}) {
      auto pa = a->parameters(), pm = m->parameters();
      for (size_t i = 0; i < pa.size(); ++i) pm[i].copy_(pa[i]);
    }
  }
  FlatOptimizer oa(a->parameters(), {}), ob(b->parameters(), {}), oc(c->parameters(), {}),
      od(d->parameters(), {});  // (allocates the gradients the steps write)
  CpuMlpStep plain(a->relu_mlp_layers(), 64, 2), copied(b->relu_mlp_layers(), 64, 2),
      stale(c->relu_mlp_layers(), 64, 2), wrong(d->relu_mlp_layers(), 64, 2);
  EXPECT_TRUE(copied.reads_thread_inputs());
  EXPECT_FALSE(CpuMlpStep(d->relu_mlp_layers(), 64, 1).reads_thread_inputs());
  auto loss = torch::zeros({});
  auto correct = torch::zeros({}, torch::kInt64);
  for (int64_t rows : {64, 37}) {
    const auto x = torch::rand({rows, 1, 28, 28});
    const auto y = torch::randint(0, 10, {rows}, torch::kInt64);
    data::Batch alone{x, y};
    data::Batch with_copies{x, y, {x, x.clone()}};
    // Inputs replaced after the copies were made: the copies hold zeros, the inputs x.
    data::Batch replaced{x, y, {torch::zeros_like(x), torch::zeros_like(x)}};
    // Copy 0 is the inputs but copy 1 differs: thread 1 reading it changes the result.
    data::Batch other{x, y, {x, torch::zeros_like(x)}};
    plain.run(alone, loss, correct);
    oa.step();
    copied.run(with_copies, loss, correct);
    ob.step();
    stale.run(replaced, loss, correct);
    oc.step();
    wrong.run(other, loss, correct);
    od.step();
  }
  EXPECT_TRUE(torch::equal(oa.values(), ob.values()));
  EXPECT_TRUE(torch::equal(oa.values(), oc.values()));
  EXPECT_FALSE(torch::equal(oa.values(), od.values()));
}

// Layer 1 in bf16: the step's gradients and loss against autograd on the same arithmetic (x and
// W_1 rounded to bf16 for the forward, dL/dz_1 and x rounded for dW_1, float32 elsewhere), on one
// thread and on uneven splits, with an odd batch (a row paired with zero); and further from the
// float32 step's than from that reference.
TEST(CpuMlpStep, Bf16LayerOneMatchesAutogradOnRoundedOperands) {
  if (!bf16::available()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const auto round = [](const torch::Tensor& t) {
    return t.to(torch::kBFloat16).to(torch::kFloat32);
  };
  for (int threads : {1, 2, 3})
    for (int64_t rows : {64, 33}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(rows) + " rows");
      torch::manual_seed(21);
      auto [a, b] = twin_models(kSeedNetwork);
      auto [c, unused] = twin_models(kSeedNetwork);
      {
        torch::NoGradGuard no_grad;
        auto pa = a->parameters(), pc = c->parameters();
        for (size_t i = 0; i < pa.size(); ++i) pc[i].copy_(pa[i]);
      }
      FlatOptimizer ob(b->parameters(), {}), oc(c->parameters(), {});
      CpuMlpStep half(b->relu_mlp_layers(), 64, threads, gemm::best_kernel(), MlpCompute::bf16);
      CpuMlpStep full(c->relu_mlp_layers(), 64, threads);
      EXPECT_STREQ(half.kernel(), "avx512_bf16");
      const auto x = torch::rand({rows, 1, 28, 28});
      const auto y = torch::randint(0, 10, {rows}, torch::kInt64);
      auto loss = torch::zeros({}), loss_full = torch::zeros({});
      auto correct = torch::zeros({}, torch::kInt64), correct_full = correct.clone();
      half.run({x, y}, loss, correct);
      full.run({x, y}, loss_full, correct_full);

      // The reference: autograd on a's float32 weights with layer 1's operands rounded.
      auto layers = a->relu_mlp_layers();
      const auto xr = round(x.reshape({rows, -1}));
      const auto w1 = round(layers[0]->weight.detach()).requires_grad_();
      auto z1 = torch::addmm(layers[0]->bias, xr, w1.t());
      z1.retain_grad();
      auto h = torch::relu(z1);
      for (size_t l = 1; l < layers.size(); ++l) {
        h = layers[l]->forward(h);
        if (l + 1 < layers.size()) h = torch::relu(h);
      }
      const auto ref_loss = torch::nn::functional::cross_entropy(h, y);
      ref_loss.backward();
      const auto dw1 = round(z1.grad()).t().mm(xr);
      const auto db1 = z1.grad().sum(0);
      EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>() * rows, 1e-3);

      std::vector<torch::Tensor> want{dw1, db1};
      for (size_t l = 1; l < layers.size(); ++l) {
        want.push_back(layers[l]->weight.grad());
        want.push_back(layers[l]->bias.grad());
      }
      const auto got = b->relu_mlp_layers();
      const auto plain = c->relu_mlp_layers();
      for (size_t l = 0; l < got.size(); ++l)
        for (int which = 0; which < 2; ++which) {
          const auto& g = which == 0 ? got[l]->weight.grad() : got[l]->bias.grad();
          const auto& f = which == 0 ? plain[l]->weight.grad() : plain[l]->bias.grad();
          const auto& w = want[2 * l + which];
          const double scale = w.abs().max().item<double>();
          const double off = (g - w).abs().max().item<double>() / scale;
          const double off_fp32 = (g - f).abs().max().item<double>() / scale;
          SCOPED_TRACE("layer " + std::to_string(l + 1) + (which == 0 ? " weight" : " bias"));
          EXPECT_LT(off, 2e-3);
          if (l == 0 && which == 0) {
            EXPECT_GT(off_fp32, 5 * off) << "bf16 changed nothing";
          }
        }
    }
}

TEST(CpuMlpStep, ReportsEachGradientOnceWhenFinal) {
  auto model = models::make_model(kSeedNetwork);
  FlatOptimizer o(model->parameters(), {});
  CpuMlpStep step(model->relu_mlp_layers(), 8, 2);
  std::vector<const void*> reported;
  step.on_grad_ready([&](const torch::Tensor& p) {
    EXPECT_NE(p.grad().abs().sum().item<double>(), 0.0);  // written by then
    reported.push_back(p.unsafeGetTensorImpl());
  });
  auto loss = torch::zeros({});
  auto correct = torch::zeros({}, torch::kInt64);
  step.run({torch::rand({8, 1, 28, 28}), torch::randint(0, 10, {8}, torch::kInt64)}, loss, correct);
  auto params = model->parameters();
  ASSERT_EQ(reported.size(), params.size());
  for (const auto& p : params)
    EXPECT_EQ(std::count(reported.begin(), reported.end(), p.unsafeGetTensorImpl()), 1);
}

TEST(CpuMlpStep, RejectsLabelsOutsideTheClasses) {
  auto model = models::make_model(kSeedNetwork);
  FlatOptimizer o(model->parameters(), {});
  CpuMlpStep step(model->relu_mlp_layers(), 4, 2);
  auto loss = torch::zeros({});
  auto correct = torch::zeros({}, torch::kInt64);
  const auto labels = torch::tensor({1, 2, 10, 3}, torch::kInt64);
  try {
    step.run({torch::rand({4, 1, 28, 28}), labels}, loss, correct);
    FAIL() << "label 10 of 10 classes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 10 in batch row 2 is outside 0..9"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      step.run({torch::rand({5, 1, 28, 28}), torch::zeros({5}, torch::kInt64)}, loss, correct),
      Error);  // larger than its buffers
  EXPECT_THROW(
      step.run({torch::rand({4, 1, 27, 28}), torch::zeros({4}, torch::kInt64)}, loss, correct),
      Error);  // wrong feature count
  EXPECT_EQ(loss.item<double>(), 0.0);
}

TEST(TrainStepChoice, AutoPicksFusedForMlpsAndAutogradOtherwise) {
  auto ann = models::make_model({"ann", {1, 8, 8}, 3});
  FlatOptimizer o(ann->parameters(), {});
  EXPECT_STREQ(make_train_step(ann, 8, train::StepKind::kAuto)->name(), "fused-mlp");
  // On the CPU in float32 the fused step is the raw-buffer one, with the threads asked for.
  auto cpu = make_train_step(ann, 8, train::StepKind::kFused, 2);
  if (gemm::best_kernel() != gemm::Kernel::loops) {
    EXPECT_NE(dynamic_cast<CpuMlpStep*>(cpu.get()), nullptr);
    EXPECT_EQ(cpu->threads(), 2);
  } else {  // neither AVX2 nor an exported CBLAS: the ATen fused step, one thread
    if (std::getenv("SPRITETORCH_GEMM_KERNEL") == nullptr) {  // not a kernel named to compare
      EXPECT_FALSE(compat::cblas_expected()) << "Debian's LibTorch should export cblas_sgemm";
    }
    EXPECT_EQ(dynamic_cast<CpuMlpStep*>(cpu.get()), nullptr);
    EXPECT_STREQ(cpu->name(), "fused-mlp");
  }
  EXPECT_STREQ(make_train_step(ann, 8, train::StepKind::kAutograd)->name(), "autograd");
  auto cnn = models::make_model({"cnn", {1, 8, 8}, 3});
  EXPECT_STREQ(make_train_step(cnn, 8, train::StepKind::kAuto)->name(), "autograd");
  EXPECT_THROW(make_train_step(cnn, 8, train::StepKind::kFused), Error);
}

}  // namespace
}  // namespace spritetorch::train
