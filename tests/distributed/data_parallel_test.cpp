// DDP's arithmetic, two ranks as two threads of this process (each its own c10d TCPStore client and
// ProcessGroupGloo over loopback): after N steps the ranks hold identical parameters, equal to a
// single process that took the same global batches; overlapped and after-backward reduction agree;
// the fused MLP step overlaps too. Multi-process behaviour (launch, faults, env) is covered by
// tests/distributed/multiproc_test.sh against the real binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "common/error.h"
#include "data/loader.h"
#include "distributed/communicator.h"
#include "distributed/launcher.h"
#include "models/classifier.h"
#include "train/data_parallel.h"
#include "train/flat_optimizer.h"
#include "train/parallel.h"
#include "train/train_step.h"

namespace spritetorch::train {
namespace {

constexpr int64_t kRankBatch = 32;

bool has_gloo() {
  const auto b = distributed::backends();
  return std::find(b.begin(), b.end(), "gloo") != b.end();
}

data::Dataset small_images() {
  torch::manual_seed(11);
  data::Dataset d;
  d.inputs = torch::randint(0, 256, {256, 1, 16, 16}, torch::kUInt8);  // (N, 1, 16, 16) uint8
  d.labels = torch::randint(0, 10, {256}, torch::kInt64);
  for (int i = 0; i < 10; ++i) d.class_names.push_back(std::to_string(i));
  d.name = "random-images";
  return d;
}

models::Classifier make_ann(uint64_t seed) {
  torch::manual_seed(seed);
  return models::make_model({"ann", {1, 16, 16}, 10});
}

distributed::EnvLookup fake_env(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

struct RankResult {
  torch::Tensor values;  // (P) parameters after training
  size_t buckets = 0;
  int64_t launched_early = 0;  // buckets launched during the last backward
};

// Trains `model` for 3 epochs the way the trainer does, as rank `rank` of `world` (world 1 =
// single process, no communicator).
RankResult train_rank(models::Classifier model, const data::Dataset& d, TrainConfig config,
                      int rank, int world, int port, int64_t batch) {
  std::map<std::string, std::string> vars;
  if (world > 1)
    vars = {{"RANK", std::to_string(rank)},
            {"WORLD_SIZE", std::to_string(world)},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", std::to_string(port)}};
  if (world > 1) {  // a single process refuses the process group's options
    config.dist_backend = train::DistBackend::kGloo;
    config.dist_timeout_s = 20;
  }
  ParallelRun parallel(config, fake_env(vars));
  parallel.connect(torch::kCPU);
  FlatOptimizer optimizer(model->parameters(), OptimizerOptions{});
  parallel.broadcast_model(*model, optimizer);
  auto step = make_train_step(model, batch, config.step, std::max(1, config.step_threads));
  parallel.attach(*step, optimizer, model->parameters());
  data::LoaderOptions options{batch, true, false, 5};
  const data::Dataset& mine = parallel.shard(d, options);
  data::ResidentLoader loader(mine, torch::kCPU, options);
  auto loss = torch::zeros({}, torch::kFloat32);
  auto correct = torch::zeros({}, torch::kInt64);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    loader.start_epoch(epoch);
    data::Batch b;
    while (loader.next(b)) {
      if (!step->overwrites_grads()) optimizer.zero_grad();
      step->run(b, loss, correct);
      parallel.reduce_gradients();
      optimizer.step();
    }
  }
  RankResult out;
  out.values = optimizer.values().clone();
  if (const auto* reducer = parallel.reducer()) {
    out.buckets = reducer->buckets().size();
    out.launched_early = reducer->launched_early();
  }
  return out;
}

// Two ranks in two threads; rank 1 starts from different weights (the broadcast must fix that).
std::vector<RankResult> train_two_ranks(const TrainConfig& config) {
  const auto d = small_images();
  std::vector<models::Classifier> models = {make_ann(1), make_ann(2)};
  const int port = distributed::free_tcp_port();
  std::vector<RankResult> results(2);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        results[static_cast<size_t>(r)] =
            train_rank(models[static_cast<size_t>(r)], d, config, r, 2, port, kRankBatch);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

TrainConfig ddp_config(const std::string& step, bool overlap) {
  TrainConfig c;
  c.strategy = train::Strategy::kDdp;
  c.step = parse_choice<StepKind>(step, "step");
  c.overlap = overlap;
  c.bucket_mb = 0.02;  // ~5k floats: the 42k-parameter MLP spreads over 4 buckets
  return c;
}

torch::Tensor single_process(const std::string& step) {
  TrainConfig c;
  c.strategy = train::Strategy::kSingle;
  c.step = parse_choice<StepKind>(step, "step");
  return train_rank(make_ann(1), small_images(), c, 0, 1, 0, 2 * kRankBatch).values;
}

TEST(DataParallel, TwoRanksMatchOneProcessOverTheGlobalBatch) {
  if (!has_gloo()) GTEST_SKIP() << "built without c10d Gloo";
  const auto ranks = train_two_ranks(ddp_config("autograd", true));
  EXPECT_TRUE(torch::equal(ranks[0].values, ranks[1].values)) << "ranks diverged";
  const auto single = single_process("autograd");
  const double diff = (ranks[0].values - single).abs().max().item<double>();
  EXPECT_LT(diff, 1e-5);
  // Training moved the weights (so the comparison means something).
  std::vector<torch::Tensor> initial;
  for (const auto& p : make_ann(1)->parameters()) initial.push_back(p.detach().flatten());
  EXPECT_GT((single - torch::cat(initial)).abs().max().item<double>(), 1e-3);
  EXPECT_EQ(ranks[0].buckets, 4u);
  EXPECT_EQ(ranks[0].launched_early, static_cast<int64_t>(ranks[0].buckets))
      << "every bucket should start during backward";
}

TEST(DataParallel, OverlappedAndAfterBackwardReductionAgree) {
  if (!has_gloo()) GTEST_SKIP() << "built without c10d Gloo";
  const auto overlapped = train_two_ranks(ddp_config("autograd", true));
  const auto after = train_two_ranks(ddp_config("autograd", false));
  EXPECT_EQ(after[0].launched_early, 0);
  EXPECT_TRUE(torch::equal(after[0].values, after[1].values));
  EXPECT_LT((overlapped[0].values - after[0].values).abs().max().item<double>(), 1e-7);
}

TEST(DataParallel, FusedStepReportsGradientsLayerByLayer) {
  if (!has_gloo()) GTEST_SKIP() << "built without c10d Gloo";
  const auto fused = train_two_ranks(ddp_config("fused", true));
  EXPECT_TRUE(torch::equal(fused[0].values, fused[1].values));
  EXPECT_EQ(fused[0].launched_early, static_cast<int64_t>(fused[0].buckets));
  const auto single = single_process("fused");
  EXPECT_LT((fused[0].values - single).abs().max().item<double>(), 1e-5);
}

TEST(DataParallel, ShardedFusedStepReportsEachLayerAfterItsShardSum) {
  if (!has_gloo()) GTEST_SKIP() << "built without c10d Gloo";
  auto config = ddp_config("fused", true);
  config.step_threads = 2;
  const auto fused = train_two_ranks(config);
  EXPECT_TRUE(torch::equal(fused[0].values, fused[1].values));
  EXPECT_EQ(fused[0].launched_early, static_cast<int64_t>(fused[0].buckets));
  EXPECT_LT((fused[0].values - single_process("fused")).abs().max().item<double>(), 1e-5);
}

TEST(DataParallel, RendezvousWithoutTheOtherRanksFailsWithinTheTimeout) {
  if (!has_gloo()) GTEST_SKIP() << "built without c10d Gloo";
  const int port = distributed::free_tcp_port();
  for (int rank : {0, 1}) {  // 0: nobody joins its store; 1: no store to join
    distributed::DistEnv env;
    env.rank = rank;
    env.world_size = 2;
    env.master_addr = "127.0.0.1";
    env.master_port = port;
    const auto start = std::chrono::steady_clock::now();
    try {
      distributed::create_communicator(env, {"gloo", 1.0});
      ADD_FAILURE() << "rank " << rank << " connected to nobody";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rendezvous at 127.0.0.1:" + std::to_string(port)),
                std::string::npos)
          << e.what();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 10.0) << "rank " << rank;
  }
}

// Local shards: each rank trains on its own fixed share, yet the averaged gradients keep the ranks
// identical.
TEST(DataParallel, LocalShardsKeepTheRanksInSync) {
  if (!has_gloo()) GTEST_SKIP() << "built without Gloo";
  TrainConfig c = ddp_config("autograd", true);
  c.dist_shard = train::DistShard::kLocal;
  const auto ranks = train_two_ranks(c);
  EXPECT_TRUE(torch::equal(ranks[0].values, ranks[1].values));
  c.dist_shard = train::DistShard::kGlobal;
  const auto global = train_two_ranks(c);
  EXPECT_FALSE(torch::allclose(global[0].values, ranks[0].values))
      << "local shards must change which samples share a step";
}

// DataParallel's single-device path on the CPU: the wrapper must be transparent — same logits, and
// the gradients land in the wrapped model's own parameters (what the optimizer steps).
TEST(DataParallel, WrapperOnOneDeviceMatchesThePlainModel) {
  auto plain = make_ann(5);
  auto inner = make_ann(5);
  auto wrapped =
      std::make_shared<DataParallelClassifierImpl>(inner, std::vector<torch::Device>{torch::kCPU});
  const auto x = torch::rand({8, 1, 16, 16});
  const auto labels = torch::randint(0, 10, {8}, torch::kInt64);
  const auto a = plain->forward(x), b = wrapped->forward(x);
  EXPECT_TRUE(torch::allclose(a, b));
  torch::nn::functional::cross_entropy(a, labels).backward();
  torch::nn::functional::cross_entropy(b, labels).backward();
  EXPECT_TRUE(wrapped->parameters().empty()) << "the wrapper must not own parameters";
  const auto pg = plain->parameters(), ig = inner->parameters();
  ASSERT_EQ(pg.size(), ig.size());
  for (size_t i = 0; i < pg.size(); ++i) {
    ASSERT_TRUE(ig[i].grad().defined());
    EXPECT_TRUE(torch::allclose(pg[i].grad(), ig[i].grad())) << i;
  }
}

// Two GPUs or more: a dp run equals a single-device run over the same batches (the batch split and
// the gradient reduce-add are exact up to float summation order).
TEST(DataParallel, DataParallelStrategyMatchesSingleOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c;
  c.strategy = train::Strategy::kDataParallel;
  c.device = "cuda";
  ParallelRun run(c, fake_env({}));
  ASSERT_EQ(run.kind(), StrategyKind::kDataParallel);
  const torch::Device cuda0 = run.pick_device("cuda");
  auto single = make_ann(9), inner = make_ann(9);
  single->to(cuda0);
  inner->to(cuda0);
  // What ClassifierTask::use_data_parallel runs the step on, over the GPUs the run chose.
  auto dp = std::make_shared<DataParallelClassifierImpl>(inner, run.data_parallel_devices());
  const auto x = torch::rand({64, 1, 16, 16}).to(cuda0);
  const auto labels = torch::randint(0, 10, {64}, torch::kInt64).to(cuda0);
  torch::nn::functional::cross_entropy(single->forward(x), labels).backward();
  torch::nn::functional::cross_entropy(dp->forward(x), labels).backward();
  const auto sp = single->parameters(), ip = inner->parameters();
  for (size_t i = 0; i < sp.size(); ++i)
    EXPECT_TRUE(torch::allclose(sp[i].grad(), ip[i].grad(), 1e-4, 1e-6)) << i;
  EXPECT_NE(run.describe().find("dp (DataParallel) over"), std::string::npos) << run.describe();
}

// The process group's options are refused by a run that has none, not ignored (one_rank_test.sh
// runs them under a launcher).
TEST(DataParallel, DdpOptionsAreRefusedByASingleProcess) {
  const auto refused = [](const std::function<void(TrainConfig&)>& set, const std::string& flag) {
    TrainConfig c;
    set(c);
    try {
      ParallelRun run(c, fake_env({}));
      ADD_FAILURE() << flag << " accepted by a single process";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                flag +
                    " applies to ddp runs (one process per device); this run is a single "
                    "process");
    }
  };
  refused([](TrainConfig& c) { c.bucket_mb = 10; }, "--bucket-mb");
  refused([](TrainConfig& c) { c.overlap = false; }, "--no-overlap");
  refused([](TrainConfig& c) { c.dist_shard = DistShard::kGlobal; }, "--dist-shard");
  refused([](TrainConfig& c) { c.dist_backend = DistBackend::kGloo; }, "--dist-backend");
  refused([](TrainConfig& c) { c.dist_timeout_s = 30; }, "--dist-timeout");
  // Their defaults (a config.toml records them) pass.
  const TrainConfig defaults;
  EXPECT_NO_THROW({ ParallelRun run(defaults, fake_env({})); });
}

TEST(DataParallel, DataParallelStrategyIsRefusedWithoutCuda) {
  if (SPRITETORCH_WITH_CUDA) GTEST_SKIP() << "CUDA build";
  TrainConfig c;
  c.strategy = train::Strategy::kDataParallel;
  try {
    ParallelRun run(c, fake_env({}));
    ADD_FAILURE() << "dp accepted on a CPU-only build";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA build"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spritetorch::train
