#include "distributed/communicator.h"

#include <sstream>
#include <thread>

#include "common/error.h"

// c10d's headers declare the backends only when USE_C10D_* is defined (LibTorch's own build and
// Debian's TorchConfig define them); the symbols are in libtorch_cpu (Gloo) and libtorch_cuda
// (NCCL). NCCL needs <nccl.h>, which a pip torch keeps in the nvidia-nccl package: without it on
// the include path (CPATH=.../site-packages/nvidia/nccl/include) the NCCL backend is left out.
#if SPRITETORCH_WITH_CUDA && defined(__has_include)
#if __has_include(<nccl.h>)
#define SPRITETORCH_WITH_NCCL 1
#endif
#endif
#ifndef SPRITETORCH_WITH_NCCL
#define SPRITETORCH_WITH_NCCL 0
#endif
#define SPRITETORCH_WITH_C10D (SPRITETORCH_WITH_GLOO || SPRITETORCH_WITH_NCCL)

#if SPRITETORCH_WITH_C10D
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
#if SPRITETORCH_WITH_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if SPRITETORCH_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace spritetorch::distributed {

void check_dist_timeout(double seconds) {
  constexpr double kYear = 8760 * 3600.0;
  if (seconds >= 1 && seconds <= kYear) return;
  std::ostringstream seconds_text;
  seconds_text << seconds;
  throw Error("--dist-timeout must be 1 to 31536000 seconds (a year), got " + seconds_text.str());
}

#if SPRITETORCH_WITH_C10D

namespace {

std::string describe(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

// Rank 0 alone evaluates and draws sample sheets between steps, and its peers wait for it at the
// next collective: a long evaluation looks like a hang from there.
const char* kFaultHint =
    "another rank probably exited or hung; look at its output first. The wait is bounded by "
    "--dist-timeout, which must also cover rank 0's evaluations and sample sheets between steps "
    "(the other ranks wait for it)";

// Runs `fn`, turning whatever c10d or Gloo throws into an Error that names the rank and operation.
template <typename Fn>
auto guarded(int rank, const std::string& op, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(rank) + ": " + op + " failed: " + describe(e), kFaultHint);
  }
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

class C10dPendingOp : public PendingOp {
 public:
  C10dPendingOp(c10::intrusive_ptr<c10d::Work> work, int rank, std::chrono::milliseconds timeout)
      : work_(std::move(work)), rank_(rank), timeout_(timeout) {}
  void wait() override {
    guarded(rank_, "all-reduce", [&] { return work_->wait(timeout_); });
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

// PG: c10d::ProcessGroupGloo or c10d::ProcessGroupNCCL (their common base differs between
// LibTorch 1.13 and 2.x, so the concrete type is kept).
template <typename PG>
class C10dCommunicator : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<PG> group,
                   std::string backend, int rank, int world, std::chrono::milliseconds timeout)
      : store_(std::move(store)),
        group_(std::move(group)),
        backend_(std::move(backend)),
        rank_(rank),
        world_(world),
        timeout_(timeout) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return backend_; }

  void allreduce_sum(torch::Tensor& tensor) override { allreduce_sum_async(tensor)->wait(); }

  std::unique_ptr<PendingOp> allreduce_sum_async(torch::Tensor tensor) override {
    return guarded(rank_, "all-reduce", [&] {
      std::vector<at::Tensor> tensors{std::move(tensor)};
      c10d::AllreduceOptions options;
      options.timeout = timeout_;
      return std::make_unique<C10dPendingOp>(group_->allreduce(tensors, options), rank_, timeout_);
    });
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    guarded(rank_, "broadcast", [&] {
      std::vector<at::Tensor> tensors{tensor};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      options.timeout = timeout_;
      return group_->broadcast(tensors, options)->wait(timeout_);
    });
  }

  void barrier() override {
    guarded(rank_, "barrier", [&] {
      c10d::BarrierOptions options;
      options.timeout = timeout_;
      return group_->barrier(options)->wait(timeout_);
    });
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;  // kept alive: rank 0's holds the rendezvous server
  c10::intrusive_ptr<PG> group_;
  std::string backend_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
};

#if SPRITETORCH_WITH_GLOO
bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  // Like torch.distributed: GLOO_SOCKET_IFNAME picks the interface; on one machine the loopback
  // interface is used; otherwise the interface the host name resolves to.
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (is_loopback(env.master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

}  // namespace

bool distributed_available() { return true; }

std::vector<std::string> backends() {
  std::vector<std::string> out;
  if (SPRITETORCH_WITH_GLOO) out.push_back("gloo");
  if (SPRITETORCH_WITH_NCCL) out.push_back("nccl");
  return out;
}

std::shared_ptr<Communicator> create_communicator(const DistEnv& env, const CommOptions& options) {
  check_dist_timeout(options.timeout_s);
  const auto timeout = to_ms(options.timeout_s);
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(env.master_port);
    store_options.isServer = env.rank == 0 && !env.agent_store;
    store_options.numWorkers = static_cast<size_t>(env.world_size);
    // TCPStore's own wait for the workers gives up silently in 1.13; we count arrivals below.
    store_options.waitWorkers = false;
    store_options.timeout = timeout;
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    if (env.agent_store)  // torchrun's store outlives restarts: one key space per attempt
      store = c10::make_intrusive<c10d::PrefixStore>(
          "/worker/attempt_" + std::to_string(env.restart_count), store);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + ": rendezvous at " + where +
                    " failed within " + std::to_string(static_cast<int>(options.timeout_s)) +
                    " s: " + describe(e),
                env.rank == 0 && !env.agent_store
                    ? "is MASTER_PORT free, and did all " + std::to_string(env.world_size) +
                          " ranks start? (--dist-timeout bounds the wait)"
                : env.agent_store
                    ? "torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE): is it "
                      "still running, and MASTER_ADDR:MASTER_PORT reachable from this machine? "
                      "(--dist-timeout bounds the wait)"
                    : "is rank 0 running and MASTER_ADDR:MASTER_PORT reachable from this machine? "
                      "(--dist-timeout bounds the wait)");
  }

  // Every rank must arrive within the timeout; otherwise say how many did.
  int64_t joined = 0;
  try {
    joined = store->add("spritetorch/joined", 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (joined < env.world_size && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      joined = store->add("spritetorch/joined", 0);
    }
  } catch (const std::exception& e) {
    throw Error(
        "rank " + std::to_string(env.rank) + ": rendezvous at " + where + " failed: " + describe(e),
        "rank 0 (which hosts the rendezvous) probably exited; look at its output");
  }
  if (joined < env.world_size)
    throw Error("rank " + std::to_string(env.rank) + ": rendezvous at " + where + " failed: only " +
                    std::to_string(joined) + " of " + std::to_string(env.world_size) +
                    " ranks arrived within " + std::to_string(static_cast<int>(options.timeout_s)) +
                    " s",
                "start every rank (WORLD_SIZE=" + std::to_string(env.world_size) +
                    "), or raise --dist-timeout");

  if (options.backend == "gloo") {
#if SPRITETORCH_WITH_GLOO
    auto group = guarded(env.rank, "connecting the Gloo process group", [&] {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo_options->devices.push_back(gloo_device(env));
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size,
                                                         gloo_options);
    });
    return std::make_shared<C10dCommunicator<c10d::ProcessGroupGloo>>(
        store, group, "gloo", env.rank, env.world_size, timeout);
#else
    throw Error("--dist-backend gloo: this spritetorch was built without c10d's Gloo headers",
                "use --dist-backend nccl, or install libgloo-dev (Debian) and rebuild");
#endif
  }
  if (options.backend == "nccl") {
#if SPRITETORCH_WITH_NCCL
    auto group = guarded(env.rank, "connecting the NCCL process group", [&] {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size,
                                                         nccl_options);
    });
    return std::make_shared<C10dCommunicator<c10d::ProcessGroupNCCL>>(
        store, group, "nccl", env.rank, env.world_size, timeout);
#else
    if (SPRITETORCH_WITH_CUDA)
      throw Error("--dist-backend nccl: this CUDA build found no <nccl.h> when it was compiled",
                  "put the NCCL headers on the include path (pip torch: "
                  "CPATH=<site-packages>/nvidia/nccl/include) and rebuild, or use --dist-backend "
                  "gloo");
    throw Error("--dist-backend nccl needs a CUDA build of spritetorch (this one is CPU-only)",
                "use --dist-backend gloo");
#endif
  }
  throw Error("unknown --dist-backend '" + options.backend + "': expected gloo or nccl");
}

#else  // no c10d backend: the stub

bool distributed_available() { return false; }
std::vector<std::string> backends() { return {}; }

std::shared_ptr<Communicator> create_communicator(const DistEnv&, const CommOptions&) {
  throw Error(
      "this spritetorch was built without torch.distributed's c10d Gloo backend, so it "
      "cannot train with several processes",
      "on Debian: apt-get install libgloo-dev, then re-run cmake and rebuild; or use "
      "--strategy single");
}

#endif

}  // namespace spritetorch::distributed
