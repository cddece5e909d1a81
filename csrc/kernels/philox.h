// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11).
// Stateless: the output is a pure function of (counter, key), so every rank, every device
// and both frameworks derive the same numbers from the same (seed, tensor id, step) without
// touching any global RNG.
//
// sparsecomm's selection stream (documented in docs/kernels.md, reproduced independently
// by the tests):  key = (seed lo32, seed hi32),
//                 counter = (draw index, tensor id, step lo32, step hi32).
#pragma once
#include "common.h"

namespace sparsecomm {

struct Philox4x32x10 {
  static constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

  SC_HOST_DEVICE static void generate(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t(kMul0) * c0, p1 = uint64_t(kMul1) * c2;
      const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
      const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
      c0 = hi1 ^ c1 ^ k0;
      c1 = lo1;
      c2 = hi0 ^ c3 ^ k1;
      c3 = lo0;
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
  }
};

// The draw-th 64-bit value of the selection stream of (seed, tensor_id, step).
SC_HOST_DEVICE uint64_t selection_random64(uint64_t seed, uint32_t tensor_id, uint64_t step, uint32_t draw) {
  const uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  const uint32_t counter[4] = {draw, tensor_id, uint32_t(step), uint32_t(step >> 32)};
  uint32_t out[4];
  Philox4x32x10::generate(counter, key, out);
  return uint64_t(out[0]) | (uint64_t(out[1]) << 32);
}

// Start of a random cyclic block in a tensor of numel elements (0 when numel == 0).
// The modulo bias is below numel / 2^64: negligible for any real tensor.
SC_HOST_DEVICE int64_t random_block_start(uint64_t seed, uint32_t tensor_id, uint64_t step, int64_t numel) {
  return numel > 0 ? int64_t(selection_random64(seed, tensor_id, step, 0) % uint64_t(numel)) : 0;
}

}  // namespace sparsecomm
