#include "train/config.h"

#include "common/error.h"

namespace spritetorch::train {

const Choices<TaskKind>& choices_of(TaskKind) {
  static const Choices<TaskKind> c{
      {{TaskKind::kClassify, "classify"}, {TaskKind::kGenerate, "generate"}}};
  return c;
}
const Choices<StepKind>& choices_of(StepKind) {
  static const Choices<StepKind> c{
      {{StepKind::kAuto, "auto"}, {StepKind::kAutograd, "autograd"}, {StepKind::kFused, "fused"}}};
  return c;
}
const Choices<Strategy>& choices_of(Strategy) {
  static const Choices<Strategy> c{{{Strategy::kAuto, "auto"},
                                    {Strategy::kSingle, "single"},
                                    {Strategy::kDataParallel, "dp"},
                                    {Strategy::kDdp, "ddp"}}};
  return c;
}
const Choices<DistBackend>& choices_of(DistBackend) {
  static const Choices<DistBackend> c{
      {{DistBackend::kAuto, "auto"}, {DistBackend::kGloo, "gloo"}, {DistBackend::kNccl, "nccl"}}};
  return c;
}
const Choices<DistShard>& choices_of(DistShard) {
  static const Choices<DistShard> c{
      {{DistShard::kAuto, "auto"}, {DistShard::kGlobal, "global"}, {DistShard::kLocal, "local"}}};
  return c;
}
const Choices<CudaGraphs>& choices_of(CudaGraphs) {
  static const Choices<CudaGraphs> c{
      {{CudaGraphs::kAuto, "auto"}, {CudaGraphs::kOn, "on"}, {CudaGraphs::kOff, "off"}}};
  return c;
}

const Choices<ThreadGovernorMode>& choices_of(ThreadGovernorMode) {
  static const Choices<ThreadGovernorMode> c{{{ThreadGovernorMode::kAuto, "auto"},
                                              {ThreadGovernorMode::kOn, "on"},
                                              {ThreadGovernorMode::kOff, "off"}}};
  return c;
}

std::string default_model(const TrainConfig& config) {
  if (config.task == TaskKind::kGenerate) return "unet";
  return data::is_sprite_dataset(config.dataset) ? "cnn" : "ann";
}

void check_thread_governor_counts(const TrainConfig& config) {
  if (config.thread_governor == ThreadGovernorMode::kOn &&
      (config.threads > 0 || config.blas_threads > 0 || config.step_threads > 0))
    throw Error(
        "--thread-governor on cannot lower thread counts that were given (--threads, "
        "--blas-threads, --step-threads)",
        "drop the counts, or --thread-governor");
}

}  // namespace spritetorch::train
