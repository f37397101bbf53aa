// Config files and environment mirrors for the subcommands.
//
//   spritetorch train --config run.toml --epochs 3
//
// A config file is flat TOML whose keys are the subcommand's long option names without the dashes
// (`batch-size = 64`, `drop-last = true`). Precedence: command line > environment variable
// (SPRITETORCH_DEVICE, ...) > config file > built-in default. Unknown keys, wrong types and invalid
// values are errors naming the file and line. `--print-config` prints the effective configuration
// in the same format (config_to_str goes through TomlConfig), and `--config` replays it as is.
#pragma once

#include <CLI/CLI.hpp>
#include <iosfwd>
#include <string>
#include <vector>

namespace spritetorch::cli {

// CLI11's config formatter, speaking TOML through toml++ (config/toml_file.h).
class TomlConfig : public CLI::Config {
 public:
  // Every configurable option of `app` with its effective value, typed as TOML (numbers bare,
  // strings quoted, flags true/false); options neither set nor defaulted are written as comments.
  // --config, --help, --print-config and one-shot options (--resume, --overwrite) are left out.
  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;
};

// The environment variables mirroring options, option long name -> variable.
const std::vector<std::pair<std::string, std::string>>& environment_mirrors();

// Makes `variable` the environment mirror of `option`: resolve_config applies it when the command
// line does not give the option; `--help` shows it as "(env: VARIABLE)".
void mirror_environment(CLI::Option* option, const std::string& variable);
// Mirrors the single-valued options of environment_mirrors() that `sub` already has (call after
// adding them).
void add_environment_mirrors(CLI::App* sub);
// Whether resolve_config set `option` from its environment variable: a setting for every command
// (SPRITETORCH_PRECISION, SPRITETORCH_DATA), where a command that refuses the option when it is
// given should let it pass.
bool set_by_environment(const CLI::Option* option);
// Whether the command line itself gave `option` (not its environment variable, not a --config
// file, whose run-folder copies list every option): for refusals that would break replaying a
// run folder's config.toml.
bool given_on_command_line(const CLI::Option* option);
// What set `option` when the user did not give it: "--recipe fast", "--task generate", a
// config file's "FILE:LINE" or its environment variable; "" when the command line gave it or
// nothing set it.
std::string set_by(const CLI::Option* option);
// --data names the Fashion-MNIST folder: given on the command line beside another --dataset (which
// carries its own path: folder:PATH, sheet:FILE, npy:FILE), it is refused, not ignored. Train and
// bench share it.
void check_data_option_applies(const CLI::App& sub, const std::string& dataset);
// In `sub`, the recipe key `key` (a train option's long name) sets --option_name instead.
void recipe_alias(CLI::App* sub, const std::string& key, const std::string& option_name);
// Adds --config FILE and --print-config to `sub` and installs TomlConfig as its formatter.
void add_config_options(CLI::App* sub);

// After parsing: applies the environment mirrors of `sub` to the options the command line did not
// give (a value an option rejects is an Error naming the variable), then the --config file (when
// given) to the options still unset, checking keys, types and values (errors name file:line).
// Then the --recipe (when the command has one and it is given) fills the options still unset.
// Then, with --print-config, prints the effective configuration to `out` and returns true: the
// command should stop there.
bool resolve_config(CLI::App& sub, std::ostream& out);

// Levenshtein distance, for "did you mean" on unknown keys, options and commands.
size_t edit_distance(const std::string& a, const std::string& b);
// The name in `names` that `word` most likely misspells (at most 2 edits away, and fewer edits
// than `word` has letters), or "" for none.
std::string nearest_name(const std::string& word, const std::vector<std::string>& names);

// For an error `message` about an option that an environment variable or a config file set (the
// message names its flag, or its value in quotes): where it came from, one line per option
// ("--count 5 came from ec.toml:3", "--device came from SPRITETORCH_DEVICE=gpu"); "" for none.
std::string origin_note(const CLI::App& sub, const std::string& message);

}  // namespace spritetorch::cli
