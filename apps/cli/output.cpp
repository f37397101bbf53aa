#include "output.h"

#include <cmath>
#include <iomanip>
#include <ostream>

namespace spritetorch::cli {

void print_settings(std::ostream& out, const train::Settings& settings) {
  size_t width = 0;
  for (const auto& [key, value] : settings) width = std::max(width, key.size());
  for (const auto& [key, value] : settings)
    out << "  " << std::left << std::setw(static_cast<int>(width)) << key << "  " << value << "\n";
}

void print_eval(std::ostream& out, const train::EvalReport& report,
                const std::vector<std::string>& class_names) {
  out << std::fixed << std::setprecision(4);
  out << "Test loss: " << report.loss << "  accuracy: " << report.accuracy << "  ("
      << report.samples << " samples)\n";
  size_t width = 5;
  for (const auto& n : class_names) width = std::max(width, n.size());
  out << "Per-class accuracy:\n";
  for (size_t k = 0; k < class_names.size() && k < report.per_class_accuracy.size(); ++k) {
    out << "  " << std::left << std::setw(static_cast<int>(width)) << class_names[k] << "  ";
    if (std::isnan(report.per_class_accuracy[k]))
      out << "  n/a\n";
    else
      out << report.per_class_accuracy[k] << "\n";
  }
  const int64_t k_count = report.confusion.size(0);
  out << "Confusion matrix (rows: true class, columns: predicted):\n";
  out << std::right << std::setw(4) << "";
  for (int64_t j = 0; j < k_count; ++j) out << std::setw(6) << j;
  out << "\n";
  for (int64_t i = 0; i < k_count; ++i) {
    out << std::setw(4) << i;
    for (int64_t j = 0; j < k_count; ++j)
      out << std::setw(6) << report.confusion[i][j].item<int64_t>();
    if (static_cast<size_t>(i) < class_names.size()) out << "  " << class_names[i];
    out << "\n";
  }
  out << std::defaultfloat;
}

nlohmann::json eval_json(const train::EvalReport& report,
                         const std::vector<std::string>& class_names) {
  nlohmann::json per_class = nlohmann::json::object();
  for (size_t k = 0; k < class_names.size() && k < report.per_class_accuracy.size(); ++k)
    per_class[class_names[k]] = std::isnan(report.per_class_accuracy[k])
                                    ? nlohmann::json(nullptr)
                                    : nlohmann::json(report.per_class_accuracy[k]);
  std::vector<std::vector<int64_t>> confusion;
  for (int64_t i = 0; report.confusion.defined() && i < report.confusion.size(0); ++i) {
    auto row = report.confusion[i].contiguous();
    confusion.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  if (!report.has_accuracy) return {{"loss", report.loss}, {"samples", report.samples}};
  return {{"loss", report.loss},
          {"accuracy", report.accuracy},
          {"samples", report.samples},
          {"per_class_accuracy", per_class},
          {"confusion", confusion}};
}

}  // namespace spritetorch::cli
