// An on/off environment variable of spritetorch's (SPRITETORCH_CACHE, SPRITETORCH_FUSED_BN_POOL,
// SPRITETORCH_CONV3X3): unset or "1" is on, "0" off, anything else an Error naming the variable,
// what was found and what each value means (exit 2 through the CLI).
#pragma once

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace spritetorch {

// off, on: what 0 and 1 mean, for the message ("" leaves that value unexplained).
inline bool environment_switch(const char* name, const std::string& off, const std::string& on) {
  const char* value = std::getenv(name);
  const std::string setting = value ? value : "";
  if (!setting.empty() && setting != "0" && setting != "1")
    throw Error(std::string(name) + "=" + setting + ": expected 0" +
                    (off.empty() ? "" : " (" + off + ")") + " or 1" +
                    (on.empty() ? "" : " (" + on + ")"),
                "unset it or set it to 0 or 1");
  return setting != "0";
}

}  // namespace spritetorch
