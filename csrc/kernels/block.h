// Random-block sparsification with error feedback (Eghlidi & Jaggi 2020).
//
// The block is cyclic: positions start, start+1, ..., start+length-1 (mod numel), so every
// element is equally likely to be covered whatever the start. Element i of the tensor is
// element j = (i - start) mod numel of the block, and it is in the block iff j < length.
//
// Pack, one pass over the tensor (reads grad and residual, writes residual; writes values
// only for the block):
//     acc = residual_in[i] + grad[i]                     (float32)
//     in block:  values[j] = T(acc)                      (rounded to the gradient dtype)
//                residual_out[i] = acc - float(values[j])  (the rounding error stays local)
//     outside:   residual_out[i] = acc
// so values (scattered back) + residual_out == residual_in + grad exactly, in float32.
// residual_in == nullptr means zero; residual_out == nullptr means no error feedback.
// These are feedback.h's accumulated / send / keep, with its NaN/Inf policy.
//
// Unpack, one write pass: dense[i] = T(scale * float(values[j])) in the block, 0 outside.
#pragma once
#include "feedback.h"

namespace sparsecomm {

// Position in the block of tensor element i, or >= length when i is outside the block.
SC_HOST_DEVICE int64_t block_position(int64_t i, int64_t start, int64_t numel) {
  const int64_t j = i - start;
  return j < 0 ? j + numel : j;
}

template <typename T>
SC_HOST_DEVICE void block_pack_element(int64_t i, int64_t j, bool in_block, const T* grad, const Feedback& fb,
                                       T* values) {
  float u;
  const float acc = accumulated(grad, fb, i, &u);
  if (in_block)
    values[j] = send<T>(fb, i, acc);
  else
    keep(fb, i, acc, u);
}

template <typename T>
SC_HOST_DEVICE T block_unpack_element(int64_t j, bool in_block, const T* values, float scale) {
  return in_block ? from_float<T>(scale * to_float(values[j])) : from_float<T>(0.0f);
}

}  // namespace sparsecomm
