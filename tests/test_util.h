// Helpers shared by the tests: scratch folders, tiny IDX writers, the real dataset's location.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/blas.h"
#include "common/compat.h"
#include "common/error.h"
#include "data/fashion_mnist.h"

namespace spritetorch::testing {

// The pid of a child that has exited and been reaped: it names no process now (a writer that died,
// for the stale-temporary tests). 0 when fork fails.
inline pid_t pid_of_a_finished_process() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  if (child < 0) return 0;
  ::waitpid(child, nullptr, 0);
  return child;
}

// Every tensor of `b` (a checkpoint's model: name -> tensor) close to `a`'s of the same name, the
// same names in both; a failure names the tensor and the largest difference.
inline void expect_close_tensors(const std::map<std::string, torch::Tensor>& a,
                                 const std::map<std::string, torch::Tensor>& b, double rtol,
                                 double atol) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_EQ(b.count(name), 1u) << name;
    EXPECT_TRUE(torch::allclose(t, b.at(name), rtol, atol))
        << name << ": max difference " << (t - b.at(name)).abs().max().item<double>();
  }
}

// Whether the backward graph that produced `out` has a node whose name contains `name_part`
// (a custom Function's node is named after its C++ type).
inline bool backward_graph_has(const torch::Tensor& out, const std::string& name_part) {
  std::vector<torch::autograd::Node*> todo = {out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node).second) continue;
    if (node->name().find(name_part) != std::string::npos) return true;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return false;
}

// The AddressSanitizer build (scripts/sanitize) runs a training step ~10x slower than Release:
// the tests that train for a while to see something size their work by this.
#if defined(__SANITIZE_ADDRESS__)
#define SPRITETORCH_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPRITETORCH_TEST_ASAN 1
#endif
#endif
#ifdef SPRITETORCH_TEST_ASAN
inline constexpr bool kAddressSanitized = true;
#else
inline constexpr bool kAddressSanitized = false;
#endif

// What `f` throws as an Error ("" when it returns).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// LibTorch on one thread for a test's duration unless `op_uses_every_thread`: the fused CPU ops
// (GroupNorm + SiLU, BatchNorm + ReLU + max-pool) split their loops over LibTorch's threads only
// where their files were built with OpenMP (g++ against Debian's LibTorch); elsewhere (the clang
// sanitizer build) they run only when LibTorch has one thread.
class OneThreadUnless {
 public:
  explicit OneThreadUnless(bool op_uses_every_thread) : before_(at::get_num_threads()) {
    if (!op_uses_every_thread) at::set_num_threads(1);
  }
  ~OneThreadUnless() {
    if (at::get_num_threads() != before_) at::set_num_threads(before_);
  }
  OneThreadUnless(const OneThreadUnless&) = delete;
  OneThreadUnless& operator=(const OneThreadUnless&) = delete;

 private:
  int before_;
};

// A fresh folder under the system temp dir, removed when the object goes.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("spritetorch-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// `count` child processes that keep a CPU busy each (for at most `seconds`), killed when the
// object goes: the other processes a thread governor must make room for.
class BusyProcesses {
 public:
  BusyProcesses(int count, double seconds) {
    for (int i = 0; i < count; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {  // the child only spins: nothing that could take a lock the fork copied
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        volatile uint64_t turns = 0;
        while (std::chrono::steady_clock::now() < end) turns = turns + 1;
        ::_exit(0);
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~BusyProcesses() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;
  size_t size() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

inline std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

inline void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

inline bool fashion_mnist_installed() {
  return std::filesystem::exists(std::string(data::kDefaultFashionMnistDir) +
                                 "/train-images-idx3-ubyte.gz");
}

// The raw-buffer CPU step needs an exported cblas_sgemm: required of Debian's LibTorch, skipped
// where a LibTorch 2.x keeps its BLAS to itself (compat::cblas_expected).
#define SKIP_WITHOUT_CBLAS()                                                                      \
  do {                                                                                            \
    if (!::spritetorch::blas::has_sgemm()) {                                                      \
      if (::spritetorch::compat::cblas_expected()) FAIL() << "no cblas_sgemm in LibTorch's BLAS"; \
      GTEST_SKIP() << "this LibTorch exports no cblas_sgemm (bundled MKL)";                       \
    }                                                                                             \
  } while (0)

#define SKIP_WITHOUT_FASHION_MNIST()                      \
  if (!::spritetorch::testing::fashion_mnist_installed()) \
  GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"

}  // namespace spritetorch::testing
