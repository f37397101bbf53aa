// JSON written by the tool (--json lines, summary.json, metrics.jsonl, a checkpoint's metadata):
// paths and class names come from the file system, whose names are bytes, not always UTF-8. JSON
// strings must be UTF-8, and nlohmann's dump() throws on any other byte, which after a run's work
// would lose its output. Here such a byte becomes U+FFFD, as a terminal shows it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace spritetorch {

// `json` as text, `indent` spaces per level (-1: one line); bytes that are not UTF-8 replaced.
inline std::string json_text(const nlohmann::json& json, int indent = -1) {
  return json.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace spritetorch
