#include "train/trainer.h"

#include <cmath>
#include <optional>
#include <sstream>
#include <thread>

#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/output_file.h"
#include "common/timer.h"
#include "data/augment.h"
#include "data/dummy.h"
#include "device/device.h"
#include "precision/grad_scaler.h"
#include "precision/precision.h"
#include "train/amp_step.h"
#include "train/cuda_graph_step.h"
#include "train/flat_optimizer.h"
#include "train/interrupt.h"
#include "train/parallel.h"
#include "train/run_state.h"
#include "train/train_step.h"

namespace spritetorch::train {

namespace {

// A non-finite loss as "nan" or "inf": its sign depends on the order of the float operations that
// produced it, which says nothing to the user.
std::string loss_text(double loss) {
  if (std::isnan(loss)) return "nan";
  if (std::isinf(loss)) return loss > 0 ? "inf" : "-inf";
  return std::to_string(loss);
}

std::vector<int64_t> sample_shape(const data::Dataset& d) {
  auto sizes = d.inputs.sizes().vec();
  sizes.erase(sizes.begin());
  return sizes;
}

std::string format_double(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The first kMisclassifiedKept test samples whose prediction is wrong. predictions: (N) int64 on
// the CPU in test-set order (the test loader does not shuffle).
Misclassified pick_misclassified(const data::Dataset& test, const torch::Tensor& predictions) {
  Misclassified out;
  if (!predictions.defined() || predictions.size(0) != test.size()) return out;
  const auto wrong = torch::nonzero(predictions != test.labels.cpu()).flatten();  // (E) int64
  out.total = wrong.size(0);
  const auto kept = wrong.narrow(0, 0, std::min(out.total, kMisclassifiedKept));
  out.inputs = test.inputs.cpu().index_select(0, kept);
  out.labels = test.labels.cpu().index_select(0, kept);
  out.predicted = predictions.index_select(0, kept);
  return out;
}

// The model a run trains: --model, else cnn for sprite data and ann otherwise; when resuming, the
// checkpoint decides, and a conflicting --model is an error, not a surprise.
struct ModelChoice {
  std::string name;
  std::optional<Checkpoint> resumed;
};
ModelChoice choose_model(const TrainConfig& config) {
  ModelChoice out;
  out.name = config.model.empty() ? "ann" : config.model;
  if (config.model.empty() && data::is_sprite_dataset(config.dataset)) out.name = "cnn";
  if (config.resume.empty()) return out;
  out.resumed = load_checkpoint(config.resume);
  const auto saved_model = out.resumed->meta.value("model", std::string());
  if (!config.model.empty() && config.model != saved_model)
    throw Error("--resume " + config.resume + " holds model '" + saved_model + "' but --model " +
                config.model + " was given");
  out.name = saved_model;
  return out;
}

// Threads of the fused CPU step (--step-threads 0: automatic). It splits each step over the cores
// itself; BLAS then runs one thread in each (more would oversubscribe the cores:
// docs/benchmarks.md). Under ddp the ranks of a machine share its cores.
int choose_step_threads(const TrainConfig& config, const ParallelRun& parallel) {
  if (config.step_threads > 0) return config.step_threads;
  const int cores = parallel.distributed()
                        ? parallel.blas_threads(0)
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return config.blas_threads > 0 ? std::max(1, cores / config.blas_threads) : cores;
}

}  // namespace

Datasets load_datasets(const TrainConfig& config) {
  Datasets out;
  if (config.dataset == "fashion-mnist") {
    out.train = data::load_fashion_mnist(config.data_dir, data::Split::kTrain);
    out.test = data::load_fashion_mnist(config.data_dir, data::Split::kTest);
  } else if (config.dataset == "dummy") {
    out.train = data::make_dummy_dataset(4096, config.seed);
    out.test = data::make_dummy_dataset(1024, config.seed + 1);
  } else if (data::is_sprite_dataset(config.dataset)) {
    auto split = data::holdout_split(data::load_sprite_dataset(config.dataset, config.sprites),
                                     config.sprites.holdout, config.sprites.seed);
    out.train = split.train;
    out.test = split.test;
  } else {
    throw Error("unknown dataset '" + config.dataset +
                "': expected fashion-mnist, dummy, sprites, "
                "folder:PATH, sheet:FILE or npy:FILE[,LABELS.npy]");
  }
  if (config.train_limit > 0) out.train = out.train.head(config.train_limit);
  if (config.test_limit > 0) out.test = out.test.head(config.test_limit);
  return out;
}

std::map<std::string, torch::Tensor> model_state(const torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value().detach().cpu();
  for (const auto& b : model.named_buffers()) out[b.key()] = b.value().cpu();
  return out;
}

void load_model_state(torch::nn::Module& model, const std::map<std::string, torch::Tensor>& state,
                      const std::string& source) {
  torch::NoGradGuard no_grad;
  size_t used = 0;
  auto load = [&](const std::string& name, torch::Tensor target) {
    auto it = state.find(name);
    if (it == state.end()) throw DataError(source, "a tensor '" + name + "'", "none");
    if (it->second.sizes() != target.sizes())
      throw DataError(source, "'" + name + "' of shape " + c10::str(target.sizes()),
                      "shape " + c10::str(it->second.sizes()));
    target.copy_(it->second);  // copy_ keeps target's storage (flat optimizer views stay valid)
    ++used;
  };
  for (auto& p : model.named_parameters()) load(p.key(), p.value());
  for (auto& b : model.named_buffers()) load(b.key(), b.value());
  if (used != state.size())
    throw DataError(source, std::to_string(used) + " model tensors",
                    std::to_string(state.size()) + " (tensors this model does not have)");
}

models::Classifier model_from_checkpoint(const Checkpoint& checkpoint, const std::string& source,
                                         torch::Device device) {
  models::ModelSpec spec;
  try {
    spec.name = checkpoint.meta.at("model").get<std::string>();
    spec.input_shape = checkpoint.meta.at("input_shape").get<std::vector<int64_t>>();
    spec.classes = checkpoint.meta.at("classes").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(source, "metadata with model, input_shape and classes", e.what());
  }
  int64_t file_values = 0;
  for (const auto& [name, t] : checkpoint.model) file_values += t.numel();
  check_model_spec(spec, file_values, source);  // a hostile file must not size our allocations
  auto model = models::make_model(spec);
  load_model_state(*model, checkpoint.model, source);
  model->to(device);
  return model;
}

TrainReport train(const TrainConfig& config, TrainObserver* observer) {
  device::pick_device(config.device);  // an unavailable device fails before the data is read
  return train(config, load_datasets(config), observer);
}

TrainReport train(const TrainConfig& config, const Datasets& data, TrainObserver* observer) {
  TrainObserver silent;
  if (!observer) observer = &silent;
  if (config.epochs < 0) throw Error("--epochs must be >= 0");
  if (config.batch_size <= 0) throw Error("--batch-size must be positive");
  // Reliability: outputs are checked before any work.
  const std::string run_base = run_checkpoint_base(config);
  check_run_outputs(config, run_base);

  // How the work is split; under ddp only rank 0 talks to the observer.
  ParallelRun parallel(config, distributed::process_env());
  if (!parallel.is_main()) observer = &silent;
  // Where: resolved once, named the seeds' way.
  const torch::Device device = parallel.pick_device(config.device);
  CpuThreads threads =
      apply_cpu_threads(config.threads, parallel.blas_threads(config.blas_threads));
  parallel.connect(device);
  // Precision (docs/precision.md): resolved once against the device, before any data is read, so
  // an impossible combination fails at once.
  const precision::PrecisionPlan plan = precision::resolve_precision(
      precision::parse_precision(config.precision), device::describe_device(device));
  if (config.cuda_graphs)
    check_cuda_graphs(device, config.data_path.data_on == "host" ? "streaming" : "resident");
  torch::manual_seed(config.seed);

  ModelChoice choice = choose_model(config);
  const std::string model_name = choice.name;
  std::optional<Checkpoint> resumed = std::move(choice.resumed);

  models::ModelSpec spec{model_name, sample_shape(data.train), data.train.num_classes()};
  models::Classifier model = models::make_model(spec);
  model->to(device);  // once, before the loop
  // channels_last must be set before the flat optimizer re-points the parameters (it keeps their
  // strides).
  bool has_conv = false;
  for (const auto& p : model->parameters()) has_conv |= p.dim() == 4;
  const bool channels_last = device.is_cuda() && config.channels_last && has_conv;
  if (channels_last) apply_channels_last(*model);
  if (device.is_cuda()) at::globalContext().setBenchmarkCuDNN(config.cudnn_benchmark);
  FlatOptimizer optimizer(model->parameters(), OptimizerOptions{config.optimizer, config.lr, 0.9,
                                                                0.999, 1e-8, config.momentum});
  int64_t start_epoch = 0;
  std::optional<RunState> run_state;  // set when resuming mid-epoch
  if (resumed) {
    load_model_state(*model, resumed->model, config.resume);
    optimizer.load_state(resumed->optimizer);
    start_epoch = resumed->meta.value("epoch", int64_t{0});
    run_state = load_run_state(*resumed, device, config.resume);
    if (run_state) check_mid_run_resume(config, *resumed, *run_state);
  }
  parallel.broadcast_model(*model, optimizer);
  std::optional<precision::GradScaler> scaler;  // fp16 only
  if (plan.grad_scaling) {
    scaler.emplace(device);
    if (resumed && resumed->meta.contains("grad_scaler"))
      scaler->load_state(resumed->meta.at("grad_scaler"), config.resume);
  }
  precision::GradScaler* scaler_ptr = scaler ? &*scaler : nullptr;

  const data::AugmentOptions augment = data::parse_augment(config.augment);
  if (augment.enabled() && data.train.inputs.dim() != 4)
    throw Error("--augment " + config.augment + " needs image data; " + data.train.name +
                " holds feature vectors");
  auto step_fn = make_precision_train_step(
      parallel.step_model(model), config.batch_size, config.step,
      StepPrecision{plan, scaler_ptr, channels_last, /*autocast_cache=*/!config.cuda_graphs},
      device.is_cpu() ? choose_step_threads(config, parallel) : 1);
  if (step_fn->threads() > 1 && config.blas_threads == 0)
    threads = apply_cpu_threads(config.threads, 1);
  optimizer.use_thread_pool(step_fn->thread_pool());  // the optimizer step splits over them too
  parallel.attach(*step_fn, optimizer, model->parameters());
  if (config.cuda_graphs && parallel.distributed())
    throw Error(
        "--cuda-graphs cannot be combined with ddp: the gradient all-reduce runs outside "
        "the captured step",
        "drop --cuda-graphs, or train with one process");
  std::unique_ptr<CudaGraphStep> graph_step;  // graphs replay full batches only: drop the last
  if (config.cuda_graphs)
    graph_step = std::make_unique<CudaGraphStep>(*step_fn, optimizer, scaler_ptr,
                                                 config.clip_grad_norm, config.batch_size, device);
  const bool drop_last = config.drop_last || config.cuda_graphs;
  data::LoaderOptions train_options{config.batch_size, /*shuffle=*/true, drop_last, config.seed};
  const data::Dataset& train_data = parallel.shard(data.train, train_options);  // ddp: this rank's
  data::DataPath train_path =
      data::make_data_path(train_data, device, train_options, config.data_path);
  data::Loader& train_loader = *train_path.loader;
  train_loader.use_thread_pool(step_fn->thread_pool());
  data::DataPath test_path = data::make_data_path(
      data.test, device, {std::max<int64_t>(config.batch_size, 1000), false, false, config.seed},
      config.data_path);

  TrainReport report;
  report.device = device::display_name(device);
  report.start_epoch = start_epoch;
  report.class_names = data.train.class_names;
  report.settings = {
      {"device", report.device},
      {"model", model_name + " (" + std::to_string(optimizer.values().numel()) + " parameters)"},
      {"dataset", data.train.name + " (" + std::to_string(data.train.size()) + " train, " +
                      std::to_string(data.test.size()) + " test)"},
      {"data path", train_path.description},
      {"batch", std::to_string(config.batch_size) + (drop_last ? " (drop last)" : "")},
      {"epochs", std::to_string(config.epochs) +
                     (start_epoch ? " (resuming after " + std::to_string(start_epoch) + ")" : "")},
      {"optimizer", config.optimizer + " lr " + format_double(config.lr) + " (flat buffers)"},
      {"augment", augment.describe()},
      {"step",
       std::string(step_fn->name()) +
           (step_fn->threads() > 1 ? " (" + std::to_string(step_fn->threads()) + " threads)" : "")},
      {"precision",
       plan.description + (config.clip_grad_norm > 0
                               ? ", clip grad norm " + format_double(config.clip_grad_norm)
                               : std::string())},
      {"seed", std::to_string(config.seed)},
      {"threads", std::to_string(threads.intra_op) + " intra-op, " +
                      (threads.blas > 0 ? std::to_string(threads.blas) : std::string("?")) +
                      " BLAS"},
  };
  report.settings.emplace_back("strategy", parallel.describe());
  report.main_rank = parallel.is_main();
  if (channels_last) report.settings.push_back({"memory format", "channels_last"});
  if (graph_step)
    report.settings.push_back({"cuda graphs", "whole step captured after " +
                                                  std::to_string(CudaGraphStep::kWarmupSteps) +
                                                  " eager warm-up steps"});
  observer->on_start(report.device, report.settings);

  const auto on_device = torch::TensorOptions().device(device);
  DeviceTimer total_timer(device);
  const int64_t steps = train_loader.batches_per_epoch();
  // Every checkpoint of this run: the final one (--save) and the periodic/interrupt ones.
  auto make_checkpoint = [&](int64_t epochs_done) {
    Checkpoint checkpoint;
    checkpoint.meta = {
        {"model", model_name},
        {"input_shape", spec.input_shape},
        {"classes", spec.classes},
        {"class_names", data.train.class_names},
        {"dataset", config.dataset},
        {"epoch", epochs_done},
        {"seed", config.seed},
        {"optimizer", config.optimizer},
        {"lr", config.lr},
        {"batch_size", config.batch_size},
        {"drop_last", config.drop_last},
        {"spritetorch_version", SPRITETORCH_VERSION},
        {"precision", precision::to_string(plan.precision)},
    };
    if (scaler) checkpoint.meta["grad_scaler"] = scaler->state();
    if (data::is_sprite_dataset(config.dataset))
      checkpoint.meta["sprites"] = data::sprite_options_json(config.sprites);
    checkpoint.model = model_state(*model);
    checkpoint.optimizer = optimizer.state();
    return checkpoint;
  };
  std::string last_good;  // newest periodic checkpoint this run wrote
  auto diverged = [&](const std::string& what, int64_t epoch, const std::string& where) {
    return Error(
        "training diverged: " + what + " in epoch " + std::to_string(epoch + 1) + ", " + where,
        (last_good.empty() ? std::string("no checkpoint was written (--checkpoint-every N)")
                           : "last good checkpoint: " + last_good + " (--resume it)") +
            "; lower --lr");
  };
  // A periodic or interrupt checkpoint after `rs.step` steps of epoch `rs.epoch`. It is written
  // only when the loss since the last log and the weights are finite: it is always a good one.
  auto save_run_checkpoint = [&](RunState rs) {
    const double pending = rs.interval_loss.item<double>();
    const bool weights_finite = torch::isfinite(optimizer.values()).all().item<bool>();
    if (!std::isfinite(pending) || !weights_finite)
      throw diverged(
          weights_finite ? "loss is " + loss_text(pending) : std::string("weights are not finite"),
          rs.epoch, "at or before step " + std::to_string(rs.step));
    const std::string path = periodic_checkpoint_path(run_base, rs.epoch * steps + rs.step);
    if (!parallel.is_main()) return path;  // ddp: ranks are identical; rank 0 writes
    capture_rng(rs, device);
    Checkpoint checkpoint = make_checkpoint(rs.epoch);
    store_run_state(rs, checkpoint);
    save_checkpoint(path, checkpoint);
    last_good = path;
    prune_periodic_checkpoints(run_base, config.keep_last);
    return path;
  };
  if (run_state) restore_rng(*run_state, device, config.resume);
  // Signals are caught from here on: a SIGINT/SIGTERM stops after the current step with a
  // checkpoint. Not before: until the loop starts there is nothing to save, and a rank waiting in
  // the rendezvous for a peer that died must end at the first SIGTERM (launch, torchrun and Slurm
  // send one, then wait), not sit out --dist-timeout.
  InterruptGuard interrupt_guard;
  std::optional<EvalReport> final_test;  // evaluated at the end of the last epoch
  for (int64_t epoch = start_epoch; epoch < config.epochs; ++epoch) {
    model->train();
    DeviceTimer epoch_timer(device);
    // Accumulated on the device; read at log intervals and at the end of the epoch only.
    auto loss_sum = torch::zeros({}, on_device.dtype(torch::kFloat32));
    auto correct = torch::zeros({}, on_device.dtype(torch::kInt64));
    auto interval_loss = torch::zeros({}, on_device.dtype(torch::kFloat32));
    int64_t interval_samples = 0, samples = 0, step = 0;
    train_loader.start_epoch(epoch);
    data::Batch batch;
    if (run_state && run_state->epoch == epoch) {  // resuming mid-epoch: skip the batches done
      loss_sum = run_state->loss_sum, correct = run_state->correct;
      interval_loss = run_state->interval_loss;
      interval_samples = run_state->interval_samples, samples = run_state->samples;
      for (; step < run_state->step; ++step)
        if (!train_loader.next(batch))
          throw DataError(config.resume, "at most " + std::to_string(steps) + " steps per epoch",
                          "step " + std::to_string(run_state->step));
      run_state.reset();
    }
    while (train_loader.next(batch)) {
      if (step == 0)
        device::expect_on_device(batch.inputs, optimizer.values().device(), "the training batch",
                                 "the model");
      const int64_t b = batch.labels.size(0);
      if (augment.enabled()) batch.inputs = data::augment_batch(batch.inputs, augment);
      try {
        if (graph_step) {
          graph_step->run(batch, interval_loss, correct);
        } else {
          if (!step_fn->overwrites_grads()) optimizer.zero_grad();
          step_fn->run(batch, interval_loss, correct);
          parallel.reduce_gradients();  // ddp: averaged gradients before unscaling / clipping
          // fp16 on CUDA: the skip-on-inf decision stays on the device (no sync per step).
          finish_step(optimizer, scaler_ptr, config.clip_grad_norm,
                      /*on_device=*/scaler_ptr != nullptr && device.is_cuda());
        }
      } catch (const c10::OutOfMemoryError& e) {
        throw out_of_memory(e, config, epoch, step, [&] {
          return save_run_checkpoint(
              {epoch, step, samples, interval_samples, loss_sum, correct, interval_loss, {}, {}});
        });
      }
      interval_samples += b;
      samples += b;
      ++step;
      observer->on_step({epoch + 1, config.epochs, step, steps, samples});
      if (config.log_every > 0 && step % config.log_every == 0) {
        const auto interval =
            parallel.sum({interval_loss.item<double>(), static_cast<double>(interval_samples)});
        const double mean = interval[0] / interval[1];
        if (!std::isfinite(mean))
          throw diverged(
              "loss is " + loss_text(mean), epoch,
              "steps " + std::to_string(step - config.log_every + 1) + "-" + std::to_string(step));
        observer->on_log({epoch + 1, step, steps, mean});
        loss_sum += interval_loss;
        interval_loss.zero_();
        interval_samples = 0;
      }
      const int signal = parallel.agreed_interrupt(interrupt_signal(), epoch * steps + step);
      if (signal ||
          (config.checkpoint_every > 0 && (epoch * steps + step) % config.checkpoint_every == 0)) {
        const std::string path = save_run_checkpoint(
            {epoch, step, samples, interval_samples, loss_sum, correct, interval_loss, {}, {}});
        if (signal) throw Interrupted(signal, path, epoch + 1, step, parallel.is_main());
      }
    }
    loss_sum += interval_loss;
    // Over all ranks: loss sum, correct count, samples.
    const auto totals =
        parallel.sum({loss_sum.item<double>(), static_cast<double>(correct.item<int64_t>()),
                      static_cast<double>(samples)});
    samples = static_cast<int64_t>(totals[2]);
    EpochReport er;
    er.epoch = epoch + 1;
    er.epochs = config.epochs;
    er.samples = samples;
    er.loss = totals[0] / static_cast<double>(std::max<int64_t>(samples, 1));
    er.accuracy = totals[1] / static_cast<double>(std::max<int64_t>(samples, 1));
    er.seconds = epoch_timer.seconds();
    er.images_per_second = static_cast<double>(samples) / er.seconds;
    if (!std::isfinite(er.loss))
      throw diverged("loss is " + loss_text(er.loss), epoch,
                     "by its end (step " + std::to_string(step) + ")");
    // The test set after this epoch, for the test curves: rank 0 only, outside train_seconds. The
    // last epoch's evaluation is the final one (with predictions): no second pass.
    const bool last_epoch = epoch + 1 == config.epochs;
    if (parallel.is_main() &&
        (last_epoch || (config.eval_every > 0 && (epoch + 1) % config.eval_every == 0))) {
      DeviceTimer eval_timer(device);
      EvalReport test = evaluate(*model, *test_path.loader, data.test.num_classes(), last_epoch);
      report.eval_seconds += eval_timer.seconds();
      er.has_test = true;
      er.test_loss = test.loss;
      er.test_accuracy = test.accuracy;
      if (last_epoch) final_test = std::move(test);
    }
    report.epochs.push_back(er);
    observer->on_epoch(er);
  }
  report.train_seconds = total_timer.seconds() - report.eval_seconds;
  parallel.check_in_sync(optimizer);
  if (!parallel.is_main()) return report;  // rank 0 evaluates, reports and saves

  report.test = final_test ? std::move(*final_test)
                           : evaluate(*model, *test_path.loader, data.test.num_classes(), true);
  report.misclassified = pick_misclassified(data.test, report.test.predictions);

  if (!config.save.empty())
    save_checkpoint(config.save, make_checkpoint(std::max(config.epochs, start_epoch)));
  return report;
}

}  // namespace spritetorch::train
