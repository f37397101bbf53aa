// Options with a closed set of values: an enum and its names in one table, so that parsing (an
// error that lists the names), printing (settings, checkpoints, --print-config) and the CLI's
// accepted values come from the same place.
//
//   enum class Color { kRed, kBlue };
//   const Choices<Color>& choices_of(Color);  // defined beside the enum, found by ADL
//   parse_choice<Color>("blue", "color") -> Color::kBlue;  choice_name(Color::kRed) -> "red"
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace spritetorch {

// "a, b or c"
inline std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

template <class E>
struct Choices {
  std::vector<std::pair<E, std::string>> entries;

  const std::string& name(E value) const {
    for (const auto& [v, n] : entries)
      if (v == value) return n;
    static const std::string unknown = "?";
    return unknown;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : entries) out.push_back(entry.second);
    return out;
  }
  // "a, b or c"
  std::string listed() const { return spritetorch::listed(names()); }
  // Throws Error "unknown <what> 'text': expected a, b or c".
  E parse(const std::string& text, const std::string& what) const {
    for (const auto& [v, n] : entries)
      if (n == text) return v;
    throw Error("unknown " + what + " '" + text + "': expected " + listed());
  }
};

template <class E>
const std::string& choice_name(E value) {
  return choices_of(E{}).name(value);
}
template <class E>
E parse_choice(const std::string& text, const std::string& what) {
  return choices_of(E{}).parse(text, what);
}

}  // namespace spritetorch
