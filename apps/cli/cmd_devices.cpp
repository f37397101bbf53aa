// `spritetorch devices`: what this machine and this build can run on, and what `auto` picks.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/bf16_gemm.h"
#include "common/compat.h"
#include "common/cpu_threads.h"
#include "common/small_gemm.h"
#include "device/device.h"
#include "diffusion/group_norm_silu.h"
#include "distributed/communicator.h"
#include "models/bn_relu_pool.h"
#include "models/conv3x3.h"
#include "precision/precision.h"
#include "train/adam_kernels.h"

namespace spritetorch::cli {

namespace {

std::string gib(int64_t bytes) {
  if (bytes < 0) return "?";
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1024.0 * 1024 * 1024)
    << " GiB";
  return s.str();
}

}  // namespace

Subcommand add_devices_command(CLI::App& app) {
  auto* sub = app.add_subcommand("devices",
                                 "List every device with its memory and capabilities, "
                                 "and the one --device auto picks");
  auto json = std::make_shared<bool>(false);
  sub->add_flag("--json", *json, "Print one JSON object instead of the table");
  return {
      sub, [json]() {
        const auto devices = device::list_devices();
        const torch::Device picked = device::pick_device("auto");
        const CpuThreads threads = current_cpu_threads();
        const std::string blas_core = openblas_core();
        const std::string blas_warning = openblas_core_warning();
        // What --dist-backend accepts in this build (gloo: c10d's Gloo headers were found;
        // nccl: a CUDA build that found <nccl.h>).
        const std::vector<std::string> backends = distributed::backends();
        std::string dist_backends;
        for (const auto& b : backends) dist_backends += (dist_backends.empty() ? "" : ", ") + b;
        if (dist_backends.empty()) dist_backends = "none (ddp cannot run)";
        // The fused CPU step's matrix kernel, and every one this CPU could run.
        const char* gemm_kernel = gemm::kernel_name(gemm::best_kernel());
        std::vector<std::string> gemm_kernels;
        for (auto k :
             {gemm::Kernel::avx512, gemm::Kernel::avx2, gemm::Kernel::blas, gemm::Kernel::loops})
          if (gemm::available(k)) gemm_kernels.push_back(gemm::kernel_name(k));
        const std::string bn_relu_pool = models::bn_relu_pool_code();  // "off" or its code path
        const std::string group_norm_silu = diffusion::group_norm_silu_fusion() ? "fused" : "off";
        // The fused ops (the norm's, the convolutions) in a build whose loops use one thread.
        const std::string one_thread_note =
            models::bn_relu_pool_threaded() ? ""
                                            : " (this build: only where LibTorch has one thread)";
        std::string gemm_list;
        for (const auto& k : gemm_kernels) gemm_list += (gemm_list.empty() ? "" : ", ") + k;
        if (*json) {
          nlohmann::json list = nlohmann::json::array();
          for (const auto& d : devices)
            list.push_back({{"device", d.device.str()},
                            {"name", d.name},
                            {"total_memory", d.total_memory},
                            {"free_memory", d.free_memory},
                            {"compute_capability", d.compute_capability},
                            {"bf16", d.bf16},
                            {"bf16_auto", d.bf16_auto},
                            {"fp16", d.fp16}});
          std::cout << nlohmann::json{{"devices", list},
                                      {"auto", picked.str()},
                                      {"libtorch", compat::torch_version()},
                                      {"cuda_built", SPRITETORCH_WITH_CUDA != 0},
                                      {"mps_available", compat::mps_available()},
                                      {"distributed_backends", backends},
                                      {"blas", threads.blas_name},
                                      {"blas_core", blas_core},
                                      {"blas_warning", blas_warning},
                                      {"cpu_gemm_kernel", gemm_kernel},
                                      {"cpu_gemm_kernels", gemm_kernels},
                                      {"cpu_gemm_bf16", bf16::available()},
                                      {"cpu_adam_kernel", train::adam_kernel_name()},
                                      {"cpu_bn_relu_pool", bn_relu_pool},
                                      {"cpu_bn_relu_pool_channels_last",
                                       models::bn_relu_pool_channels_last()},
                                      {"cpu_conv3x3", models::conv3x3_code()},
                                      {"group_norm_silu", group_norm_silu},
                                      {"cuda_group_norm_silu_kernel",
                                       diffusion::group_norm_silu_cuda_kernel_built()},
                                      {"intra_op_threads", threads.intra_op},
                                      {"blas_threads", threads.blas}}
                           .dump(2)
                    << "\n";
          return 0;
        }
        std::cout << std::left << std::setw(8) << "device" << std::setw(44) << "name"
                  << std::setw(12) << "total" << std::setw(12) << "free" << std::setw(6) << "cc"
                  << std::setw(6) << "bf16"
                  << "fp16\n";
        for (const auto& d : devices)
          std::cout << std::setw(8) << d.device.str() << std::setw(44) << d.name.substr(0, 43)
                    << std::setw(12) << gib(d.total_memory) << std::setw(12) << gib(d.free_memory)
                    << std::setw(6) << (d.compute_capability.empty() ? "-" : d.compute_capability)
                    << std::setw(6) << (d.bf16 ? "yes" : "no") << (d.fp16 ? "yes" : "no") << "\n";
        std::cout << "\nauto picks: " << device::display_name(picked)
                  << "; --precision auto there: "
                  << precision::resolve_precision(precision::Precision::kAuto,
                                                  device::describe_device(picked))
                         .description
                  // The CPU's fused MLP step takes its own bf16 or fp32 form under auto.
                  << (picked.is_cpu() ? " for models without the fused CPU step (MLPs: see train's "
                                        "settings)"
                                      : "")
                  << "\n"
                  << "LibTorch " << compat::torch_version()
                  << "; built with CUDA: " << (SPRITETORCH_WITH_CUDA ? "yes" : "no")
                  << "; MPS: " << (compat::mps_available() ? "yes" : "no")
                  << "; distributed (c10d) backends: " << dist_backends << "\n"
                  << "BLAS: " << threads.blas_name << "\n"
                  << (blas_warning.empty() ? "" : "warning: " + blas_warning + "\n")
                  << "fused MLP step's matrix kernels (CPU): " << gemm_kernel
                  << " (this CPU runs: " << gemm_list
                  << "); its Adam update: " << train::adam_kernel_name() << "; under bf16: "
                  << (bf16::available() ? "layer 1 in avx512_bf16"
                                        : "none (needs AVX512_BF16; autograd under autocast)")
                  << "\n"
                  << "CNNs' BatchNorm + ReLU + max-pool in training (CPU): "
                  << (bn_relu_pool == "off"
                          ? std::string("LibTorch's ops (SPRITETORCH_FUSED_BN_POOL=0)")
                          : "fused, " + bn_relu_pool +
                                (models::bn_relu_pool_channels_last()
                                     ? " (NCHW and channels_last)"
                                     : " (NCHW; channels_last takes LibTorch's ops)") +
                                one_thread_note)
                  << "\n"
                  << "3x3 convolutions of the CNNs (after the first) and the UNet's ResBlocks "
                     "(CPU, fp32): "
                  << (models::conv3x3_code() == "avx2"
                          ? "avx2 kernels" + one_thread_note
                          : std::string("LibTorch's (oneDNN)") +
                                (models::conv3x3_kernel() ? "" : " (SPRITETORCH_CONV3X3=0)"))
                  << "\n"
                  << "the UNet's GroupNorm + SiLU: "
                  << (group_norm_silu == "off"
                          ? std::string("LibTorch's ops (SPRITETORCH_GROUP_NORM_SILU=0)")
                          : std::string("fused on the CPU (fp32)") +
                                (diffusion::group_norm_silu_cuda_kernel_built()
                                     ? "; sampling on CUDA (fp32, bf16; NCHW, channels_last): "
                                       "spritetorch's kernel"
                                 : SPRITETORCH_WITH_CUDA
                                     ? "; on CUDA LibTorch's ops (kernel not built)"
                                     : ""))
                  << "\n"
                  << "CPU threads: " << describe_cpu_threads(threads) << "\n";
        return 0;
      }};
}

}  // namespace spritetorch::cli
