// Typed reads of a metadata field (a checkpoint's meta, an export's __metadata__): nlohmann's own
// type errors name neither the file nor the field, so a hand-edited or foreign file would end in
// "[json.exception.type_error.302] ..." instead of a DataError.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"

namespace spritetorch {

template <typename T>
std::string json_type_wanted() {
  if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_same_v<T, bool>)
    return "true or false";
  else if constexpr (std::is_unsigned_v<T>)
    return "an integer >= 0";
  else if constexpr (std::is_integral_v<T>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "a number";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return "a list of strings";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
    return "a list of integers";
  else
    return "another JSON type";
}

// object[key] as T; `fallback` when the key is absent. `field` names it in errors (e.g.
// "sprites.size"); a value of another type, or `object` not being an object, is a DataError naming
// `source` and the field.
template <typename T>
T json_field(const nlohmann::json& object, const std::string& key, const T& fallback,
             const std::string& source, const std::string& field) {
  if (!object.is_object()) {
    const auto dot = field.rfind('.');
    throw DataError(source,
                    dot == std::string::npos
                        ? std::string("metadata as a JSON object")
                        : "metadata '" + field.substr(0, dot) + "' as a JSON object",
                    std::string("a JSON ") + object.type_name());
  }
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  // nlohmann converts any number to any arithmetic type; a string or list for a number is refused.
  const bool fits = [&] {
    if constexpr (std::is_same_v<T, bool>)
      return it->is_boolean();
    else if constexpr (std::is_unsigned_v<T>)  // -5 would wrap to 2^64 - 5
      return it->is_number_unsigned() ||
             (it->is_number_integer() && it->template get<int64_t>() >= 0);
    else if constexpr (std::is_integral_v<T>)
      return it->is_number_integer();
    else if constexpr (std::is_floating_point_v<T>)
      return it->is_number();
    else
      return true;
  }();
  try {
    if (fits) return it->template get<T>();
  } catch (const nlohmann::json::exception&) {
  }
  std::string found = it->dump();
  if (found.size() > 60) found = found.substr(0, 57) + "...";
  throw DataError(source, "metadata '" + field + "' as " + json_type_wanted<T>(),
                  std::string("a JSON ") + it->type_name() + " (" + found + ")");
}

// object[key], which must be there; otherwise a DataError naming `source` and expecting `expected`
// (e.g. "generator metadata 'palette'"). Typed reads then go through json_field.
inline const nlohmann::json& required_field(const nlohmann::json& object, const std::string& key,
                                            const std::string& source,
                                            const std::string& expected) {
  if (!object.is_object() || !object.contains(key)) throw DataError(source, expected, "none");
  return object.at(key);
}

}  // namespace spritetorch
