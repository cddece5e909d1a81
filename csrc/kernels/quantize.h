// 1-bit and 2-bit quantization of the sent values with per-tensor scales (Aji & Heafield
// combine gradient dropping with 1-bit/2-bit quantization of the kept values). The
// quantization error goes back into the residual like any rounding error.
//
//   1 bit: code = (v >= 0). Code 1 decodes to the mean of the non-negative values, code 0
//          to the mean of the negative ones: 2 scales.
//   2 bit: code = (v >= 0) | (|v| >= mean |v|) << 1 : sign and magnitude class. Each of the
//          4 classes decodes to the mean of its values: 4 scales (0 for an empty class).
// Codes are packed little-endian: value j occupies bits [j*bits, (j+1)*bits) of the byte
// stream. NaN or Inf among the values makes their class's scale NaN or Inf (it propagates,
// like a dense allreduce would).
#pragma once
#include "common.h"

namespace sparsecomm {

SC_HOST_DEVICE int quantized_scales(int bits) { return bits == 1 ? 2 : 4; }

SC_HOST_DEVICE int64_t quantized_bytes(int64_t count, int bits) { return (count * bits + 7) / 8; }

SC_HOST_DEVICE uint32_t quantize_code(float v, int bits, float magnitude_split) {
  const uint32_t sign = v >= 0.0f ? 1u : 0u;
  if (bits == 1) return sign;
  const float a = v < 0.0f ? -v : v;
  return sign | (a >= magnitude_split ? 2u : 0u);
}

SC_HOST_DEVICE uint32_t read_code(const uint8_t* codes, int64_t j, int bits) {
  const int64_t bit = j * bits;
  return (uint32_t(codes[bit >> 3]) >> (bit & 7)) & ((1u << bits) - 1u);
}

}  // namespace sparsecomm
