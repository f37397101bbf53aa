// FNV-1a, 64 bits: a short, stable digest of a text that is no checksum (crc32c.h is): the dataset
// cache's file names and the ddp ranks' comparison of values too long to exchange.
#pragma once

#include <cstdint>
#include <string>

namespace spritetorch {

inline uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;  // offset basis; prime 2^40 + 2^8 + 0xb3
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace spritetorch
