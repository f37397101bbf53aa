// --config, --print-config and the environment mirrors. CLI11 2.1 reads config files only for the
// top-level app and without line numbers, so the subcommands' files are applied here, after the
// command line and the environment (which is what makes them the lowest-precedence source).
#include "config_file.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "checks.h"
#include "common/error.h"
#include "config/toml_file.h"
#include "train/recipe.h"

namespace spritetorch::cli {

namespace {

// What TOML value an option takes, from CLI11's type name ("INT:POSITIVE" -> INT).
// kDuration: seconds as a number, or a string the option's own parser reads ("15m").
enum class OptionKind { kFlag, kInteger, kNumber, kBoolean, kString, kDuration };

OptionKind option_kind(const CLI::Option& option) {
  if (option.get_expected_min() == 0) return OptionKind::kFlag;
  std::string type = option.get_type_name();
  type = type.substr(0, type.find(':'));
  if (type == "INT" || type == "UINT") return OptionKind::kInteger;
  if (type == "FLOAT") return OptionKind::kNumber;
  if (type == "BOOLEAN") return OptionKind::kBoolean;
  if (type == "DURATION") return OptionKind::kDuration;
  return OptionKind::kString;
}

std::string expected_text(OptionKind kind) {
  switch (kind) {
    case OptionKind::kFlag:
    case OptionKind::kBoolean:
      return "a boolean (true or false)";
    case OptionKind::kInteger:
      return "an integer";
    case OptionKind::kNumber:
      return "a number";
    case OptionKind::kString:
      return "a string (in quotes)";
    case OptionKind::kDuration:
      return "a number of seconds or a duration in quotes (\"15m\")";
  }
  return "a value";
}

bool kind_fits(OptionKind expected, config::ValueKind found) {
  switch (expected) {
    case OptionKind::kFlag:
    case OptionKind::kBoolean:
      return found == config::ValueKind::kBoolean;
    case OptionKind::kInteger:
      return found == config::ValueKind::kInteger;
    case OptionKind::kNumber:
      return found == config::ValueKind::kInteger || found == config::ValueKind::kFloat;
    case OptionKind::kString:
      return found == config::ValueKind::kString;
    case OptionKind::kDuration:
      return found == config::ValueKind::kInteger || found == config::ValueKind::kFloat ||
             found == config::ValueKind::kString;
  }
  return false;
}

// Integer options that were booleans once: a file written then (a run folder's config.toml) says
// true / false, which reads as 1 / 0 (--unet-attention: 1 was attention at S/4, as it still is).
bool once_boolean(const std::string& name) { return name == "unet-attention"; }

// Options that make no sense to replay: they refer to this one invocation.
bool one_shot(const std::string& name) {
  static const std::set<std::string> names = {"config", "print-config", "help", "resume",
                                              "overwrite"};
  return names.count(name) > 0;
}

bool truthy(const std::string& text) {
  try {
    return CLI::detail::to_flag_value(text) > 0;
  } catch (const std::exception&) {
    return false;
  }
}

// The value as a TOML literal of the option's kind; empty when the text does not fit the kind.
std::string toml_literal(OptionKind kind, const std::string& text) {
  switch (kind) {
    case OptionKind::kFlag:
    case OptionKind::kBoolean:
      return truthy(text) ? "true" : "false";
    case OptionKind::kInteger: {
      const bool digits =
          !text.empty() &&
          text.find_first_not_of("0123456789", text[0] == '-' ? 1 : 0) == std::string::npos &&
          text != "-";
      return digits ? text : std::string();
    }
    case OptionKind::kNumber:
    case OptionKind::kDuration: {  // the option's value is seconds once parsed
      char* end = nullptr;
      const double value = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0') return {};
      return config::toml_float_literal(value);
    }
    case OptionKind::kString:
      return config::toml_string_literal(text);
  }
  return {};
}

std::string long_name(const CLI::Option& option) {
  return option.get_lnames().empty() ? std::string() : option.get_lnames().front();
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 3;  // farther than this is no suggestion
  for (const auto& name : names) {
    const size_t d = edit_distance(word, name);
    if (d < best_distance && d < word.size()) best_distance = d, best = name;
  }
  return best;
}

namespace {

std::string unknown_key_hint(const CLI::App& sub, const std::string& key) {
  std::vector<std::string> keys;
  for (const CLI::Option* option : sub.get_options())
    if (!long_name(*option).empty() && option->get_configurable())
      keys.push_back(long_name(*option));
  const std::string best = nearest_name(key, keys);
  std::string hint = best.empty() ? std::string() : "did you mean '" + best + "'? ";
  return hint + "keys are the long options of `spritetorch " + sub.get_name() +
         " --help` without the dashes";
}

}  // namespace

std::string TomlConfig::to_config(const CLI::App* app, bool default_also, bool write_description,
                                  std::string prefix) const {
  std::ostringstream out;
  if (prefix.empty())
    out << "# spritetorch " << app->get_name() << " " << SPRITETORCH_VERSION
        << ": the effective configuration.\n# Replay: spritetorch " << app->get_name()
        << " --config FILE (command-line flags and SPRITETORCH_* variables override it)"
        << (app->get_name() == "train"
                ? ";\n# a ddp run: spritetorch launch --nproc-per-node N -- train --config FILE.\n"
                : ".\n");
  for (const CLI::Option* option : app->get_options()) {
    const std::string name = long_name(*option);
    if (name.empty() || !option->get_configurable() || one_shot(name)) continue;
    const OptionKind kind = option_kind(*option);
    std::vector<std::string> values;
    if (option->count() > 0) {
      values = option->reduced_results();
    } else if (kind == OptionKind::kFlag) {
      values = {"false"};
    } else if (default_also && !option->get_default_str().empty()) {
      values = {option->get_default_str()};
      // A list's default reads "0 2 4" (or "[0,2,4]"): one value per element.
      if (option->get_expected_max() > 1) {
        std::string text = values.front();
        for (char& c : text)
          if (c == '[' || c == ']' || c == ',') c = ' ';
        std::istringstream elements(text);
        values.assign(std::istream_iterator<std::string>(elements), {});
      }
    }
    if (write_description) out << "\n# " << option->get_description() << "\n";
    if (values.empty()) {
      if (write_description)
        out << "# " << prefix << name << " = (not set: the built-in default)\n";
      continue;
    }
    // A negated flag (bench's !--no-streaming) stores the inverted value; the file states the
    // flag itself, as get_flag_value() reads it back.
    bool negated = false;
    if (kind == OptionKind::kFlag) {
      try {
        negated = !truthy(option->get_flag_value(name, "true"));
      } catch (const CLI::Error&) {
      }
    }
    std::vector<std::string> literals;
    for (const auto& value : values) {
      std::string literal = toml_literal(kind, value);
      if (negated && option->count() > 0) literal = truthy(value) ? "false" : "true";
      literals.push_back(literal.empty() ? config::toml_string_literal(value) : literal);
    }
    out << prefix << name << " = ";
    if (literals.size() == 1) {
      out << literals[0] << "\n";
    } else {
      out << "[";
      for (size_t i = 0; i < literals.size(); ++i) out << (i ? ", " : "") << literals[i];
      out << "]\n";
    }
  }
  return out.str();
}

std::vector<CLI::ConfigItem> TomlConfig::from_config(std::istream& input) const {
  std::ostringstream text;
  text << input.rdbuf();
  std::vector<CLI::ConfigItem> items;
  for (auto& entry : config::parse_flat_toml(text.str(), "config")) {
    CLI::ConfigItem item;
    item.name = entry.key;
    item.inputs = std::move(entry.values);
    items.push_back(std::move(item));
  }
  return items;
}

const std::vector<std::pair<std::string, std::string>>& environment_mirrors() {
  // The settings that belong to a machine rather than to an experiment.
  static const std::vector<std::pair<std::string, std::string>> mirrors = {
      {"device", "SPRITETORCH_DEVICE"},       {"data", "SPRITETORCH_DATA"},
      {"threads", "SPRITETORCH_THREADS"},     {"blas-threads", "SPRITETORCH_BLAS_THREADS"},
      {"precision", "SPRITETORCH_PRECISION"}, {"workers", "SPRITETORCH_WORKERS"},
  };
  return mirrors;
}

namespace {

// Option -> the variable mirroring it. CLI11's own envname() is not used: its releases differ in
// whether and when they read and check the variable (Debian's 2.1.2 reads it even when the command
// line gives the option; the GPU machine's own CLI11 let a bad value through), and precedence and
// errors must not depend on which copy a build found.
std::map<const CLI::Option*, std::string>& mirror_of_option() {
  static std::map<const CLI::Option*, std::string> mirrors;
  return mirrors;
}

std::set<const CLI::Option*>& options_set_by_environment() {
  static std::set<const CLI::Option*> options;
  return options;
}

std::set<const CLI::Option*>& options_set_by_file() {
  static std::set<const CLI::Option*> options;
  return options;
}

// Option filled by apply_recipe -> "--recipe NAME", or "--task generate" (the generator's
// defaults).
std::map<const CLI::Option*, std::string>& recipe_of_option() {
  static std::map<const CLI::Option*, std::string> recipes;
  return recipes;
}

// Option set by a config file -> "FILE:LINE" of its entry.
std::map<const CLI::Option*, std::string>& file_line_of_option() {
  static std::map<const CLI::Option*, std::string> lines;
  return lines;
}

// Whether `message` names `flag` as a word ("--count applies ...", "--count '5'"), not as the
// start of a longer flag (--count-x).
bool names_flag(const std::string& message, const std::string& flag) {
  for (auto at = message.find(flag); at != std::string::npos; at = message.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    if (end == message.size() ||
        !(std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-'))
      return true;
  }
  return false;
}

// Applies the mirrors of `sub` to the options the command line did not give (resolve_config).
void apply_environment(CLI::App& sub) {
  for (CLI::Option* option : sub.get_options()) {
    const auto mirror = mirror_of_option().find(option);
    if (mirror == mirror_of_option().end() || option->count() > 0) continue;  // command line wins
    const std::string& variable = mirror->second;
    const char* value = std::getenv(variable.c_str());
    if (!value || *value == 0) continue;  // empty counts as unset
    try {
      option->add_result(std::string(value));
      option->run_callback();  // the option's checks, as for a flag
      options_set_by_environment().insert(option);
    } catch (const CLI::Error& e) {
      const std::string flag = "--" + long_name(*option);
      std::string detail = e.what();  // "--threads: 'many' is not a number ..."
      if (detail.rfind(flag + ": ", 0) == 0) detail = detail.substr(flag.size() + 2);
      if (detail.rfind("Could not convert", 0) == 0 && !value_wanted(*option).empty())
        detail = "expected " + value_wanted(*option);
      throw Error(
          "environment variable " + variable + "=" + value + " (it sets " + flag + "): " + detail,
          "fix or unset the variable");
    }
  }
}

// Per command: recipe key -> the option that takes it there, where the names differ.
std::map<const CLI::App*, std::map<std::string, std::string>>& recipe_aliases() {
  static std::map<const CLI::App*, std::map<std::string, std::string>> aliases;
  return aliases;
}

// --recipe NAME (train/recipe.h): its values go to the options still unset, checked as if given.
// Without --recipe, `--task generate` takes the generator's defaults the same way.
void apply_recipe(CLI::App& sub) {
  const CLI::Option* recipe_option = sub.get_option_no_throw("--recipe");
  const CLI::Option* task_option = sub.get_option_no_throw("--task");
  const bool named = recipe_option && recipe_option->count() > 0;
  const bool generator =
      task_option && task_option->count() > 0 && task_option->as<std::string>() == "generate";
  if (!named && !generator) return;
  // Every recipe trains a classifier (train/recipe.h): on a generator its model would be refused
  // as if the user had given it.
  if (named && generator)
    throw Error("--recipe " + recipe_option->as<std::string>() +
                    " is a classifier recipe; it does not apply to --task generate",
                "drop --recipe: --task generate fills the options not given with the generator's "
                "defaults");
  // A pointer, not a reference: GCC 13 takes a reference bound to the result of a call with a
  // temporary argument (the recipe's name) for a dangling one; both recipes are static.
  const train::Recipe* recipe =
      named ? &train::find_recipe(recipe_option->as<std::string>()) : &train::generator_defaults();
  for (const auto& [key, value] : recipe->options) {
    const auto& aliases = recipe_aliases()[&sub];
    const auto alias = aliases.find(key);
    CLI::Option* option =
        sub.get_option_no_throw("--" + (alias == aliases.end() ? key : alias->second));
    if (!option)  // every recipe key is an option of each command that takes --recipe
      throw Error("--recipe " + recipe->name + " sets '" + key + "', which spritetorch " +
                  sub.get_name() + " does not have");
    if (option->count() > 0) continue;  // given: it wins
    recipe_of_option()[option] = named ? "--recipe " + recipe->name : "--task generate";
    try {
      option->add_result(value);
      option->run_callback();
    } catch (const CLI::Error& e) {  // a recipe that does not fit its own options: our bug
      throw Error("--recipe " + recipe->name + ": '" + key + " = " + value + "': " + e.what());
    }
  }
}

}  // namespace

void recipe_alias(CLI::App* sub, const std::string& key, const std::string& option_name) {
  recipe_aliases()[sub][key] = option_name;
}

void mirror_environment(CLI::Option* option, const std::string& variable) {
  mirror_of_option()[option] = variable;
  option->description(option->get_description() + " (env: " + variable + ")");
}

void add_environment_mirrors(CLI::App* sub) {
  for (const auto& [name, variable] : environment_mirrors()) {
    CLI::Option* option = sub->get_option_no_throw("--" + name);
    // A list option of the same name (bench --workers 0,2,4) means something else: no mirror.
    if (option && option->get_expected_max() <= 1) mirror_environment(option, variable);
  }
}

// The options a command requires that a config file or the environment may give: CLI11 would
// refuse their absence from the command line before either is read (`eval --config FILE` whose
// FILE sets checkpoint: "--checkpoint is required"), so resolve_config checks them after both.
std::map<const CLI::App*, std::vector<const CLI::Option*>>& required_after_config() {
  static std::map<const CLI::App*, std::vector<const CLI::Option*>> required;
  return required;
}

void add_config_options(CLI::App* sub) {
  for (CLI::Option* option : sub->get_options())
    if (option->get_required() && option->get_configurable() && !long_name(*option).empty()) {
      option->required(false);
      option->description(option->get_description() + " (required)");  // --help said REQUIRED
      required_after_config()[sub].push_back(option);
    }
  sub->config_formatter(std::make_shared<TomlConfig>());
  sub->add_option("--config",
                  "Read options from this TOML file (keys: the long options without "
                  "dashes, e.g. batch-size = 64); command line > environment > file")
      ->type_name("FILE")
      ->configurable(false);
  sub->add_flag("--print-config",
                "Print the effective configuration as TOML (what --config reads) "
                "and exit")
      ->configurable(false);
}

bool set_by_environment(const CLI::Option* option) {
  return options_set_by_environment().count(option) > 0;
}

bool given_on_command_line(const CLI::Option* option) {
  return option->count() > 0 && !set_by_environment(option) && !options_set_by_file().count(option);
}

std::string set_by(const CLI::Option* option) {
  if (const auto recipe = recipe_of_option().find(option); recipe != recipe_of_option().end())
    return recipe->second;
  if (options_set_by_file().count(option)) return file_line_of_option()[option];
  if (set_by_environment(option)) return mirror_of_option()[option];
  return "";
}

bool resolve_config(CLI::App& sub, std::ostream& out) {
  apply_environment(sub);  // before the file, which only fills what is still unset
  const CLI::Option* config_option = sub.get_option_no_throw("--config");
  if (config_option && config_option->count() > 0) {
    const std::string path = config_option->as<std::string>();
    std::set<const CLI::Option*>& from_file = options_set_by_file();
    for (const config::Entry& entry : config::read_flat_toml_file(path)) {
      const std::string at = path + ":" + std::to_string(entry.line);
      CLI::Option* option = sub.get_option_no_throw("--" + entry.key);
      if (option && !option->get_configurable() && long_name(*option) == entry.key)
        throw Error(at + ": '" + entry.key + "' cannot be set in a config file",
                    "pass --" + entry.key + " on the command line");
      if (!option || long_name(*option) != entry.key)
        throw Error(at + ": unknown key '" + entry.key + "' for spritetorch " + sub.get_name(),
                    unknown_key_hint(sub, entry.key));
      const OptionKind kind = option_kind(*option);
      const bool many = option->get_expected_max() > 1;
      std::vector<std::string> values = entry.values;
      const bool was_boolean = kind == OptionKind::kInteger &&
                               entry.kind == config::ValueKind::kBoolean && once_boolean(entry.key);
      if (was_boolean)
        for (auto& v : values) v = v == "true" ? "1" : "0";
      const bool fits =
          was_boolean ||
          (entry.kind == config::ValueKind::kArray ? many : kind_fits(kind, entry.kind));
      if (!fits)
        throw DataError(at, "'" + entry.key + "' to be " + expected_text(kind),
                        config::kind_name(entry.kind) + " (" +
                            (entry.values.empty() ? std::string("[]") : entry.values.front()) +
                            ")");
      if (option->count() > 0) continue;  // the command line or the environment set it
      // A flag set to false is a flag not given (a run folder's config.toml lists every flag).
      if (kind == OptionKind::kFlag && values.front() == "false") continue;
      // An option that excludes this one (--cuda-graphs, --no-cuda-graphs): given on the command
      // line it wins over the file, as every option does; both in the file is a contradiction.
      bool excluded = false;
      for (const CLI::Option* other : option->get_excludes()) {
        if (other->count() == 0) continue;
        if (from_file.count(other))
          throw Error(
              at + ": '" + entry.key + "' and '" + long_name(*other) + "' exclude each other",
              "keep one of them");
        excluded = true;
      }
      if (excluded) continue;
      from_file.insert(option);
      file_line_of_option()[option] = at;
      try {
        if (kind == OptionKind::kFlag)
          option->add_result(option->get_flag_value(entry.key, values.front()));
        else
          option->add_result(values);
        option->run_callback();
      } catch (const CLI::Error& e) {
        throw Error(at + ": '" + entry.key + "': " + e.what());
      }
    }
  }
  apply_recipe(sub);  // last: it fills only what every other source left unset
  for (const CLI::Option* option : required_after_config()[&sub])
    if (option->count() == 0)
      throw Error("--" + long_name(*option) + " is required",
                  "spritetorch " + sub.get_name() + " --help lists what it takes");
  const CLI::Option* print_option = sub.get_option_no_throw("--print-config");
  if (!print_option || print_option->count() == 0) return false;
  out << sub.config_to_str(/*default_also=*/true, /*write_description=*/true);
  return true;
}

std::string origin_note(const CLI::App& sub, const std::string& message) {
  std::string notes;
  for (const CLI::Option* option : sub.get_options()) {
    const bool from_file = options_set_by_file().count(option) > 0;
    if (!from_file && !set_by_environment(option)) continue;
    const std::string flag = "--" + long_name(*option);
    const auto& values = option->results();
    // Its value in quotes ("unknown device 'gpu'") counts too, unless it is a number: '1' in a
    // message is too likely to be about something else.
    const bool quoted_value =
        values.size() == 1 && !values.front().empty() &&
        values.front().find_first_not_of("0123456789.+-e") != std::string::npos &&
        message.find("'" + values.front() + "'") != std::string::npos;
    const bool named = names_flag(message, flag) || quoted_value;
    if (!named) continue;
    std::string value;
    for (const auto& v : values) value += (value.empty() ? "" : ",") + v;
    if (!notes.empty()) notes += "\n";
    notes += from_file ? flag + " " + value + " came from " + file_line_of_option()[option]
                       : flag + " came from " + mirror_of_option()[option] + "=" + value;
  }
  for (const CLI::App* child : sub.get_subcommands()) {
    const std::string more = origin_note(*child, message);
    if (!more.empty()) notes += (notes.empty() ? "" : "\n") + more;
  }
  return notes;
}

void check_data_option_applies(const CLI::App& sub, const std::string& dataset) {
  if (dataset != "fashion-mnist" && given_on_command_line(sub.get_option("--data")))
    throw Error("--data names the Fashion-MNIST folder; --dataset " + dataset + " does not read it",
                "drop --data (sprite sets name their files in --dataset: folder:PATH, "
                "sheet:FILE, npy:FILE)");
}

}  // namespace spritetorch::cli
