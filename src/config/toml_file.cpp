// toml++ does the parsing (syntax, duplicate keys, escapes); this file flattens its tree into
// entries with line numbers and rejects what a flat option file cannot mean.
#include "config/toml_file.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"

namespace spritetorch::config {

namespace {

std::string where(const std::string& source, const toml::source_position& position) {
  return source + ":" + std::to_string(position.line) + ":" + std::to_string(position.column);
}

// One plain value as text and its kind; false for tables and arrays.
bool scalar_text(const toml::node& node, ValueKind& kind, std::string& text) {
  if (const auto* s = node.as_string()) {
    kind = ValueKind::kString;
    text = s->get();
  } else if (const auto* i = node.as_integer()) {
    kind = ValueKind::kInteger;
    text = std::to_string(i->get());
  } else if (const auto* f = node.as_floating_point()) {
    kind = ValueKind::kFloat;
    text = shortest_double_text(f->get());
  } else if (const auto* b = node.as_boolean()) {
    kind = ValueKind::kBoolean;
    text = b->get() ? "true" : "false";
  } else if (node.is_date() || node.is_time() || node.is_date_time()) {
    kind = ValueKind::kDateTime;  // no option takes one; the caller reports the kind
    text = "date/time";
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::string kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kString:
      return "a string";
    case ValueKind::kInteger:
      return "an integer";
    case ValueKind::kFloat:
      return "a float";
    case ValueKind::kBoolean:
      return "a boolean";
    case ValueKind::kArray:
      return "an array";
    case ValueKind::kDateTime:
      return "a date/time";
  }
  return "a value";
}

std::vector<Entry> parse_flat_toml(const std::string& text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(
        where(source, e.source().begin) + ": TOML syntax error: " + std::string(e.description()),
        "config files are TOML: one `key = value` per line, strings in quotes");
  }
  std::vector<Entry> entries;
  for (const auto& [key, node] : table) {
    Entry entry;
    entry.key = std::string(key.str());
    entry.line = key.source().begin.line;
    entry.column = key.source().begin.column;
    const std::string at = source + ":" + std::to_string(entry.line);
    std::string value;
    if (scalar_text(node, entry.kind, value)) {
      entry.values.push_back(std::move(value));
    } else if (const auto* array = node.as_array()) {
      entry.kind = ValueKind::kArray;
      for (const auto& element : *array) {
        ValueKind element_kind;
        if (!scalar_text(element, element_kind, value))
          throw Error(at + ": key '" + entry.key +
                      "': expected an array of plain values, found a "
                      "nested array or table");
        entry.values.push_back(std::move(value));
      }
    } else {
      throw Error(at + ": [" + entry.key + "]: expected `key = value` lines, found a table",
                  "options go at the top level of the file, without [sections]");
    }
    entries.push_back(std::move(entry));
  }
  // toml++ keeps keys sorted; errors and replays read better in the file's own order.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.line != b.line ? a.line < b.line : a.column < b.column;
  });
  return entries;
}

std::vector<Entry> read_flat_toml_file(const std::string& path) {
  // A folder would read as an empty config, silently; /dev/zero until memory runs out.
  check_input_file(path, "a TOML config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read config file " + path, "check the path given to --config");
  // A pipe that never ends (`--config <(yes)`) is cut off too: no config of options is this long.
  constexpr std::streamsize kMaxBytes = 1 << 20;
  std::string text(static_cast<size_t>(kMaxBytes) + 1, '\0');
  in.read(text.data(), kMaxBytes + 1);
  if (in.bad()) throw Error("cannot read config file " + path);
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<std::streamsize>(text.size()) > kMaxBytes)
    throw DataError(path, "a TOML config file of at most 1 MiB", "more than that");
  return parse_flat_toml(text, path);
}

std::string toml_string_literal(const std::string& text) {
  std::string out = "\"";
  for (const unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string shortest_double_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[40];
  // Whole numbers print whole ("300", not %g's "3e+02"), up to where doubles stop being exact.
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buffer, sizeof buffer, "%.0f", value);
    return buffer;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*g", digits, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

std::string toml_float_literal(double value) {
  std::string text = shortest_double_text(value);
  // TOML floats need a fraction or an exponent ("3" would read back as an integer).
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

}  // namespace spritetorch::config
