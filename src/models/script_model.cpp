#include "models/script_model.h"

#include <fstream>
#include <sstream>

#include "common/crash_guard.h"
#include "common/error.h"
#include "common/input_file.h"
#include "models/eval_mode.h"

namespace spritetorch::models {

namespace {

constexpr char kPrefix[] = "script:";
constexpr char kWhat[] =
    "a TorchScript module (torch.jit.script(model).save(FILE), or torch.jit.trace)";

// What went wrong, in one line: the interpreter's messages are two tracebacks (serialized code,
// then the Python source) ending in "RuntimeError: <the error>"; others have it on the first line.
std::string interpreter_message(const std::string& text) {
  const std::string marker = "RuntimeError: ";
  const size_t last = text.rfind(marker);
  std::string tail = last == std::string::npos ? text : text.substr(last + marker.size());
  tail.erase(0, tail.find_first_not_of(" \n"));  // (some start with a newline)
  std::string line = tail.substr(0, tail.find('\n'));
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line.empty() ? "(it gave no reason)" : line;
}

torch::jit::Module load_archive(const std::string& archive) {
  std::istringstream in(archive);
  return torch::jit::load(in, torch::kCPU);
}

// Registers `from`'s parameters and buffers on `to`, recursively, as the same tensors.
void mirror(const torch::jit::Module& from, torch::nn::Module& to) {
  for (const auto& p : from.named_parameters(/*recurse=*/false))
    to.register_parameter(p.name, p.value, p.value.requires_grad());
  for (const auto& b : from.named_buffers(/*recurse=*/false)) to.register_buffer(b.name, b.value);
  for (const auto& c : from.named_children()) {
    auto child = std::make_shared<torch::nn::Module>(c.name);
    mirror(c.value, *child);
    to.register_module(c.name, child);
  }
}

}  // namespace

std::string script_model_file(const std::string& model) {
  return model.rfind(kPrefix, 0) == 0 ? model.substr(sizeof(kPrefix) - 1) : std::string();
}

std::shared_ptr<const std::string> read_script_archive(const std::string& file) {
  check_input_file(file, "a TorchScript file");
  std::ifstream in(file, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in.good() && !in.eof()) throw DataError(file, kWhat, "a file that could not be read");
  return std::make_shared<const std::string>(bytes.str());
}

ScriptClassifierImpl::ScriptClassifierImpl(const std::string& archive, const std::string& source)
    : source_(source) {
  // LibTorch's TorchScript reader can crash on a damaged archive (its parser did, fuzzed, when
  // checkpoints were such archives: docs/reliability.md).
  try_in_child_process([&archive] { load_archive(archive); }, source, kWhat);
  const std::string refused = "an archive LibTorch's TorchScript reader refuses: ";
  try {
    script_ = load_archive(archive);
  } catch (const c10::Error& e) {
    throw DataError(source, kWhat, refused + interpreter_message(e.what_without_backtrace()));
  } catch (const std::exception& e) {  // the reader throws more than c10::Error (jit::ErrorReport)
    throw DataError(source, kWhat, refused + interpreter_message(e.what()));
  }
  if (!script_.find_method("forward"))
    throw DataError(source, "a TorchScript module with a forward method", "none");
  // The optimizer keeps the trained parameters in one flat buffer of one dtype.
  std::string first;
  c10::ScalarType first_type = c10::ScalarType::Undefined;
  for (const auto& p : script_.named_parameters()) {
    const c10::ScalarType type = p.value.scalar_type();
    if (!p.value.is_floating_point())
      throw DataError(source, "floating-point parameters",
                      "'" + p.name + "' of " + std::string(c10::toString(type)));
    if (!p.value.requires_grad()) continue;
    if (first.empty()) {
      first = p.name;
      first_type = type;
    } else if (type != first_type) {
      throw DataError(source, "trainable parameters of one dtype",
                      "'" + first + "' of " + std::string(c10::toString(first_type)) + " and '" +
                          p.name + "' of " + std::string(c10::toString(type)),
                      "call .float() (or .double()) on the module before saving it");
    }
  }
  mirror(script_, *this);
  train(true);
}

torch::Tensor ScriptClassifierImpl::forward(torch::Tensor x) {
  const int64_t batch = x.dim() > 0 ? x.size(0) : -1;
  torch::Tensor logits;
  try {
    logits = run(std::move(x));
  } catch (const c10::Error&) {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::runtime_error& e) {  // the interpreter's: its tracebacks, then the error
    throw Error(source_ + ": its forward failed: " + interpreter_message(e.what()),
                "the whole message: run the model on such a batch in Python");
  }
  // The probe saw one batch size in eval mode: training mode, or a traced model's fixed batch,
  // can give other shapes, which the loss would report without naming the model.
  check_output(logits, batch);
  return logits;
}

void ScriptClassifierImpl::check_output(const torch::Tensor& logits, int64_t batch) const {
  if (logits.dim() == 2 && logits.size(0) == batch &&
      (classes_ == 0 || logits.size(1) == classes_) && logits.is_floating_point())
    return;
  const std::string wanted =
      wanted_.empty() ? "a forward that maps (B, ...) inputs to (B, K) logits" : wanted_;
  throw DataError(source_, wanted,
                  "one that gives " + c10::str(logits.sizes()) + " " +
                      std::string(c10::toString(logits.scalar_type())) + " for a batch of " +
                      std::to_string(batch) + (is_training() ? " in training mode" : ""),
                  "check its forward in both modes (model.train(), model.eval()) and at other "
                  "batch sizes; torch.jit.trace fixes the shapes it saw, torch.jit.script does "
                  "not");
}

torch::Tensor ScriptClassifierImpl::run(torch::Tensor x) {
  const torch::jit::IValue out = script_.forward({std::move(x)});
  if (!out.isTensor())
    throw DataError(source_, "a forward that returns a tensor of logits",
                    "one that returns " + out.tagKind());
  return out.toTensor();
}

std::string ScriptClassifierImpl::archive() const {
  std::ostringstream out;
  // jit::Module::save is not const in LibTorch 1.13, but only reads the module.
  const_cast<torch::jit::Module&>(script_).save(out);
  return out.str();
}

void ScriptClassifierImpl::train(bool on) {
  ClassifierImpl::train(on);
  script_.train(on);
}

void ScriptClassifierImpl::check_logits(const std::vector<int64_t>& input_shape, int64_t classes) {
  const std::string& source = source_;
  std::vector<int64_t> batch = {2};
  batch.insert(batch.end(), input_shape.begin(), input_shape.end());
  std::string shape = "(B";
  for (int64_t d : input_shape) shape += ", " + std::to_string(d);
  shape += ")";
  const std::string wanted = "a forward that maps this dataset's " + shape +
                             " float32 inputs to (B, " + std::to_string(classes) + ") logits";
  torch::Tensor logits;
  {
    EvalModeScope eval_mode(*this);
    try {
      torch::NoGradGuard no_grad;
      logits = run(torch::zeros(batch));
    } catch (const DataError&) {
      throw;
    } catch (const std::exception& e) {
      throw DataError(source, wanted, "one that fails on them: " + interpreter_message(e.what()),
                      "check the model against the dataset (--dataset, its --size)");
    }
  }
  if (logits.dim() != 2 || logits.size(0) != 2 || logits.size(1) != classes ||
      !logits.is_floating_point())
    throw DataError(source, wanted,
                    "one that gives " + c10::str(logits.sizes()) + " " +
                        std::string(c10::toString(logits.scalar_type())) + " for a batch of 2",
                    "the dataset has " + std::to_string(classes) + " classes");
  classes_ = classes;
  wanted_ = wanted;
}

}  // namespace spritetorch::models
