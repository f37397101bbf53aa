#include "train/classifier_task.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/error.h"
#include "common/json_field.h"
#include "common/timer.h"
#include "models/eval_mode.h"
#include "models/patch_whitening.h"
#include "models/script_model.h"
#include "train/amp_step.h"
#include "train/data_parallel.h"
#include "train/model_state.h"

namespace spritetorch::train {

namespace {

// The generator's options, refused by name (the CLI's `train` and Trainer::fit alike).
void refuse_generator_options(const TrainConfig& config) {
  if (config.sample_every > 0)
    throw not_for_task("--sample-every", "classify", "sample sheets are a generator's");
  const TrainConfig defaults;
  if (config.unet_base != defaults.unet_base)
    throw not_for_task("--unet-base", "classify", "it sizes the generator's UNet");
  if (config.unet_attention != defaults.unet_attention)
    throw not_for_task("--unet-attention", "classify", "it shapes the generator's UNet");
  if (config.unet_scale_shift != defaults.unet_scale_shift)
    throw not_for_task("--unet-scale-shift", "classify", "it shapes the generator's UNet");
  if (config.unet_mult != defaults.unet_mult)
    throw not_for_task("--unet-mult", "classify", "it shapes the generator's UNet");
  if (config.prediction != defaults.prediction)
    throw not_for_task("--prediction", "classify", "it is what the generator's UNet predicts");
  if (config.noise_schedule != defaults.noise_schedule)
    throw not_for_task("--noise-schedule", "classify", "it is the generator's diffusion");
  if (config.min_snr_gamma != defaults.min_snr_gamma)
    throw not_for_task("--min-snr-gamma", "classify", "it weights the generator's loss");
}

// The user's forward on two training samples (eval mode, no gradient), before any training: logits
// of another shape would train on the wrong classes, or fail in the loss or at the final
// evaluation with LibTorch's words, after the whole run.
void check_logits(torch::nn::Module& module, const ForwardFn& forward, const data::Dataset& train,
                  int64_t classes) {
  if (train.size() == 0) return;  // the loader refuses an empty set, naming it
  const int64_t n = std::min<int64_t>(2, train.size());
  auto x = data::to_model_input(train.inputs.narrow(0, 0, n));
  const auto params = module.parameters();
  if (!params.empty()) x = x.to(params.front().device());
  const std::string input = "a batch of " + train.name + " of shape " + c10::str(x.sizes()) + " (" +
                            c10::toString(x.scalar_type()) + ")";
  torch::Tensor y;
  {
    models::EvalModeScope eval_mode(module);
    try {
      torch::NoGradGuard no_grad;
      y = forward(x);
    } catch (const c10::Error& e) {
      throw Error("the model's forward fails on " + input + ": " +
                  first_line(e.what_without_backtrace()));
    } catch (const Error&) {  // ours, raised inside the forward: it says what failed
      throw;
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {  // a forward of the user's that throws its own error type
      throw Error("the model's forward fails on " + input + ": " + first_line(e.what()));
    }
  }
  if (y.defined() && y.is_floating_point() && y.dim() == 2 && y.size(0) == n &&
      y.size(1) == classes)
    return;
  throw Error("the model's forward maps " + input + " to " +
                  (y.defined() ? "a tensor of shape " + c10::str(y.sizes()) + " (" +
                                     c10::toString(y.scalar_type()) + ")"
                               : std::string("an undefined tensor")) +
                  "; a classifier gives float logits of shape (" + std::to_string(n) + ", " +
                  std::to_string(classes) + ") here, one per class of " + train.name,
              "make its last layer output " + std::to_string(classes) + " values per sample");
}

}  // namespace

std::unique_ptr<ClassifierTask> ClassifierTask::builtin(std::string requested,
                                                        std::string fallback) {
  std::unique_ptr<ClassifierTask> task(new ClassifierTask());
  task->ours_ = true;
  task->requested_ = std::move(requested);
  task->fallback_ = std::move(fallback);
  return task;
}

ClassifierTask::ClassifierTask(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                               std::string model_name)
    : model_name_(std::move(model_name)), module_(std::move(module)), forward_(std::move(forward)) {
  if (!module_ || !forward_) throw Error("ClassifierTask: no module or no forward function");
  // A checkpoint's model name tells a module of the user's own from ours: one named like ours
  // would be read back as ours (and "script" as a TorchScript archive it does not carry).
  const auto& ours = models::model_names();
  if (model_name_.empty() || model_name_ == "script" || model_name_.rfind("script:", 0) == 0 ||
      std::find(ours.begin(), ours.end(), model_name_) != ours.end())
    throw Error("ClassifierTask: '" + model_name_ +
                    "' names one of spritetorch's own models, not a module of yours",
                "give your module a name of its own (it is saved in its checkpoints)");
}

ForwardFn flip_averaged(ForwardFn forward) {
  return [forward = std::move(forward)](const torch::Tensor& x) {
    if (x.dim() != 4)
      throw Error("test-time flip needs images (B, C, H, W); got inputs of " +
                  std::to_string(x.dim()) + " dimensions");
    auto probs = torch::softmax(forward(x).to(torch::kFloat32), 1) +
                 torch::softmax(forward(x.flip({3})).to(torch::kFloat32), 1);  // (B, K)
    return (probs * 0.5).log();
  };
}

ForwardFn checkpoint_forward(const nlohmann::json& meta, const models::Classifier& model,
                             const std::string& source) {
  ForwardFn forward = [model](const torch::Tensor& x) { return model->forward(x); };
  const auto augment =
      json_field(meta, "test_time_augment", std::string("none"), source, "test_time_augment");
  if (augment == "flip") return flip_averaged(std::move(forward));
  if (augment != "none")
    throw DataError(source, "metadata 'test_time_augment' as none or flip", "'" + augment + "'");
  return forward;
}

TaskTraits ClassifierTask::traits() const {
  TaskTraits traits;
  traits.data_parallel = ours_;  // dp replicas are built with ClassifierImpl::clone
  traits.builtin_model = ours_ && model_name_ != "script";  // a TorchScript forward is the user's
  return traits;
}

void ClassifierTask::configure(const TrainConfig& config) {
  refuse_generator_options(config);
  if (module_ && !config.model.empty())  // the user's module (the CLI's models come by builtin())
    throw Error("TrainConfig::model '" + config.model +
                    "' names a built-in model; this task trains the module it was given",
                "leave model empty");
  if (config.task != TaskKind::kClassify)
    throw Error("a ClassifierTask trains a classifier; TrainConfig::task asks for another task",
                "leave task at kClassify");
  if (config.test_time_augment != "none" && config.test_time_augment != "flip")
    throw Error("--test-time-augment " + config.test_time_augment + ": expected none or flip");
  if (!(config.label_smoothing >= 0 && config.label_smoothing < 1))
    throw Error("--label-smoothing " + c10::str(config.label_smoothing) + ": expected 0 <= S < 1");
  if (config.label_smoothing != 0) options_.label_smoothing = config.label_smoothing;
  if (config.test_time_augment == "flip") options_.flip_at_test = true;
  if (config.first_conv != "learned" && config.first_conv != "whitened")
    throw Error("--first-conv " + config.first_conv + ": expected learned or whitened");
  if (config.first_conv == "whitened") options_.whiten_first_conv = true;
  activation_checkpointing_ = config.activation_checkpointing;
}

void ClassifierTask::build(const TaskSetup& setup) {
  const data::Dataset& train = setup.train;
  auto sizes = train.inputs.sizes().vec();
  sizes.erase(sizes.begin());
  input_shape_ = sizes;
  classes_ = train.num_classes();
  if (classes_ < 2)
    throw Error(
        "a classifier needs at least 2 classes; " + train.name + " has " +
            std::to_string(classes_) +
            (train.class_names.empty() ? std::string() : " ('" + train.class_names.front() + "')"),
        "folder:DIR takes one subfolder of PNG files per class (files elsewhere are not "
        "read), sheet:FILE a --labels file, npy:FILE a labels .npy; or train --task "
        "generate on one class");
  if (options_.flip_at_test && train.inputs.dim() != 4)
    throw Error("--test-time-augment flip mirrors images; " + train.name +
                " holds feature vectors");
  if (module_) {  // the user's module, as given
    if (activation_checkpointing_)
      throw Error(
          "--activation-checkpointing recomputes the built-in CNNs' stages; it cannot split "
          "a module of your own into segments",
          "checkpoint its segments in its forward: models::checkpointed "
          "(models/activation_checkpoint.h)");
    check_logits(*module_, forward_, train, classes_);
    prepare_first_conv(setup);
    loss_ = classifier_loss(forward_, options_.label_smoothing);
    return;
  }
  model_name_ = requested_.empty() ? fallback_ : requested_;
  models::ModelSpec spec{model_name_, input_shape_, classes_};
  const std::string script_file = models::script_model_file(model_name_);
  if (!script_file.empty()) {  // --model script:FILE
    spec = {"script", input_shape_, classes_, models::read_script_archive(script_file),
            script_file};
    script_file_ = script_file;
  }
  if (setup.resumed) {  // the checkpoint decides; a conflicting request is an error, not a surprise
    const auto saved = setup.resumed->meta.value("model", std::string());
    if (saved == "script" && spec.name == "script") {
      if (*spec.script != *script_archive(*setup.resumed, setup.resume_source))
        throw Error("--resume " + setup.resume_source + " holds another TorchScript model than " +
                        script_file,
                    "drop --model: the checkpoint carries its model");
    } else if (!requested_.empty() && requested_ != saved) {
      throw Error("--resume " + setup.resume_source + " holds model '" + saved + "' but --model " +
                  requested_ + " was given");
    }
    if (saved == "script" && spec.name != "script") {
      spec = {"script", input_shape_, classes_, script_archive(*setup.resumed, setup.resume_source),
              setup.resume_source};
      script_file_ = setup.resumed->meta.value("script_file", std::string());
    }
    spec.name = saved;
  }
  model_name_ = spec.name;
  builtin_ = models::make_model(spec);
  if (activation_checkpointing_) builtin_->set_activation_checkpointing(true);
  module_ = builtin_;
  step_model_ = builtin_;
  forward_ = [model = builtin_](const torch::Tensor& x) { return model->forward(x); };
  prepare_first_conv(setup);
  loss_ = classifier_loss(forward_, options_.label_smoothing);
}

void ClassifierTask::prepare_first_conv(const TaskSetup& setup) {
  const std::string shown = model_name_ == "script" ? "script:" + script_file_ : model_name_;
  if (setup.resumed) {  // frozen or not as the run began: the optimizer state was built so
    const auto saved = json_field(setup.resumed->meta, "first_conv", std::string("learned"),
                                  setup.resume_source, "first_conv");
    if (saved != "learned" && saved != "whitened")
      throw DataError(setup.resume_source, "metadata 'first_conv' as learned or whitened",
                      "'" + saved + "'");
    const bool whitened = saved == "whitened";
    if (whitened != options_.whiten_first_conv)
      throw Error("--resume " + setup.resume_source + " was trained with --first-conv " +
                      (whitened ? "whitened" : "learned") + "; this run asks for " +
                      (options_.whiten_first_conv ? "whitened" : "learned"),
                  std::string("pass --first-conv ") + (whitened ? "whitened" : "learned"));
    if (whitened) {
      models::freeze_first_conv(*module_, shown);
      first_conv_note_ = "whitened, frozen (from " + setup.resume_source + ")";
    }
    return;
  }
  if (!options_.whiten_first_conv) return;
  DeviceTimer timer(setup.device);
  first_conv_note_ = models::whiten_first_conv(*module_, setup.train.inputs, shown, setup.device);
  first_conv_seconds_ = timer.seconds();
  char seconds[64];
  std::snprintf(seconds, sizeof seconds, "; computed in %.3f s, counted as training time",
                first_conv_seconds_);
  first_conv_note_ += seconds;
}

// Our models: the step the rest of the library picks for a classifier (fused MLP where it applies,
// else autograd under the run's precision; make_precision_train_step). The user's: the Trainer's
// autograd step over training_step.
std::unique_ptr<TrainStep> ClassifierTask::fast_step(const FastStepSetup& setup) {
  if (!builtin_) return Task::fast_step(setup);
  if (options_.label_smoothing > 0) {
    if (setup.kind == StepKind::kFused)
      throw Error("--step fused computes plain cross-entropy; it cannot smooth the labels",
                  "use --step auto, or drop --label-smoothing");
    return std::make_unique<AutogradStep>(loss_, setup.precision);
  }
  auto step = make_precision_train_step(step_model_, setup.max_batch, setup.kind, setup.precision,
                                        setup.cpu_threads);
  eval_pool_ = step->thread_pool();
  return step;
}

void ClassifierTask::use_data_parallel(const std::vector<torch::Device>& devices) {
  if (!builtin_) throw Error("--strategy dp replicates built-in models only", "use ddp");
  step_model_ = std::make_shared<DataParallelClassifierImpl>(builtin_, devices);
  loss_ = classifier_loss(step_model_, options_.label_smoothing);
}

EvalReport ClassifierTask::evaluate(data::Loader& test, bool keep_predictions) {
  ForwardFn forward = rows_over_pool(forward_, eval_pool_);
  return train::evaluate(options_.flip_at_test ? flip_averaged(std::move(forward)) : forward,
                         *module_, test, classes_, keep_predictions);
}

void ClassifierTask::save(Checkpoint& checkpoint) const {
  checkpoint.meta["model"] = model_name_;
  if (builtin_ && model_name_ == "script") {  // the model itself travels with its weights
    const std::string& bytes = *builtin_->spec().script;
    checkpoint.task[kScriptArchive] =
        torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())},
                         torch::kUInt8)
            .clone();
    checkpoint.meta["script_file"] = script_file_;
  }
  checkpoint.meta["input_shape"] = input_shape_;
  checkpoint.meta["classes"] = classes_;
  checkpoint.meta["label_smoothing"] = options_.label_smoothing;
  checkpoint.meta["test_time_augment"] = options_.flip_at_test ? "flip" : "none";
  checkpoint.meta["first_conv"] = options_.whiten_first_conv ? "whitened" : "learned";
}

Settings ClassifierTask::settings() const {
  int64_t parameters = 0;
  std::set<const c10::TensorImpl*> counted;  // a parameter registered twice (tied) counts once
  for (const auto& p : module_->parameters())
    if (counted.insert(p.unsafeGetTensorImpl()).second) parameters += p.numel();
  const std::string shown = model_name_ == "script" ? "TorchScript " + script_file_ : model_name_;
  Settings out = {{"model", shown + " (" + std::to_string(parameters) + " parameters" +
                                (activation_checkpointing_ ? ", activation checkpointing" : "") +
                                ")"}};
  if (options_.label_smoothing > 0)
    out.emplace_back("loss",
                     "cross-entropy, labels smoothed by " + c10::str(options_.label_smoothing));
  if (options_.flip_at_test)
    out.emplace_back("test-time augment", "flip (mean of the image's and its mirror's softmax)");
  if (!first_conv_note_.empty()) out.emplace_back("first convolution", first_conv_note_);
  return out;
}

}  // namespace spritetorch::train
