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
//
// Unpack, one write pass: dense[i] = T(scale * float(values[j])) in the block, 0 outside.
#pragma once
#include "common.h"

namespace sparsecomm {

// Position in the block of tensor element i, or >= length when i is outside the block.
SC_HOST_DEVICE int64_t block_position(int64_t i, int64_t start, int64_t numel) {
  const int64_t j = i - start;
  return j < 0 ? j + numel : j;
}

template <typename T>
SC_HOST_DEVICE void block_pack_element(int64_t i, int64_t j, bool in_block, const T* grad,
                                       const float* residual_in, float* residual_out, T* values) {
  const float g = to_float(grad[i]);
  const float acc = residual_in ? residual_in[i] + g : g;  // not 0 + g: that would turn -0 into +0
  float left = acc;
  if (in_block) {
    const T sent = from_float<T>(acc);
    values[j] = sent;
    left = acc - to_float(sent);
  }
  if (residual_out) residual_out[i] = left;
}

template <typename T>
SC_HOST_DEVICE T block_unpack_element(int64_t j, bool in_block, const T* values, float scale) {
  return in_block ? from_float<T>(scale * to_float(values[j])) : from_float<T>(0.0f);
}

}  // namespace sparsecomm
