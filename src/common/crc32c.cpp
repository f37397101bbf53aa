#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace spritetorch {

namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kCastagnoliReflected : 0u);
    table[byte] = crc;
  }
  return table;
}

// Raw (not inverted) CRC state over bytes, a byte at a time.
uint32_t table_update(uint32_t crc, const uint8_t* bytes, size_t size) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

// GF(2) arithmetic for joining interleaved streams: the CRC state is a polynomial mod P, reflected.
// Product of a and b mod P (both reflected: bit 31 is x^0).
uint32_t multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & 0x80000000u) product ^= b;
    a <<= 1;
    b = (b >> 1) ^ ((b & 1u) ? kCastagnoliReflected : 0u);
  }
  return product;
}

// x^(8 * bytes) mod P, reflected: what shifting a state past `bytes` zero bytes multiplies it by.
uint32_t shift_of(size_t bytes) {
  uint32_t result = 0x80000000u;  // x^0
  uint32_t square = 0x00800000u;  // x^8: one byte
  for (; bytes > 0; bytes >>= 1) {
    if (bytes & 1) result = multiply(result, square);
    square = multiply(square, square);
  }
  return result;
}

#if defined(__x86_64__)
// Three streams of `block` bytes each in flight: the instruction's latency is 3 cycles and its
// throughput 1 a cycle, so one stream would use a third of it. The streams' states are joined by
// shifting the first two past the bytes after them (a multiplication mod P).
constexpr size_t kBlock = 8192;

__attribute__((target("sse4.2"))) uint32_t sse42_update(uint32_t crc, const uint8_t* bytes,
                                                        size_t size) {
  static const uint32_t shift_block = shift_of(kBlock);
  static const uint32_t shift_two_blocks = shift_of(2 * kBlock);
  while (size >= 3 * kBlock) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, bytes + i, 8);
      std::memcpy(&wb, bytes + kBlock + i, 8);
      std::memcpy(&wc, bytes + 2 * kBlock + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      c = _mm_crc32_u64(c, wc);
    }
    crc = multiply(static_cast<uint32_t>(a), shift_two_blocks) ^
          multiply(static_cast<uint32_t>(b), shift_block) ^ static_cast<uint32_t>(c);
    bytes += 3 * kBlock, size -= 3 * kBlock;
  }
  uint64_t state = crc;
  for (; size >= 8; bytes += 8, size -= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    state = _mm_crc32_u64(state, word);
  }
  crc = static_cast<uint32_t>(state);
  for (; size > 0; ++bytes, --size) crc = _mm_crc32_u8(crc, *bytes);
  return crc;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_by_table(const void* data, size_t size, uint32_t crc) {
  return ~table_update(~crc, static_cast<const uint8_t*>(data), size);
}

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  if (cpu_has_sse42()) return ~sse42_update(~crc, static_cast<const uint8_t*>(data), size);
#endif
  return crc32c_by_table(data, size, crc);
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

}  // namespace spritetorch
