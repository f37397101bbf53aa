#include "common/cpu_threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>
#include <thread>

namespace spritetorch {

namespace {

// OpenBLAS is reached through Debian's libblas.so.3 alternative, so its symbols are looked up at
// run time rather than linked: with the reference BLAS they are simply absent.
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using GetConfigFn = char* (*)();

template <typename Fn>
Fn find_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

CpuThreads current_cpu_threads() {
  CpuThreads out;
  out.intra_op = at::get_num_threads();
  if (auto get = find_symbol<GetThreadsFn>("openblas_get_num_threads")) out.blas = get();
  if (auto config = find_symbol<GetConfigFn>("openblas_get_config"))
    out.blas_name = config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Zen MAX_THREADS=64"
  else
    out.blas_name = "BLAS without OpenBLAS symbols (reference BLAS? install libopenblas0-pthread)";
  return out;
}

CpuWork cpu_work_of(const torch::nn::Module& model) {
  for (const auto& p : model.parameters())
    if (p.dim() == 4) return CpuWork::kConvolutions;
  return CpuWork::kMatmuls;
}

int cpu_cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

CpuThreads apply_cpu_threads(int intra_op, int blas, CpuWork work, int cores) {
  cores = std::max(1, cores);
  const bool conv = work == CpuWork::kConvolutions;
  int intra = intra_op, blas_threads = blas;
  if (intra <= 0) intra = std::min(conv ? cores : 1, std::max(1, cores / std::max(1, blas)));
  if (blas_threads <= 0) blas_threads = std::min(conv ? 1 : cores, std::max(1, cores / intra));
  at::set_num_threads(intra);
  if (auto set = find_symbol<SetThreadsFn>("openblas_set_num_threads")) set(blas_threads);
  return current_cpu_threads();
}

std::string describe_cpu_threads(const CpuThreads& threads) {
  return std::to_string(threads.intra_op) + " intra-op, " +
         (threads.blas > 0 ? std::to_string(threads.blas) : std::string("?")) + " BLAS";
}

}  // namespace spritetorch
