// A classifier written in Python and saved as TorchScript (`torch.jit.script(model).save(FILE)`,
// or `torch.jit.trace`), trained, evaluated and exported like ours: `--model script:FILE`.
//
// LibTorch runs the module's own forward through its TorchScript interpreter; its parameters and
// buffers are also registered here, under the names PyTorch gives them ("features.0.weight"),
// sharing their tensors, so the trainer, the optimizers, checkpoints, `to(device)` and export see
// an ordinary module. The archive's bytes travel in ModelSpec::script and in the checkpoint, so a
// checkpoint still runs after the file has moved.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "models/classifier.h"

namespace spritetorch::models {

// "script:FILE" (the --model form) -> FILE; empty for any other name.
std::string script_model_file(const std::string& model);
// FILE's bytes, read for --model script:FILE (errors name the file).
std::shared_ptr<const std::string> read_script_archive(const std::string& file);

class ScriptClassifierImpl : public ClassifierImpl {
 public:
  // `archive`: the bytes of a TorchScript file; `source` names it in errors. A file LibTorch cannot
  // load, or whose loading crashes it (a damaged archive), or whose parameters are not all of one
  // floating-point dtype (the optimizers keep them in one flat buffer), is a DataError.
  ScriptClassifierImpl(const std::string& archive, const std::string& source);
  // (B, ...) float32 -> (B, K) logits; any other output (a width that is not check_logits' K, a
  // batch that is not B) is a DataError naming the source.
  torch::Tensor forward(torch::Tensor x) override;
  void train(bool on = true) override;  // the interpreter reads its own flags
  // The TorchScript archive with this model's current weights (torch.jit.load reads it).
  std::string archive() const;
  // Checks that the model maps a batch of `input_shape` to (B, classes) logits, with a probe batch
  // of 2 zeros in eval mode (its mode restored); a DataError naming its source otherwise. Every
  // later forward is held to the same (B, classes).
  void check_logits(const std::vector<int64_t>& input_shape, int64_t classes);

 private:
  // The interpreter's forward as LibTorch throws its errors (forward() shortens them to a line).
  torch::Tensor run(torch::Tensor x);

  // DataError unless `logits` is (batch, classes_) floating point (classes_ 0: any width).
  void check_output(const torch::Tensor& logits, int64_t batch) const;

  torch::jit::Module script_;
  std::string source_;
  int64_t classes_ = 0;  // set by check_logits
  std::string wanted_;   // check_logits' description of the forward it wants
};

}  // namespace spritetorch::models
