// spritetorch: train, evaluate and run small image models on the best device there is.
// A thin shell over the library: parse flags, call it, print; errors become exit codes
// (0 success, 2 bad usage or bad input, 1 an internal failure).
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "commands.h"
#include "common/byte_size.h"
#include "common/cpu_threads.h"
#include "common/error.h"
#include "common/json_text.h"
#include "common/malloc_tuning.h"
#include "common/small_gemm.h"
#include "config_file.h"
#include "data/idx_cache.h"
#include "diffusion/group_norm_silu.h"
#include "distributed/dist_env.h"
#include "distributed/launcher.h"
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

// The hint of an out-of-memory error: the size options of `command` that the user gave (with their
// values), which are what asked for the memory; when none was given, the ones the command has.
std::string memory_hint(const CLI::App* command) {
  static const char* const kSizeOptions[] = {
      "--batch-size", "--count", "--sprite-count", "--per-class", "--reference-count",
      "--scale",      "--size",  "--unet-base",    "--unet-mult", "--train-limit",
      "--test-limit", "--limit", "--prefetch"};
  std::string given, available;
  if (command != nullptr)
    for (const char* name : kSizeOptions) {
      const CLI::Option* option = command->get_option_no_throw(name);
      if (option == nullptr) continue;
      available += std::string(available.empty() ? "" : ", ") + name;
      if (option->count() > 0) {
        std::string values;
        for (const auto& v : option->results()) values += (values.empty() ? "" : ",") + v;
        given += std::string(given.empty() ? "" : ", ") + name + " " + values;
      }
    }
  if (!given.empty()) return "the sizes asked for need more memory than there is: lower " + given;
  if (!available.empty())
    return "the sizes asked for need more memory than there is: a smaller " + available;
  return "the sizes asked for need more memory than there is";
}

// CLI11's "Could not convert: --epochs = 1.5" as "--epochs '1.5': expected a whole number", from
// the option's type; "" when the text or the option is not recognised (CLI11's words are printed
// then).
std::string conversion_message(const CLI::App& app, const std::string& what) {
  const std::string prefix = "Could not convert: ";
  const auto equals = what.find(" = ");
  if (what.rfind(prefix, 0) != 0 || equals == std::string::npos) return "";
  const std::string name = what.substr(prefix.size(), equals - prefix.size());
  const std::string value = what.substr(equals + 3);
  for (const CLI::App* command : app.get_subcommands()) {
    const CLI::Option* option = command->get_option_no_throw(name);
    if (option == nullptr) continue;
    std::string expected = spritetorch::cli::value_wanted(*option);
    // "1e6" is a whole number to a reader, not to the parser: say how to write it.
    if (expected.rfind("a whole number", 0) == 0 && value.find_first_of("eE") != std::string::npos)
      expected.insert(std::string("a whole number").size(),
                      " written in digits (1000000, not 1e6)");
    return expected.empty() ? "" : name + " '" + value + "': expected " + expected;
  }
  return "";
}

// The deepest subcommand the command line named ("data preview"), else the app.
const CLI::App& named_command(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    if (sub->parsed()) return named_command(*sub);
  return app;
}

// "spritetorch data preview": the command as typed, from the tool's name down.
std::string command_path(const CLI::App& command) {
  const CLI::App* parent = command.get_parent();
  return parent == nullptr ? "spritetorch" : command_path(*parent) + " " + command.get_name();
}

// CLI11's parse errors in this tool's words, with a hint: a misspelled command or option gets a
// "did you mean", a repeated option says so.
std::pair<std::string, std::string> parse_error_message(const CLI::App& app, int argc, char** argv,
                                                        const CLI::ParseError& e) {
  const CLI::App& command = named_command(app);
  const std::string help = command_path(command) + " --help lists what it takes";
  std::string what = e.what();
  // `spritetorch trian`, `spritetorch data preveiw`: CLI11 says "A subcommand is required".
  if (!command.get_subcommands({}).empty()) {
    int depth = 0;  // argv's word after the command's own
    for (const CLI::App* c = &command; c->get_parent() != nullptr; c = c->get_parent()) ++depth;
    if (argc > depth + 1 && argv[depth + 1][0] != '-') {
      std::vector<std::string> names;
      for (const CLI::App* sub : command.get_subcommands({})) names.push_back(sub->get_name());
      const std::string guess = spritetorch::cli::nearest_name(argv[depth + 1], names);
      return {"unknown command '" + std::string(argv[depth + 1]) + "'" +
                  (&command == &app ? std::string() : " for " + command_path(command)),
              (guess.empty() ? std::string() : "did you mean '" + guess + "'? ") +
                  command_path(command) + " --help lists the commands"};
    }
  }
  // "--epochs: At Most 1 required but received 2" (CLI11 2.1's words for a repeated option).
  if (const auto at = what.find(": At Most 1 required but received"); at != std::string::npos)
    return {what.substr(0, at) + " is given more than once", "give it once"};
  // "The following arguments were not expected: 1 --epoch": name the unknown option.
  if (what.rfind("The following argument", 0) == 0) {
    std::vector<std::string> options;
    for (const CLI::Option* option : command.get_options())
      for (const auto& name : option->get_lnames()) options.push_back("--" + name);
    for (int i = 1; i < argc; ++i) {
      std::string word = argv[i];
      word = word.substr(0, word.find('='));
      if (word.rfind("--", 0) != 0 || command.get_option_no_throw(word) != nullptr) continue;
      const std::string guess = spritetorch::cli::nearest_name(word, options);
      return {"unknown option " + word + " for " + command_path(command),
              (guess.empty() ? std::string() : "did you mean " + guess + "? ") + help};
    }
  }
  return {what, help};
}

// The size in LibTorch's allocation failures: "... you tried to allocate 400000000000 bytes" (the
// CPU allocator) -> "an allocation of 372.5 GiB"; "Tried to allocate 2.00 GiB" (CUDA's) -> "an
// allocation of 2.00 GiB"; "an allocation" when the text names no size.
std::string allocation_size(const std::string& message) {
  // The CPU allocator's text says "can't allocate memory: you tried to allocate N bytes".
  const char* start = nullptr;
  char* end = nullptr;
  double value = 0;
  for (auto at = message.find("allocate "); at != std::string::npos;
       at = message.find("allocate ", at + 1)) {
    start = message.c_str() + at + 9;
    value = std::strtod(start, &end);
    if (end != start && value > 0) break;
  }
  if (start == nullptr || end == start || !(value > 0)) return "an allocation";
  const std::string number(start, static_cast<const char*>(end));
  std::string unit;
  for (const char* c = end + (*end == ' '); std::isalpha(static_cast<unsigned char>(*c)); ++c)
    unit += *c;
  if (unit != "bytes") return "an allocation of " + number + (unit.empty() ? "" : " " + unit);
  return "an allocation of " + spritetorch::byte_size_text(value);
}

// Where this process's error message goes: stderr, and under `spritetorch launch` also a file the
// launcher reads, so that an error every rank makes is printed once: a rank after its machine's
// first leaves the message to the launcher (distributed/launcher.h).
class ErrorReport {
 public:
  ErrorReport() = default;
  ErrorReport(const ErrorReport&) = delete;
  ErrorReport& operator=(const ErrorReport&) = delete;
  ~ErrorReport() {
    const std::string message = text_.str();
    if (message.empty()) return;
    const std::string file = spritetorch::distributed::launched_error_file();
    const char* local_rank = std::getenv("LOCAL_RANK");
    const bool first_on_machine = local_rank == nullptr || std::string(local_rank) == "0";
    bool left_to_launcher = false;
    if (!file.empty()) {
      std::ofstream out(file, std::ios::binary);
      out << message;
      out.close();
      left_to_launcher = out.good();
    }
    if (first_on_machine || !left_to_launcher) std::cerr << message << std::flush;
  }
  std::ostream& out() { return text_; }

 private:
  std::ostringstream text_;
};

int run(int argc, char** argv) {
  ErrorReport report;  // before anything that can fail, so its message is delivered last
  spritetorch::cli::stop_runs_on_signals();  // a training loop's SIGINT/SIGTERM: checkpoint, stop
  spritetorch::cap_threads_from_environment();  // before any op: OMP_NUM_THREADS=65536
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
    spritetorch::cli::read_integers_as_decimal(command.app);
    const std::string name = command.app->get_name();
    if (name == "train" || name == "eval" || name == "bench" || name == "generate")
      spritetorch::cli::add_config_options(command.app);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConversionError& e) {
    std::string readable = conversion_message(app, e.what());
    if (readable.empty()) readable = parse_error_message(app, argc, argv, e).first;
    report.out() << "error: " << readable << "\n";
    return 2;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const auto [message, hint] = parse_error_message(app, argc, argv, e);
    report.out() << "error: " << message << "\nhint: " << hint << "\n";
    return 2;
  }
  const CLI::App* active = nullptr;  // the command that runs, for the out-of-memory hint
  try {
    // The machine variables without an option, checked before any work (docs/config.md).
    spritetorch::models::bn_relu_pool_fusion();
    spritetorch::models::conv3x3_kernel();
    spritetorch::gemm::best_kernel();  // SPRITETORCH_GEMM_KERNEL
    spritetorch::diffusion::group_norm_silu_fusion();
    spritetorch::data::dataset_cache_on();
    for (const auto& command : commands) {
      if (!command.app->parsed()) continue;
      active = command.app;
      // The environment, then --config; with --print-config, print them and stop (rank 0 alone
      // under launch: one file, not one per rank).
      std::ostringstream other_ranks_config;
      const bool main_rank =
          spritetorch::distributed::is_main_rank(spritetorch::distributed::process_env());
      if (spritetorch::cli::resolve_config(*command.app,
                                           main_rank ? std::cout : other_ranks_config))
        return 0;
      spritetorch::cli::check_outputs_are_not_inputs(*command.app);
      return command.run();
    }
    return 2;
  } catch (const spritetorch::train::Interrupted& e) {
    // Rank 0 speaks for a ddp run (the others stop at the same step). One write: ranks of a
    // launch share stderr, and piecewise writes of two processes interleave mid-line.
    if (e.main_rank()) {
      const auto [ranks_per_node, nodes] = launch_shape();
      const std::string command =
          spritetorch::cli::resume_command(argc, argv, e.checkpoint(), ranks_per_node, nodes);
      const std::string resume = "\nresume with: " + command + "\n";
      // --json: a script reads where the run stopped and how to go on from stdout, as it reads a
      // finished run's figures.
      if (const CLI::Option* json = active ? active->get_option_no_throw("--json") : nullptr;
          json != nullptr && json->count() > 0) {
        nlohmann::json out = {
            {"interrupted", true},          {"signal", spritetorch::train::signal_name(e.signal())},
            {"epoch", e.epoch()},           {"step", e.step()},
            {"checkpoint", e.checkpoint()}, {"resume", command},
            {"exit_code", e.exit_code()}};
        if (!e.wanted().empty()) {
          out["checkpoint_wanted"] = e.wanted();
          out["checkpoint_not_there_because"] = e.why();
        }
        std::cout << spritetorch::json_text(out) << "\n" << std::flush;
      }
      if (e.wanted().empty())
        std::cerr << ("\n" + std::string(e.what()) + "; checkpoint saved: " + e.checkpoint() +
                      resume)
                  << std::flush;
      else  // a full disk: the checkpoint is in the temp folder
        std::cerr << ("\nerror: " + std::string(e.what()) + "; " + e.why() +
                      "; the checkpoint was saved to " + e.checkpoint() + " instead" + resume +
                      "hint: or move it where it belongs first: mv " + e.checkpoint() + " " +
                      e.wanted() + "\n")
                  << std::flush;
    }
    return e.exit_code();  // 130 for SIGINT, 143 for SIGTERM; 1 for a checkpoint not where asked
  } catch (const c10::OutOfMemoryError& e) {  // outside the training loop (which saves its state)
    const std::string message = e.what_without_backtrace();
    // CUDA's first line also says what the device holds and what is free: kept as a note.
    report.out() << "error: out of device memory: " << allocation_size(message) << " failed\n"
                 << "note: " << spritetorch::first_line(message) << "\n"
                 << "hint: " << memory_hint(active)
                 << "; or bf16 precision, or the data streamed from the host (--data-on host)\n";
    return 2;
  } catch (const spritetorch::IncompleteRun& e) {
    report.out() << "error: " << e.what() << "\n";
    if (!e.hint().empty()) report.out() << "hint: " << e.hint() << "\n";
    return 1;
  } catch (const spritetorch::Error& e) {
    report.out() << "error: " << e.what() << "\n";
    if (!e.hint().empty()) report.out() << "hint: " << e.hint() << "\n";
    // An option the user did not type on this command line: say where it came from.
    if (active != nullptr)
      if (const std::string origin = spritetorch::cli::origin_note(*active, e.what() + e.hint());
          !origin.empty()) {
        std::istringstream lines(origin);
        for (std::string line; std::getline(lines, line);) report.out() << "note: " << line << "\n";
      }
    return 2;
  } catch (const c10::Error& e) {
    // A host allocation that failed (a size no check caught): the input asked for too much, not a
    // bug to report with exit 1.
    const std::string message = e.what_without_backtrace();
    if (spritetorch::is_host_allocation_failure(message)) {
      report.out() << "error: out of memory: " << allocation_size(message) << " failed\n"
                   << "hint: " << memory_hint(active) << "\n";
      return 2;
    }
    report.out() << "error: LibTorch: " << message << "\n";
    return 1;
  } catch (const std::bad_alloc&) {  // the same from a standard container
    report.out() << "error: out of memory: an allocation failed\n"
                 << "hint: " << memory_hint(active) << "\n";
    return 2;
  } catch (const std::exception& e) {
    report.out() << "error: " << e.what() << "\n";
    return 1;
  }
}

// True when `fd` is a pipe whose reader has closed it (`| head`): a write there failed with EPIPE
// (SIGPIPE is ignored), which may have been long before the end.
bool reader_left_the_pipe(int fd) {
  pollfd p{fd, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLERR) != 0;
}

// A standard stream closed by the caller (`>&-`) would be taken by the next file opened, and a
// run's metrics.jsonl would get the progress lines: /dev/null holds its place instead.
void hold_closed_standard_streams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int opened = ::open("/dev/null", O_RDWR);
    if (opened >= 0 && opened != fd) ::close(opened);  // not the lowest free one: leave it be
  }
}

// A command that did its work but whose standard output was lost (a full disk, /dev/full): exit
// 1, as for work not delivered, with the reason, instead of 0 and an empty or cut --json file.
// A reader that closed the pipe (`| head`) is no failure.
int check_standard_output(int code) {
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return code;
  if ((!flushed && error == EPIPE) || reader_left_the_pipe(STDOUT_FILENO)) return code;
  std::cerr << "error: could not write the standard output"
            << (flushed ? "" : std::string(": ") + std::strerror(error))
            << "; what the command printed there is lost or cut short\n";
  return code == 0 ? 1 : code;
}

}  // namespace

int main(int argc, char** argv) {
  hold_closed_standard_streams();              // before any file is opened
  spritetorch::keep_freed_memory_for_reuse();  // before any tensor: common/malloc_tuning.h
  // A reader that closes the pipe (`train | head -2`) would kill the run at its next line, before
  // its checkpoint: ignored, the write fails with EPIPE, the output is dropped, the run goes on
  // and saves, and check_standard_output counts the closed pipe as no failure.
  std::signal(SIGPIPE, SIG_IGN);
  // A file-size limit (ulimit -f) would kill the process at the write that crosses it (SIGXFSZ),
  // with no word and the weights lost; ignored, that write fails with EFBIG and the writers' own
  // paths follow (the checkpoint's rescue copy, the dataset cache's note, an error naming the
  // file).
  std::signal(SIGXFSZ, SIG_IGN);
  const int code = check_standard_output(run(argc, argv));
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
