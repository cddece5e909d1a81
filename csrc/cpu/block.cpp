// CPU launchers for csrc/kernels/block.h. The cyclic block splits the tensor into at most
// three contiguous ranges, each a branch-free loop the compiler vectorizes.
#include "../kernels/block.h"

#include <algorithm>

#include "launchers.h"
#include "parallel.h"
#include "stream.h"

namespace sparsecomm {
namespace cpu {
namespace {

// Calls in_block(i0, i1, j0) and outside(i0, i1) over the ranges of a cyclic block, the
// tensor split into chunks over the cores.
template <typename InBlock, typename Outside>
void for_block_ranges(int64_t numel, int64_t start, int64_t length, InBlock in_block, Outside outside) {
  const int64_t end = start + length;
  // The block as up to two tensor ranges [b0, e0) and [b1, e1), with the block position of b_i.
  const int64_t b0 = end <= numel ? start : 0, e0 = end <= numel ? end : end - numel;
  const int64_t j0 = end <= numel ? 0 : numel - start;
  const int64_t b1 = end <= numel ? numel : start, e1 = numel;
  for_chunks(numel, pass_threads(numel), 64, [&](int, int64_t lo, int64_t hi) {
    int64_t i = lo;
    auto walk = [&](int64_t b, int64_t e, int64_t j) {  // the ranges before and inside [b, e)
      const int64_t cb = std::max(b, lo), ce = std::min(e, hi);
      if (cb >= ce) return;
      if (i < cb) outside(i, cb);
      in_block(cb, ce, j + (cb - b));
      i = ce;
    };
    walk(b0, e0, j0);
    walk(b1, e1, 0);
    if (i < hi) outside(i, hi);
  });
}

}  // namespace

template <typename T>
void block_pack(const T* grad, const float* residual_in, float* residual_out, T* values, int64_t numel, int64_t start,
                int64_t length) {
  Feedback fb;
  fb.residual_in = residual_in;
  fb.residual_out = residual_out;
  for_block_ranges(
      numel, start, length,
      [&](int64_t i0, int64_t i1, int64_t j0) {
        for (int64_t i = i0; i < i1; ++i) block_pack_element(i, j0 + (i - i0), true, grad, fb, values);
      },
      [&](int64_t i0, int64_t i1) {
        if (!residual_out) return;  // no error feedback: nothing to do outside the block
        for (int64_t i = i0; i < i1; ++i) block_pack_element(i, 0, false, grad, fb, values);
      });
}

template <typename T>
void block_unpack(const T* values, T* dense, int64_t numel, int64_t start, int64_t length, float scale) {
  for_block_ranges(
      numel, start, length,
      [&](int64_t i0, int64_t i1, int64_t j0) {
        for (int64_t i = i0; i < i1; ++i) dense[i] = block_unpack_element(j0 + (i - i0), true, values, scale);
      },
      [&](int64_t i0, int64_t i1) {  // +0 is all zero bits in every dtype
        zero_streaming(dense + i0, (i1 - i0) * int64_t(sizeof(T)), worth_streaming(numel * int64_t(sizeof(T))));
        fence_streaming();
      });
}

#define SC_INSTANTIATE(T)                                                                     \
  template void block_pack<T>(const T*, const float*, float*, T*, int64_t, int64_t, int64_t); \
  template void block_unpack<T>(const T*, T*, int64_t, int64_t, int64_t, float);
SC_FOR_FLOAT_TYPES(SC_INSTANTIATE)
#undef SC_INSTANTIATE

}  // namespace cpu
}  // namespace sparsecomm
