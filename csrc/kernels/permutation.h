// Random-k with a shared seed: k distinct indices of [0, numel), the same on every rank and
// device, from (seed, tensor id, step) alone.
//
// Index j (j < k) is the image of j under a keyed pseudo-random permutation of [0, numel):
// a 4-round Feistel network on b bits (b even, 2^b >= numel), cycle-walked into [0, numel)
// (apply it again while the result is >= numel; a bijection stays one, and 2^b < 4 numel
// keeps the expected walk short). Round r computes  (L, R) -> (R, L ^ F(R ^ key[r])) with the
// murmur3 finalizer as F. The 4 round keys are one Philox4x32-10 output of the selection
// stream at draw 0x80000000 (draws 0 and 1 are the block start and the sample offset).
#pragma once
#include "philox.h"

namespace sparsecomm {

struct Permutation {
  uint32_t key[4];
  int half_bits;  // b / 2
  uint32_t half_mask;
  int64_t numel;

  SC_HOST_DEVICE Permutation(uint64_t seed, uint32_t tensor_id, uint64_t step, int64_t n) : numel(n) {
    const uint32_t k2[2] = {uint32_t(seed), uint32_t(seed >> 32)};
    const uint32_t counter[4] = {0x80000000u, tensor_id, uint32_t(step), uint32_t(step >> 32)};
    Philox4x32x10::generate(counter, k2, key);
    int bits = 2;
    while (bits < 62 && (int64_t(1) << bits) < n) bits += 2;
    half_bits = bits / 2;
    half_mask = uint32_t((uint64_t(1) << half_bits) - 1);
  }

  SC_HOST_DEVICE static uint32_t mix(uint32_t h) {  // murmur3 fmix32
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
  }

  SC_HOST_DEVICE uint64_t feistel(uint64_t x) const {
    uint32_t left = uint32_t(x >> half_bits) & half_mask, right = uint32_t(x) & half_mask;
    for (int r = 0; r < 4; ++r) {
      const uint32_t next = left ^ (mix(right ^ key[r]) & half_mask);
      left = right;
      right = next;
    }
    return (uint64_t(left) << half_bits) | right;
  }

  // The j-th index (j < numel).
  SC_HOST_DEVICE int64_t operator()(int64_t j) const {
    uint64_t x = feistel(uint64_t(j));
    while (x >= uint64_t(numel)) x = feistel(x);
    return int64_t(x);
  }
};

}  // namespace sparsecomm
