#include "common/cpu_threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

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

CpuThreads apply_cpu_threads(int intra_op, int blas) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(intra_op > 0 ? intra_op : 1);
  if (auto set = find_symbol<SetThreadsFn>("openblas_set_num_threads")) set(blas > 0 ? blas : cores);
  return current_cpu_threads();
}

}  // namespace spritetorch
