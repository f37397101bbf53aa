// CPU thread settings. LibTorch's intra-op pool and the BLAS library each run their own threads;
// letting both use every core oversubscribes it (measured: 4x slower on 2 cores), so spritetorch
// sets both explicitly and says what it chose.
#pragma once

#include <torch/nn/module.h>

#include <string>

namespace spritetorch {

struct CpuThreads {
  int intra_op = 1;       // at::get_num_threads() after the change
  int blas = -1;          // OpenBLAS threads after the change; -1 = not OpenBLAS / unknown
  std::string blas_name;  // describe_blas(): "OpenBLAS 0.3.21 ...", "MKL inside LibTorch ...", ...
};

// What a model mostly computes on the CPU. It decides which of the two thread pools gets the cores
// by default (measured on 2 cores, docs/benchmarks.md "CPU threads"):
//   kMatmuls       MLPs: a few matrix products per step, all inside BLAS -> BLAS = cores,
//                  intra-op 1 (intra 2 / BLAS 1 is 1.35x slower on the seed MLP through autograd);
//   kConvolutions  conv nets (cnn, the generator's UNet): LibTorch's own kernels -> intra-op =
//                  cores, BLAS 1 (1.5-1.75x faster than intra 1 / BLAS 2 for both).
// Both pools at every core oversubscribes them: 4-5x slower on the seed workload.
enum class CpuWork { kMatmuls, kConvolutions };
// kConvolutions when the model has a 4-d (convolution) weight, else kMatmuls.
CpuWork cpu_work_of(const torch::nn::Module& model);
// The cores spritetorch's thread defaults share out: the CPUs this process may run on (its
// affinity mask), divided among `share` processes (the ranks on this machine), then capped by
// OMP_NUM_THREADS when that is a positive number (what users and torchrun set to say "this many
// threads per process"); at least 1.
int cpu_cores(int share = 1);
// The same from its inputs (omp_num_threads may be null).
int cpu_cores_for(int allowed_cpus, int share, const char* omp_num_threads);

// LibTorch sizes its thread pool from OMP_NUM_THREADS at its first parallel op, which can come
// before a command sets its threads (loading a dataset): 65536 started that many threads and
// crashed, and a value OpenMP cannot read printed a stack trace. At start, a value above
// cpu_cores() or unreadable (empty, 0, junk) sets LibTorch's threads to cpu_cores() instead;
// any other leaves LibTorch's default alone. Returns whether it set them.
bool cap_threads_from_environment();

// Sets LibTorch's intra-op threads and OpenBLAS's threads; 0 = spritetorch's default for `work`
// on `cores` cores (under ddp, a rank's share). When only one of the two is given, the other
// defaults to what is left of the cores (at least 1), so the two pools never oversubscribe them
// unless both are given.
CpuThreads apply_cpu_threads(int intra_op, int blas, CpuWork work, int cores = cpu_cores());
// OpenBLAS's threads alone (nothing where BLAS is not OpenBLAS).
void set_blas_threads(int threads);
// The current settings, changing nothing.
CpuThreads current_cpu_threads();
// What does LibTorch's CPU matrix products, for `devices`: LibTorch's own MKL when it has one (a
// pip torch), else OpenBLAS's own description when its symbols are there (openblas_config
// non-null), else a hint that the reference BLAS is probably in use.
std::string describe_blas(const char* openblas_config, bool libtorch_has_mkl);

// OpenBLAS built for every x86 (DYNAMIC_ARCH, as Debian's is) picks its kernels at load by the
// CPU's model number, and a release older than the CPU falls back to its oldest x86-64 kernels:
// Debian 12's 0.3.21 takes an Intel Xeon of family 6 model 207 (5th generation, AVX-512) for a
// "Prescott" and multiplies with SSE3, 4.4x slower than with its own AVX-512 kernels there
// (docs/benchmarks.md, "Intel Xeon"). The environment can narrow them too: with
// OPENBLAS_CORETYPE=Haswell on a Zen 5, whose own pick is Cooperlake, `bench`'s floor (a 2048^3
// sgemm on both cores) measured 205-207 GFLOP/s instead of 371-396 (docs/benchmarks.md, "Zen 5").
// OpenBLAS reads OPENBLAS_CORETYPE before the process's own code runs, so spritetorch cannot change
// the choice; it says so, with the setting that fixes it.
//
// The OPENBLAS_CORETYPE to advise when `core` (openblas_get_corename()) runs narrower vectors than
// the CPU: "SkylakeX" on a CPU with AVX-512 (F, CD, BW, DQ, VL) whose core is not one of
// OpenBLAS's AVX-512 ones, "Haswell" on an AVX2 + FMA CPU whose core stops short of AVX2. Empty
// when the choice is right or when core is null (not OpenBLAS). Whoever chose the core (OpenBLAS
// or OPENBLAS_CORETYPE), the products run below the CPU's speed; the warning's words differ.
std::string openblas_core_advice(const char* core, bool cpu_avx2_fma, bool cpu_avx512);
// The kernels OpenBLAS runs in this process (openblas_get_corename()), or "" when it is not
// OpenBLAS.
std::string openblas_core();
// A sentence for devices, bench and train's settings when openblas_core_advice() advises for this
// process and CPU (naming OPENBLAS_CORETYPE when the environment set it); empty otherwise.
std::string openblas_core_warning();
// "2 intra-op, 1 BLAS" ("?" BLAS when it is not OpenBLAS): the settings tables' and devices' text.
std::string describe_cpu_threads(const CpuThreads& threads);

}  // namespace spritetorch
