// Flat TOML configuration files: `key = value` lines read with toml++ into entries that remember
// their line, and TOML literals written back so that they read as the same value. What the keys
// mean is the caller's business (the CLI maps them to its long options); this file only knows TOML.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spritetorch::config {

enum class ValueKind { kString, kInteger, kFloat, kBoolean, kArray, kDateTime };

// "a string", "an integer", ... for error messages.
std::string kind_name(ValueKind kind);

struct Entry {
  std::string key;
  ValueKind kind = ValueKind::kString;
  // Scalars: one text; arrays: one per element. Integers in decimal, floats in the shortest form
  // that reads back to the same double, booleans as true / false, strings as they are.
  std::vector<std::string> values;
  int64_t line = 0, column = 0;  // 1-based, where the key starts
};

// Parses TOML text into its top-level entries, in file order. `source` (a file name) starts every
// error message: "source:LINE:COLUMN: ...". Syntax errors, tables ([section]) and arrays holding
// anything but plain values are errors.
std::vector<Entry> parse_flat_toml(const std::string& text, const std::string& source);
// The same for a file; a missing or unreadable file is an error naming it.
std::vector<Entry> read_flat_toml_file(const std::string& path);

// TOML literals: a quoted, escaped string; a float (the shortest text that reads back exactly,
// always with a '.' or an exponent, or inf / nan) from its decimal text.
std::string toml_string_literal(const std::string& text);
std::string toml_float_literal(double value);
// The shortest decimal text that strtod reads back as exactly `value`.
std::string shortest_double_text(double value);

}  // namespace spritetorch::config
