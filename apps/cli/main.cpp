// spritetorch: train, evaluate and run small image models on the best device there is.
// A thin shell over the library: parse flags, call it, print; errors become exit codes
// (0 success, 2 bad usage or bad input, 1 an internal failure).
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "checks.h"
#include "commands.h"
#include "common/error.h"
#include "common/malloc_tuning.h"
#include "config_file.h"
#include "data/idx_cache.h"
#include "distributed/dist_env.h"
#include "models/bn_relu_pool.h"
#include "models/conv3x3.h"
#include "resume_command.h"
#include "signals.h"
#include "train/interrupt.h"

namespace {

// How this process was launched, for its resume command: {ranks per node, nodes} when it is one
// rank of a launch (spritetorch launch, torchrun), else {0, 1}.
std::pair<int, int> launch_shape() {
  const auto env = spritetorch::distributed::process_env();
  if (!spritetorch::distributed::launched_as_rank(env)) return {0, 1};
  try {
    const auto dist = spritetorch::distributed::read_dist_env(env);
    return {dist.local_world_size, std::max(1, dist.world_size / dist.local_world_size)};
  } catch (const spritetorch::Error&) {  // variables a run could not use: no launch to repeat
    return {0, 1};
  }
}

int run(int argc, char** argv) {
  spritetorch::cli::stop_runs_on_signals();  // a training loop's SIGINT/SIGTERM: checkpoint, stop
  CLI::App app{
      "spritetorch: train, evaluate and run small image models (Fashion-MNIST, pixel-art "
      "sprites) on CUDA, MPS or the CPU"};
  app.set_version_flag("--version", std::string("spritetorch ") + SPRITETORCH_VERSION);
  app.require_subcommand(1, 1);
  const std::vector<spritetorch::cli::Subcommand> commands = {
      spritetorch::cli::add_devices_command(app),    spritetorch::cli::add_train_command(app),
      spritetorch::cli::add_eval_command(app),       spritetorch::cli::add_bench_command(app),
      spritetorch::cli::add_classify_command(app),   spritetorch::cli::add_generate_command(app),
      spritetorch::cli::add_data_command(app),       spritetorch::cli::add_launch_command(app),
      spritetorch::cli::add_export_command(app),     spritetorch::cli::add_import_command(app),
      spritetorch::cli::add_completion_command(app), spritetorch::cli::add_runs_command(app),
  };
  for (const auto& command : commands) {
    spritetorch::cli::add_environment_mirrors(command.app);
    const std::string name = command.app->get_name();
    if (name == "train" || name == "eval" || name == "bench" || name == "generate")
      spritetorch::cli::add_config_options(command.app);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // prints help, the version or the parse error
  }
  try {
    // The machine variables without an option, checked before any work (docs/config.md).
    spritetorch::models::bn_relu_pool_fusion();
    spritetorch::models::conv3x3_kernel();
    spritetorch::data::dataset_cache_on();
    for (const auto& command : commands) {
      if (!command.app->parsed()) continue;
      // The environment, then --config; with --print-config, print them and stop.
      if (spritetorch::cli::resolve_config(*command.app, std::cout)) return 0;
      return command.run();
    }
    return 2;
  } catch (const spritetorch::train::Interrupted& e) {
    // Rank 0 speaks for a ddp run (the others stop at the same step). One write: ranks of a
    // launch share stderr, and piecewise writes of two processes interleave mid-line.
    if (e.main_rank()) {
      const auto [ranks_per_node, nodes] = launch_shape();
      std::cerr << ("\n" + std::string(e.what()) + "; checkpoint saved: " + e.checkpoint() +
                    "\nresume with: " +
                    spritetorch::cli::resume_command(argc, argv, e.checkpoint(), ranks_per_node,
                                                     nodes) +
                    "\n")
                << std::flush;
    }
    return e.exit_code();                     // 130 for SIGINT, 143 for SIGTERM
  } catch (const c10::OutOfMemoryError& e) {  // outside the training loop (which saves its state)
    std::cerr << "error: out of device memory: " << e.what_without_backtrace() << "\n"
              << "hint: try a smaller --batch-size, bf16 precision, or streaming the data instead "
                 "of keeping the dataset resident on the device\n";
    return 2;
  } catch (const spritetorch::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    // A host allocation that failed (a size no check caught): the input asked for too much, not a
    // bug to report with exit 1.
    const std::string message = e.what_without_backtrace();
    if (message.find("not enough memory") != std::string::npos ||
        message.find("to allocate") != std::string::npos) {
      std::cerr << "error: out of memory: " << message.substr(0, message.find('\n')) << "\n"
                << "hint: the sizes asked for need more memory than there is: fewer samples "
                   "(--sprite-count, --per-class, --count) or a smaller --scale, --size or "
                   "--batch-size\n";
      return 2;
    }
    std::cerr << "error: LibTorch: " << message << "\n";
    return 1;
  } catch (const std::bad_alloc&) {  // the same from a standard container
    std::cerr << "error: out of memory: the sizes asked for need more memory than there is\n"
              << "hint: fewer samples (--sprite-count, --per-class, --count), fewer classes, or a "
                 "smaller --scale, --size or --batch-size\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  spritetorch::keep_freed_memory_for_reuse();  // before any tensor: common/malloc_tuning.h
  const int code = run(argc, argv);
  // Everything of ours is closed by now; what static destructors are left is LibTorch's, which
  // unregister every operator one by one (~20% of the CPU time of loading it: docs/benchmarks.md).
  // Sanitizer builds return normally, so LeakSanitizer's check at exit still runs.
#if !defined(__SANITIZE_ADDRESS__)
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
#endif
  return code;
}
