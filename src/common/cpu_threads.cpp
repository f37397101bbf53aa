#include "common/cpu_threads.h"

#include <dlfcn.h>
#include <sched.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace spritetorch {

namespace {

// OpenBLAS is reached through Debian's libblas.so.3 alternative, so its symbols are looked up at
// run time rather than linked: with the reference BLAS they are simply absent.
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using GetConfigFn = char* (*)();
using GetCoreNameFn = char* (*)();

template <typename Fn>
Fn find_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

CpuThreads current_cpu_threads() {
  CpuThreads out;
  out.intra_op = at::get_num_threads();
  if (auto get = find_symbol<GetThreadsFn>("openblas_get_num_threads")) out.blas = get();
  auto config = find_symbol<GetConfigFn>("openblas_get_config");
  out.blas_name = describe_blas(config ? config() : nullptr, at::hasMKL());
  return out;
}

std::string describe_blas(const char* openblas_config, bool libtorch_has_mkl) {
  // A pip torch carries MKL inside itself: it does LibTorch's matrix products, and
  // at::set_num_threads sets its threads too, so --blas-threads has nothing to set there.
  if (libtorch_has_mkl)
    return "MKL inside LibTorch (its threads follow --threads; --blas-threads does not apply)";
  if (openblas_config)
    return openblas_config;  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Zen MAX_THREADS=64"
  return "BLAS without OpenBLAS symbols (reference BLAS? install libopenblas0-pthread)";
}

std::string openblas_core_advice(const char* core, bool cpu_avx2_fma, bool cpu_avx512) {
  if (core == nullptr || !cpu_avx2_fma) return "";
  // OpenBLAS 0.3.21's x86-64 core names (driver/others/dynamic.c) with AVX-512 sgemm kernels.
  static const char* const kAvx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  // Those whose kernels stop short of AVX2 and FMA (an AMD core it knows, "Zen", runs the Haswell
  // kernels: AVX2).
  static const char* const kBelowAvx2[] = {"Katmai",     "Coppermine", "Northwood",  "Prescott",
                                           "Banias",     "Atom",       "Core2",      "Penryn",
                                           "Dunnington", "Nehalem",    "Sandybridge"};
  auto one_of = [core](const auto& names) {
    for (const char* name : names)
      if (std::strcmp(core, name) == 0) return true;
    return false;
  };
  if (cpu_avx512) return one_of(kAvx512) ? "" : "SkylakeX";
  return one_of(kBelowAvx2) ? "Haswell" : "";
}

std::string openblas_core() {
  auto get = find_symbol<GetCoreNameFn>("openblas_get_corename");
  const char* name = get ? get() : nullptr;
  return name ? name : "";
}

std::string openblas_core_warning() {
#if defined(__x86_64__)
  if (at::hasMKL()) return "";  // LibTorch multiplies with its own MKL, whatever else is loaded
  const std::string core = openblas_core();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const std::string advice =
      openblas_core_advice(core.empty() ? nullptr : core.c_str(), avx2, avx512);
  if (advice.empty()) return "";
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  const std::string cpu = avx512 ? "AVX-512" : "AVX2";
  const std::string why = set != nullptr && *set != 0
                              ? "OPENBLAS_CORETYPE=" + std::string(set) +
                                    " in the environment runs OpenBLAS's " + core +
                                    " kernels on this " + cpu + " CPU"
                              : "OpenBLAS runs its " + core + " kernels on this " + cpu +
                                    " CPU (it does not know the CPU's model)";
  return why +
         ", so LibTorch's matrix products run at a fraction of the CPU's speed: run with "
         "OPENBLAS_CORETYPE=" +
         advice + " in the environment";
#else
  return "";  // the fallback to pre-AVX2 kernels is an x86 one
#endif
}

CpuWork cpu_work_of(const torch::nn::Module& model) {
  for (const auto& p : model.parameters())
    if (p.dim() == 4) return CpuWork::kConvolutions;
  return CpuWork::kMatmuls;
}

namespace {

// The threads an OMP_NUM_THREADS value asks for: "4" -> 4; "4,2" (nested levels) -> its first
// level; 0 for null, empty, junk or <= 0, which OpenMP ignores.
long omp_thread_count(const char* omp_num_threads) {
  if (omp_num_threads == nullptr || *omp_num_threads == 0) return 0;
  char* end = nullptr;
  const long count = std::strtol(omp_num_threads, &end, 10);
  return end != omp_num_threads && (*end == 0 || *end == ',') && count > 0 ? count : 0;
}

}  // namespace

int cpu_cores_for(int allowed_cpus, int share, const char* omp_num_threads) {
  const int cores = std::max(1, allowed_cpus / std::max(1, share));
  const long cap = omp_thread_count(omp_num_threads);
  return cap > 0 ? static_cast<int>(std::min<long>(cores, cap)) : cores;
}

int cpu_cores(int share) {
  // The CPUs this process may run on (taskset, a cgroup cpuset, Slurm's --cpus-per-task) rather
  // than the machine's: a thread per machine core on 2 allowed cores is the oversubscription
  // this header warns of.
  int allowed = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = CPU_COUNT(&set);
  return cpu_cores_for(allowed, share, std::getenv("OMP_NUM_THREADS"));
}

bool cap_threads_from_environment() {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (omp == nullptr) return false;
  const int cores = cpu_cores();
  const long count = omp_thread_count(omp);
  if (count > 0 && count <= cores) return false;
  at::set_num_threads(cores);
  return true;
}

CpuThreads apply_cpu_threads(int intra_op, int blas, CpuWork work, int cores) {
  cores = std::max(1, cores);
  const bool conv = work == CpuWork::kConvolutions;
  int intra = intra_op, blas_threads = blas;
  if (intra <= 0) intra = std::min(conv ? cores : 1, std::max(1, cores / std::max(1, blas)));
  if (blas_threads <= 0) blas_threads = std::min(conv ? 1 : cores, std::max(1, cores / intra));
  at::set_num_threads(intra);
  set_blas_threads(blas_threads);
  return current_cpu_threads();
}

void set_blas_threads(int threads) {
  if (auto set = find_symbol<SetThreadsFn>("openblas_set_num_threads")) set(threads);
}

std::string describe_cpu_threads(const CpuThreads& threads) {
  return std::to_string(threads.intra_op) + " intra-op, " +
         (threads.blas > 0 ? std::to_string(threads.blas) : std::string("?")) + " BLAS";
}

}  // namespace spritetorch
