// The spritetorch subcommands. Each registers its flags on the CLI11 app and returns the function
// that runs it; the functions fill library configs and print, nothing more.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace spritetorch::cli {

struct Subcommand {
  CLI::App* app;            // the parsed flags live in the closure of `run`
  std::function<int()> run;  // returns the process exit code
};

Subcommand add_devices_command(CLI::App& app);
Subcommand add_train_command(CLI::App& app);
Subcommand add_eval_command(CLI::App& app);
Subcommand add_bench_command(CLI::App& app);
Subcommand add_launch_command(CLI::App& app);

}  // namespace spritetorch::cli
