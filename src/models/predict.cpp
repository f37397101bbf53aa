#include "models/predict.h"

namespace spritetorch::models {

std::vector<Prediction> predict(ClassifierImpl& model, const torch::Tensor& inputs,
                                const std::vector<std::string>& class_names) {
  return predict([&model](const torch::Tensor& x) { return model.forward(x); }, inputs,
                 class_names);
}

std::vector<Prediction> predict(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                const torch::Tensor& inputs,
                                const std::vector<std::string>& class_names) {
  torch::InferenceMode guard;
  const auto probs = torch::softmax(forward(inputs), 1).cpu();
  const auto best = probs.argmax(1);
  std::vector<Prediction> out;
  out.reserve(static_cast<size_t>(probs.size(0)));
  for (int64_t i = 0; i < probs.size(0); ++i) {
    Prediction p;
    p.label = best[i].item<int64_t>();
    p.confidence = probs[i][p.label].item<double>();
    p.name = p.label < static_cast<int64_t>(class_names.size())
                 ? class_names[static_cast<size_t>(p.label)]
                 : std::to_string(p.label);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace spritetorch::models
