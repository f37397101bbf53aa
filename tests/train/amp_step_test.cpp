#include "train/amp_step.h"

#include <gtest/gtest.h>

#include <limits>

#include "common/bf16_gemm.h"
#include "common/error.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/cuda_graph_step.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

precision::PrecisionPlan cpu_plan(precision::Precision p) {
  device::DeviceInfo info;
  info.device = torch::kCPU;
  info.bf16 = true;
  return precision::resolve_precision(p, info);
}

models::Classifier seed_mlp() { return models::make_model({"ann", {1, 28, 28}, 10}); }

data::Batch random_batch(int64_t rows) {
  return {torch::rand({rows, 1, 28, 28}), torch::randint(0, 10, {rows}, torch::kInt64)};
}

// --- FlatOptimizer::step_on_device: the same update with the decisions on the device ------------

double on_device_vs_host(const std::string& kind, double momentum) {
  torch::manual_seed(5);
  auto a = seed_mlp(), b = seed_mlp();
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  OptimizerOptions options{kind, 1e-2, 0.9, 0.999, 1e-8, momentum};
  FlatOptimizer host(a->parameters(), options), dev(b->parameters(), options);
  for (int step = 0; step < 10; ++step) {
    auto g = torch::randn_like(host.grads());
    host.grads().copy_(g);
    dev.grads().copy_(g);
    host.step();
    dev.step_on_device();
  }
  EXPECT_EQ(dev.steps_taken(), 10);
  return (host.values() - dev.values()).abs().max().item<double>();
}

TEST(StepOnDevice, AdamMatchesTheHostStep) { EXPECT_LT(on_device_vs_host("adam", 0), 1e-5); }
TEST(StepOnDevice, SgdMatchesTheHostStep) { EXPECT_LT(on_device_vs_host("sgd", 0), 1e-6); }
TEST(StepOnDevice, SgdMomentumMatchesTheHostStep) {
  EXPECT_LT(on_device_vs_host("sgd", 0.9), 1e-6);
}

TEST(StepOnDevice, FoundInfSkipsTheWholeUpdateIncludingTheStepCount) {
  for (const std::string kind : {"adam", "sgd"}) {
    auto model = seed_mlp();
    FlatOptimizer opt(model->parameters(), {kind, 1e-2, 0.9, 0.999, 1e-8, 0.9});
    opt.grads().normal_();
    opt.step_on_device(torch::zeros({1}));  // a real step first, so the moments are nonzero
    const auto values = opt.values().clone();
    const auto state = opt.state();
    opt.grads().normal_();
    opt.grads()[3] = std::numeric_limits<float>::infinity();
    opt.step_on_device(torch::ones({1}));
    EXPECT_TRUE(torch::equal(opt.values(), values)) << kind;
    EXPECT_EQ(opt.steps_taken(), 1) << kind;
    const auto after = opt.state();
    EXPECT_TRUE(torch::equal(after.at("exp_avg"), state.at("exp_avg"))) << kind;
    // Back to the host step: it carries on counting from the device's count.
    opt.grads().normal_();
    opt.step();
    EXPECT_EQ(opt.steps_taken(), 2) << kind;
  }
}

// --- finish_step: unscale -> clip -> step unless inf -> update -----------------------------------

TEST(FinishStep, UnscalesBeforeClippingSoTheClipSeesTrueGradients) {
  auto model = models::make_model({"simplenn", {3}, 2});
  FlatOptimizer opt(model->parameters(), {"sgd", 1.0});  // lr 1: values move by -grad exactly
  precision::GradScalerOptions so;
  so.init_scale = 1024.0;
  so.force_fallback = true;
  precision::GradScaler scaler(torch::kCPU, so);
  const auto before = opt.values().clone();
  auto true_grad = torch::zeros_like(opt.grads());
  true_grad[0] = 3.0f;
  true_grad[1] = 4.0f;                    // norm 5
  opt.grads().copy_(true_grad * 1024.0);  // what backward of the scaled loss leaves
  finish_step(opt, &scaler, /*clip_grad_norm=*/1.0, /*on_device=*/false);
  const auto moved = before - opt.values();
  // Clipped in true units: norm 1. (Clipping before unscaling would leave a norm of 1/1024.)
  EXPECT_NEAR(moved.norm().item<double>(), 1.0, 1e-5);
  EXPECT_NEAR(moved[0].item<double>(), 0.6, 1e-5);
  EXPECT_NEAR(moved[1].item<double>(), 0.8, 1e-5);
}

TEST(FinishStep, InjectedInfSkipsTheStepAndHalvesTheScaleOnBothPaths) {
  for (const bool on_device : {false, true}) {
    auto model = models::make_model({"simplenn", {3}, 2});
    FlatOptimizer opt(model->parameters(), {"adam", 1e-2});
    precision::GradScalerOptions so;
    so.init_scale = 1024.0;
    precision::GradScaler scaler(torch::kCPU, so);
    const auto before = opt.values().clone();
    opt.grads().fill_(1.0);
    opt.grads()[2] = std::numeric_limits<float>::infinity();
    finish_step(opt, &scaler, 0.0, on_device);
    EXPECT_TRUE(torch::equal(opt.values(), before)) << "on_device " << on_device;
    EXPECT_EQ(opt.steps_taken(), 0);
    EXPECT_DOUBLE_EQ(scaler.current_scale(), 512.0);
    opt.grads().fill_(512.0);
    finish_step(opt, &scaler, 0.0, on_device);  // a clean step goes through
    EXPECT_EQ(opt.steps_taken(), 1);
    EXPECT_FALSE(torch::equal(opt.values(), before));
  }
}

// --- the autocast step ---------------------------------------------------------------------------

TEST(AmpStep, Bf16StepLeavesFp32GradientsCloseToTheFp32Step) {
  torch::manual_seed(3);
  auto a = seed_mlp(), b = seed_mlp();
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  FlatOptimizer oa(a->parameters(), {}), ob(b->parameters(), {});
  auto fp32 = make_train_step(a, 64, train::StepKind::kAutograd);
  auto bf16 = make_precision_train_step(b, 64, train::StepKind::kAutograd,
                                        {cpu_plan(precision::Precision::kBf16)});
  ASSERT_STREQ(bf16->name(), "autograd");
  const auto batch = random_batch(64);
  auto la = torch::zeros({}), lb = torch::zeros({});
  auto ca = torch::zeros({}, torch::kInt64), cb = torch::zeros({}, torch::kInt64);
  fp32->run(batch, la, ca);
  bf16->run(batch, lb, cb);
  EXPECT_EQ(ob.grads().scalar_type(), torch::kFloat32);
  EXPECT_NEAR(la.item<double>(), lb.item<double>(), 0.02 * la.item<double>());
  const double rel = ((oa.grads() - ob.grads()).norm() / oa.grads().norm()).item<double>();
  EXPECT_GT(rel, 0.0) << "bf16 must actually have changed the arithmetic";
  EXPECT_LT(rel, 0.05);
}

TEST(AmpStep, Bf16CnnStepRunsConvolutionsInBf16WithFp32Gradients) {
  // Small batch: bf16 convolutions are slow on CPUs without native bf16.
  const models::ModelSpec spec{"cnn", {1, 28, 28}, 10};
  torch::manual_seed(4);
  auto a = models::make_model(spec), b = models::make_model(spec);
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  a->eval();
  b->eval();
  FlatOptimizer oa(a->parameters(), {}), ob(b->parameters(), {});
  auto fp32 = make_train_step(a, 8, train::StepKind::kAuto);
  auto bf16 = make_precision_train_step(b, 8, train::StepKind::kAuto,
                                        {cpu_plan(precision::Precision::kBf16)});
  const auto batch = random_batch(8);
  auto la = torch::zeros({}), lb = torch::zeros({});
  auto ca = torch::zeros({}, torch::kInt64), cb = torch::zeros({}, torch::kInt64);
  fp32->run(batch, la, ca);
  bf16->run(batch, lb, cb);
  {
    precision::AutocastGuard guard(c10::DeviceType::CPU, torch::kBFloat16);
    EXPECT_EQ(b->forward(batch.inputs).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(ob.grads().scalar_type(), torch::kFloat32);
  const double rel = ((oa.grads() - ob.grads()).norm() / oa.grads().norm()).item<double>();
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 0.25);  // bf16's 8-bit mantissa through four layers of random data
}

// bf16 with the fused step: its bf16 form where the CPU has AVX512_BF16 (for kind auto too), else
// an error with a hint for kind fused and autograd under autocast for kind auto.
TEST(AmpStep, FusedStepWithBf16RunsLayerOneInBf16OrIsAnErrorWithAHint) {
  auto model = seed_mlp();
  FlatOptimizer opt(model->parameters(), {});
  const StepPrecision bf16{cpu_plan(precision::Precision::kBf16)};
  auto chosen = make_precision_train_step(model, 64, train::StepKind::kAuto, bf16);
  if (bf16::available()) {
    EXPECT_STREQ(chosen->name(), "fused-mlp");
    EXPECT_STREQ(chosen->kernel(), "avx512_bf16");
    EXPECT_STREQ(make_precision_train_step(model, 64, train::StepKind::kFused, bf16)->kernel(),
                 "avx512_bf16");
  } else {
    EXPECT_STREQ(chosen->name(), "autograd");
    try {
      make_precision_train_step(model, 64, train::StepKind::kFused, bf16);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("in bf16 on a CPU with AVX512_BF16"), std::string::npos);
      EXPECT_NE(e.hint().find("--step auto"), std::string::npos);
    }
  }
  // fp32 keeps the fused step in fp32.
  auto step = make_precision_train_step(model, 64, train::StepKind::kAuto,
                                        {cpu_plan(precision::Precision::kFp32)});
  EXPECT_STREQ(step->name(), "fused-mlp");
  EXPECT_STRNE(step->kernel(), "avx512_bf16");
}

TEST(AmpStep, ChannelsLastCnnKeepsItsStridesInTheFlatBufferAndTrainsTheSame) {
  const models::ModelSpec spec{"cnn", {1, 28, 28}, 10};
  torch::manual_seed(9);
  auto a = models::make_model(spec), b = models::make_model(spec);
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  a->eval();  // no dropout: the two runs must see the same arithmetic
  b->eval();
  apply_channels_last(*b);
  FlatOptimizer oa(a->parameters(), {}), ob(b->parameters(), {});
  const auto conv_weight = b->parameters()[0];
  ASSERT_EQ(conv_weight.dim(), 4);
  EXPECT_TRUE(conv_weight.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(conv_weight.grad().is_contiguous(torch::MemoryFormat::ChannelsLast));
  auto sa = make_train_step(a, 16, train::StepKind::kAuto);
  StepPrecision cl{cpu_plan(precision::Precision::kFp32)};
  cl.channels_last = true;
  auto sb = make_precision_train_step(b, 16, train::StepKind::kAuto, cl);
  auto la = torch::zeros({}), lb = torch::zeros({});
  auto ca = torch::zeros({}, torch::kInt64), cb = torch::zeros({}, torch::kInt64);
  for (int i = 0; i < 2; ++i) {
    const auto batch = random_batch(16);
    oa.zero_grad();
    ob.zero_grad();
    sa->run(batch, la, ca);
    sb->run(batch, lb, cb);
    oa.step();
    ob.step();
  }
  // Per parameter: the flat buffers hold the conv weights in different element orders. Adam moves
  // each weight by about lr (1e-3) per step whatever the gradient's size, so a weight whose
  // gradient is near 0 can move differently on rounding alone (2.2e-5 with MKL-DNN's convolutions
  // on a Xeon); a mis-ordered gradient would move weights by ~lr in the wrong places.
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_LT((pa[i] - pb[i]).abs().max().item<double>(), 2e-4) << "parameter " << i;
}

// --- CUDA graphs ---------------------------------------------------------------------------------

// One epoch of SimpleNN on the dummy set, on the CPU.
TrainConfig tiny_cpu_run() {
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";
  c.epochs = 1;
  return c;
}

TEST(CudaGraphs, RefusedOnTheCpuWithAClearMessage) {
  TrainConfig c = tiny_cpu_run();
  c.cuda_graphs = CudaGraphs::kOn;
  try {
    run_training(c);
    FAIL() << "--cuda-graphs on the CPU must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graphs needs a CUDA device"), std::string::npos);
    EXPECT_NE(e.hint().find("drop --cuda-graphs"), std::string::npos);
  }
}

TEST(CudaGraphs, RefusedForMpsAndForStreamingData) {
  EXPECT_THROW(check_cuda_graphs(torch::Device(torch::kMPS), "resident"), Error);
  if (SPRITETORCH_WITH_CUDA) {
    try {
      check_cuda_graphs(torch::Device(torch::kCUDA, 0), "streaming");
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("resident"), std::string::npos);
    }
  } else {
    EXPECT_THROW(check_cuda_graphs(torch::Device(torch::kCUDA, 0), "resident"), Error);
  }
}

// The default (auto) trains eagerly where graphs cannot run, and says nothing of graphs off CUDA.
TEST(CudaGraphs, AutoTrainsEagerlyOnTheCpu) {
  TrainConfig c = tiny_cpu_run();
  c.log_every = 0;
  ASSERT_EQ(c.cuda_graphs, CudaGraphs::kAuto);
  const auto report = run_training(c);
  EXPECT_EQ(report.epochs.size(), 1u);
  for (const auto& [key, value] : report.settings) EXPECT_NE(key, "cuda graphs") << value;
}

// The graph-captured step gives the eager loss curve (both on device-side optimizer steps). With
// `scheduled`: AdamW with weight decay, a learning rate changed before every step (a schedule:
// the graph must read it from the device) and batches of another size now and then (an epoch's
// partial last batch: run eagerly through the same step).
void expect_graph_matches_eager(const std::string& precision_name, const std::string& model_name,
                                bool scheduled = false) {
  const torch::Device cuda(torch::kCUDA, 0);
  const models::ModelSpec spec{model_name, {1, 28, 28}, 10};
  torch::manual_seed(21);
  auto a = models::make_model(spec), b = models::make_model(spec);
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  a->eval();  // dropout draws differ between eager and replay; compare without it
  b->eval();
  a->to(cuda);
  b->to(cuda);
  OptimizerOptions options;
  if (scheduled) {
    options.kind = "adamw";
    options.weight_decay = 0.05;
  }
  FlatOptimizer oa(a->parameters(), options), ob(b->parameters(), options);
  device::DeviceInfo info;
  info.device = cuda;
  info.bf16 = true;
  const auto plan = precision::resolve_precision(precision::parse_precision(precision_name), info);
  std::optional<precision::GradScaler> sa, sb;
  if (plan.grad_scaling) {
    sa.emplace(cuda);
    sb.emplace(cuda);
  }
  auto eager = make_precision_train_step(a, 32, train::StepKind::kAuto,
                                         {plan, sa ? &*sa : nullptr, false, true});
  auto graphed_inner = make_precision_train_step(b, 32, train::StepKind::kAuto,
                                                 {plan, sb ? &*sb : nullptr, false, false});
  CudaGraphStep graphed(*graphed_inner, ob, sb ? &*sb : nullptr, 0.0, 32, cuda);
  torch::manual_seed(22);
  for (int step = 0; step < 12; ++step) {
    const int64_t n = scheduled && (step == 6 || step == 11) ? 20 : 32;
    data::Batch batch{
        torch::rand({n, 1, 28, 28}, cuda),
        torch::randint(0, 10, {n}, torch::TensorOptions().device(cuda).dtype(torch::kInt64))};
    if (scheduled) {
      const double lr = 1e-3 * (1.0 + step) / 4.0;  // a warm-up, then past the default
      oa.set_lr(lr);
      ob.set_lr(lr);
    }
    auto la = torch::zeros({}, cuda), lb = torch::zeros({}, cuda);
    auto ca = torch::zeros({}, torch::TensorOptions().device(cuda).dtype(torch::kInt64)),
         cb = ca.clone();
    if (!eager->overwrites_grads()) oa.zero_grad();
    eager->run(batch, la, ca);
    finish_step(oa, sa ? &*sa : nullptr, 0.0, /*on_device=*/true);
    graphed.run(batch, lb, cb);
    EXPECT_NEAR(la.item<double>(), lb.item<double>(), 1e-3 * std::abs(la.item<double>()) + 1e-4)
        << precision_name << " " << model_name << " step " << step;
  }
  EXPECT_TRUE(graphed.captured());
  EXPECT_LT((oa.values() - ob.values()).abs().max().item<double>(), 1e-3);
}

TEST(CudaGraphsCuda, GraphedSeedMlpMatchesEagerFp32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_graph_matches_eager("fp32", "ann");
}

TEST(CudaGraphsCuda, GraphedCnnMatchesEagerBf16AndFp16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_graph_matches_eager("bf16", "cnn");
  expect_graph_matches_eager("fp16", "cnn");
}

TEST(CudaGraphsCuda, GraphsFollowTheLrScheduleAndRunPartialBatchesEagerly) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_graph_matches_eager("fp32", "ann", /*scheduled=*/true);
  expect_graph_matches_eager("bf16", "fastcnn", /*scheduled=*/true);
}

}  // namespace
}  // namespace spritetorch::train
