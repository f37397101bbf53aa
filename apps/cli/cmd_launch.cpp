// `spritetorch launch --nproc-per-node N -- train ...`: starts N local ranks of a ddp run
// (distributed/launcher.h) and returns the first failing rank's exit code.
#include <iostream>

#include "checks.h"
#include "commands.h"
#include "distributed/launcher.h"

namespace spritetorch::cli {

Subcommand add_launch_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "launch",
      "Start the ranks of a multi-process (ddp) run on this machine, like torchrun: "
      "spritetorch launch --nproc-per-node 2 -- train --model cnn ...");
  auto options = std::make_shared<distributed::LaunchOptions>();
  sub->add_option(
         "--nproc-per-node", options->nproc_per_node,
         "Ranks on this machine (one per GPU; on the CPU they share the cores; at most 256)")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--nnodes", options->nnodes, "Machines in the job")
      ->check(kPositive)
      ->capture_default_str();
  sub->add_option("--node-rank", options->node_rank, "This machine's index in [0, nnodes)")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("--master-addr", options->master_addr, "Address of node 0 (rank 0's rendezvous)")
      ->capture_default_str();
  sub->add_option("--master-port", options->master_port,
                  "Rendezvous port (0: a free port; required with --nnodes > 1)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  sub->add_option("command", options->args, "The spritetorch command each rank runs, after --")
      ->required();
  return {sub, [options]() {
            const auto result = distributed::launch_local_ranks(
                *options, [](const std::string& line) { std::cerr << line << std::endl; });
            return result.exit_code;
          }};
}

}  // namespace spritetorch::cli
