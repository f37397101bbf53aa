// A size in bytes as a person reads it: "512 bytes", "854.6 KiB", "5.6 GiB" (binary units).
#pragma once

#include <cstdio>
#include <string>

namespace spritetorch {

inline std::string byte_size_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char text[64];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

}  // namespace spritetorch
