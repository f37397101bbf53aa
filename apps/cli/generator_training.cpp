// `train --task generate`: the generator branch of train.
#include <iomanip>
#include <iostream>

#include "commands.h"
#include "diffusion/generator.h"
#include "run_session.h"

namespace spritetorch::cli {

int run_generator_training(const train::TrainConfig& config, RunSession& session, bool json) {
  std::ostream& human = session.human();
  const auto report = diffusion::train_generator(config, &session.observer());
  human << std::fixed << std::setprecision(2) << "Train time: " << report.train_seconds << " s ("
        << report.steps << " steps)\n"
        << std::setprecision(4) << "Final loss: " << report.final_loss << std::defaultfloat << "\n";
  if (!config.save.empty()) human << "Saved checkpoint: " << config.save << "\n";
  session.finish(report, config.save);
  if (json) {
    nlohmann::json settings = nlohmann::json::object();  // as train's classifier JSON has it
    for (const auto& [k, v] : report.settings) settings[k] = v;
    std::cout << nlohmann::json{{"device", report.device},         {"task", "generate"},
                                {"run_dir", session.folder()},     {"settings", settings},
                                {"train_s", report.train_seconds}, {"steps", report.steps},
                                {"loss", report.final_loss}}
                     .dump()
              << "\n";
  }
  return 0;
}

}  // namespace spritetorch::cli
