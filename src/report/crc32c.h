// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord framing, and the
// "masked" form TensorFlow stores so that a CRC of data that itself contains CRCs stays strong.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spritetorch::report {

// CRC-32C of `size` bytes; pass a previous result as `crc` to continue over more bytes.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// TensorFlow's mask: rotate right by 15 bits and add a constant.
uint32_t mask_crc32c(uint32_t crc);

}  // namespace spritetorch::report
