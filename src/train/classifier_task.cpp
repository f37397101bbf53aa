#include "train/classifier_task.h"

#include "common/error.h"
#include "train/amp_step.h"
#include "train/data_parallel.h"
#include "train/model_state.h"

namespace spritetorch::train {

std::unique_ptr<TrainStep> Task::fast_step(const FastStepSetup& setup) {
  if (setup.kind == StepKind::kFused)
    throw Error("--step fused is a classifier's fused MLP step; task '" + name() + "' has none",
                "use --step auto");
  return nullptr;
}

void Task::load(const Checkpoint& checkpoint, const std::string& source) {
  load_model_state(module(), checkpoint.model, source);
}

std::unique_ptr<ClassifierTask> ClassifierTask::builtin(std::string requested,
                                                        std::string fallback) {
  std::unique_ptr<ClassifierTask> task(new ClassifierTask());
  task->requested_ = std::move(requested);
  task->fallback_ = std::move(fallback);
  return task;
}

ClassifierTask::ClassifierTask(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                               std::string model_name)
    : model_name_(std::move(model_name)), module_(std::move(module)), forward_(std::move(forward)) {
  if (!module_ || !forward_) throw Error("ClassifierTask: no module or no forward function");
  loss_ = classifier_loss(forward_);
}

TaskTraits ClassifierTask::traits() const {
  TaskTraits traits;
  traits.data_parallel = builtin_ != nullptr || module_ == nullptr;  // dp replicas clone our models
  return traits;
}

void ClassifierTask::build(const TaskSetup& setup) {
  const data::Dataset& train = setup.train;
  auto sizes = train.inputs.sizes().vec();
  sizes.erase(sizes.begin());
  input_shape_ = sizes;
  classes_ = train.num_classes();
  if (module_) return;  // the user's module, as given
  model_name_ = requested_.empty() ? fallback_ : requested_;
  if (setup.resumed) {  // the checkpoint decides; a conflicting request is an error, not a surprise
    const auto saved = setup.resumed->meta.value("model", std::string());
    if (!requested_.empty() && requested_ != saved)
      throw Error("--resume " + setup.resume_source + " holds model '" + saved + "' but --model " +
                  requested_ + " was given");
    model_name_ = saved;
  }
  builtin_ = models::make_model({model_name_, input_shape_, classes_});
  module_ = builtin_;
  forward_ = [model = builtin_](const torch::Tensor& x) { return model->forward(x); };
  loss_ = classifier_loss(forward_);
}

std::unique_ptr<TrainStep> ClassifierTask::fast_step(const FastStepSetup& setup) {
  const auto layers =
      builtin_ && !data_parallel_ ? builtin_->relu_mlp_layers() : std::vector<torch::nn::Linear>{};
  if (setup.kind == StepKind::kAutograd) return nullptr;
  if (layers.empty()) {
    if (setup.kind == StepKind::kFused)
      throw Error("--step fused needs a ReLU MLP (ann, simplenn)", "use --step auto");
    return nullptr;
  }
  const auto& p = setup.precision;
  if (p.plan.autocast || p.scaler || p.channels_last) {
    if (setup.kind == StepKind::kFused)
      throw Error("--step fused computes in fp32 only; it cannot be combined with --precision " +
                      precision::to_string(p.plan.precision),
                  "use --step auto (autograd under autocast) or --precision fp32");
    return nullptr;  // the fused step computes in fp32 only: autograd under autocast
  }
  return make_train_step(builtin_, setup.max_batch, setup.kind, setup.cpu_threads);
}

void ClassifierTask::use_data_parallel(const std::vector<torch::Device>& devices) {
  if (!builtin_) throw Error("--strategy dp replicates built-in models only", "use ddp");
  data_parallel_ = true;
  auto wrapper = std::make_shared<DataParallelClassifierImpl>(builtin_, devices);
  loss_ = classifier_loss([wrapper](const torch::Tensor& x) { return wrapper->forward(x); });
}

EvalReport ClassifierTask::evaluate(data::Loader& test, bool keep_predictions) {
  return train::evaluate(forward_, *module_, test, classes_, keep_predictions);
}

void ClassifierTask::save(Checkpoint& checkpoint) const {
  checkpoint.meta["model"] = model_name_;
  checkpoint.meta["input_shape"] = input_shape_;
  checkpoint.meta["classes"] = classes_;
}

Settings ClassifierTask::settings() const {
  int64_t parameters = 0;
  for (const auto& p : module_->parameters()) parameters += p.numel();
  return {{"model", model_name_ + " (" + std::to_string(parameters) + " parameters)"}};
}

}  // namespace spritetorch::train
