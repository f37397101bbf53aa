// Option checks shared by the subcommands, with messages a person can read: CLI11's own number
// ranges say "Value abc not in range 0.000000 to 1797693134862315708145...".
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/choice.h"
#include "common/error.h"

namespace spritetorch::cli {

// Finite numbers only: "nan" and "inf" are refused.
extern const CLI::Validator kNonNegative;  // a number >= 0 (help: NONNEGATIVE)
extern const CLI::Validator kPositive;     // a number > 0 (help: POSITIVE)
extern const CLI::Validator kPath;         // not empty ("" would read as not given)
// A file that is there (or a pipe): "x.pt: expected a file, found no such file" / "a folder".
extern const CLI::Validator kExistingFile;
// --model: one of models::model_names(), or script:FILE with FILE there (a TorchScript module).
CLI::Validator model_validator();
extern const CLI::Validator kSeed;  // a whole number 0 .. 2^63-1 (a TOML integer)
// A thread count: a whole number from 0 (the default) to max_thread_count(). A typo such as 99999
// would otherwise start that many threads and hang the command.
extern const CLI::Validator kThreadCount;
int max_thread_count();  // 8 per CPU of this machine, at least 64
// A finite number in [min, max]; unlike CLI::Range, "nan" is refused (every comparison with it is
// false).
CLI::Validator number_between(double min, double max);
// A whole number from 8 to `max` that is a multiple of 8 (--unet-base: the UNet's GroupNorm
// groups).
CLI::Validator multiple_of_8_up_to(int64_t max);

// What a value of `option` must be, from its type, for CLI11's "Could not convert: --epochs = 1.5":
// "a whole number", "a whole number >= 0", "a number" (each value's, for a list); "" for other
// types.
std::string value_wanted(const CLI::Option& option);

// Integers as people write them: "010" is ten, where CLI11 converts with base 0 and read it as
// octal eight ("09" failed), and --print-config and config.toml record "10", which TOML reads
// back (it refuses leading zeros). For every integer option of `command` and its subcommands.
void read_integers_as_decimal(CLI::App* command);

// Refuses a command whose outputs (--out, --save, --reference, OUT; bench's OUT.json and OUT.csv)
// include one of its inputs (--config, --checkpoint, --classifier, --resume, --labels, --palette,
// IN, FILES, a sheet: or npy: dataset's files), --overwrite or not: an output must never replace
// what the command reads. train --save may name its --resume checkpoint (a run continued in place).
// Looks into parsed subcommands (data preview).
void check_outputs_are_not_inputs(const CLI::App& command);

// A check that `parse` reads the text, with its Error's words (--lr-schedule, --augment): a bad
// value is refused when the options are read, as --print-config and config files are.
template <class Parse>
CLI::Validator parsed_by(Parse parse, const std::string& type_name) {
  return CLI::Validator(
      [parse](const std::string& text) {
        try {
          parse(text);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      type_name);
}

// A flag whose value is one of an enum's names (common/choice.h): the flag, the environment and
// config files give text, the library gets the enum. `target` must outlive the parse.
template <class E>
CLI::Option* add_choice(CLI::App* sub, const std::string& flag, E& target,
                        const std::string& help) {
  return sub
      ->add_option_function<std::string>(
          flag, [&target, flag](const std::string& text) { target = parse_choice<E>(text, flag); },
          help)
      ->check(CLI::IsMember(choices_of(E{}).names()))
      ->default_str(choice_name(target));
}

}  // namespace spritetorch::cli
