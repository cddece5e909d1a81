// Error feedback and DGC momentum correction, element by element. Every per-rank-coordinate
// method (threshold, top-k, DGC, rTop-k) reads and writes its state through these.
//
//   g   = T(grad * grad_scale)       (DGC's local clipping factor, when given; rounded once to T)
//   u   = momentum * u_in + g        (momentum correction, DGC; u = g without momentum state)
//   acc = residual_in + u            (error feedback; acc = u without a residual)
// With Nesterov momentum (DGC's official code, `nesterov`; needs a momentum state):
//   u   = momentum * (u_in + g)
//   acc = (residual_in + u) + g
// Before selection the state is written as if nothing were sent:
//   residual_out = acc, momentum_out = u.
// For an element that is sent as value T(acc) (send step):
//   residual_out = acc - float(T(acc))   (only the rounding error stays)
//   momentum_out = 0 when masking        (DGC momentum factor masking)
//
// Each operation rounds once, in the order written (the build disables FMA contraction), so
// every device and framework, and a plain numpy/torch reference, give the same bits.
//
// NaN/Inf policy: an element whose acc is NaN counts as above every threshold. It is sent, so
// it propagates to the result like a dense allreduce would. A sent element whose error is not
// finite (acc NaN or +-inf, or sent as +-inf) leaves 0 in the residual: a non-finite value is
// never kept for later steps.
#pragma once
#include "common.h"

namespace sparsecomm {

struct Feedback {
  const float* residual_in = nullptr;  // nullptr: zero
  float* residual_out = nullptr;       // nullptr: no error feedback
  const float* momentum_in = nullptr;  // nullptr: no momentum correction
  float* momentum_out = nullptr;
  float momentum = 0.0f;
  bool nesterov = false;  // with momentum_in only
  bool masking = true;
  // nullptr: 1. One float read where the kernel runs (DGC's local clipping factor stays on the
  // device), so clipping rides the state's pass instead of scaling the gradient in place first.
  const float* grad_scale = nullptr;
};

// g times a gradient scale, rounded once to T: what scaling the gradient in place leaves.
template <typename T>
SC_HOST_DEVICE float scaled(float g, float scale) {
  return to_float(from_float<T>(g * scale));
}

// The momentum term u of element i whose (scaled) gradient is g.
SC_HOST_DEVICE float momentum_term(const Feedback& fb, int64_t i, float g) {
  if (!fb.momentum_in) return g;
  return fb.nesterov ? fb.momentum * (fb.momentum_in[i] + g) : fb.momentum * fb.momentum_in[i] + g;
}

// acc of element i, and the momentum term u, without writing anything.
template <typename T>
SC_HOST_DEVICE float accumulated(const T* grad, const Feedback& fb, int64_t i, float* u_out) {
  float g = to_float(grad[i]);
  if (fb.grad_scale) g = scaled<T>(g, *fb.grad_scale);
  const float u = momentum_term(fb, i, g);
  *u_out = u;
  const float acc = fb.residual_in ? fb.residual_in[i] + u : u;  // not 0 + u: that would turn -0 into +0
  return fb.nesterov ? acc + g : acc;
}

// acc and u written as the state of an element nothing was sent from.
SC_HOST_DEVICE void keep(const Feedback& fb, int64_t i, float acc, float u) {
  if (fb.residual_out) fb.residual_out[i] = acc;
  if (fb.momentum_out) fb.momentum_out[i] = u;
}

// The state of an element when nothing is selected (random-k's pass before its gather): acc
// and u as `accumulated` computes them, kept.
template <typename T>
SC_HOST_DEVICE void accumulate_element(const T* grad, const Feedback& fb, int64_t i) {
  float u;
  const float acc = accumulated(grad, fb, i, &u);
  keep(fb, i, acc, u);
}

// DGC's dense route (momentum SGD, nothing selected; no residual): u as `accumulated` computes it,
// kept as the momentum; acc (u, or u + g with Nesterov) written to out (rounded once to T), which
// is what is reduced. out may be grad.
template <typename T>
SC_HOST_DEVICE void momentum_element(const T* grad, const Feedback& fb, int64_t i, T* out) {
  float u;
  const float acc = accumulated(grad, fb, i, &u);
  fb.momentum_out[i] = u;
  out[i] = from_float<T>(acc);
}

// What stays of a sent element: its rounding error, or 0 where that is not finite (acc NaN or
// +-inf, or a finite acc sent as +-inf: a float16 overflow, an infinite quantized scale).
// (x - x is 0 exactly for a finite x, NaN for NaN and +-inf.)
SC_HOST_DEVICE float finite_or_zero(float left) { return left - left == 0.0f ? left : 0.0f; }

// Element i is sent as T(acc): returns it and leaves only its rounding error in the state.
template <typename T>
SC_HOST_DEVICE T send(const Feedback& fb, int64_t i, float acc) {
  const T sent = from_float<T>(acc);
  if (fb.residual_out) fb.residual_out[i] = finite_or_zero(acc - to_float(sent));
  if (fb.momentum_out && fb.masking) fb.momentum_out[i] = 0.0f;
  return sent;
}

// The selection rule shared by every threshold: |acc| >= t, and NaN always (see above).
// (& not &&: branch-free, so loops over it vectorize.)
SC_HOST_DEVICE bool selected(float acc, float threshold) { return !((acc < threshold) & (-acc < threshold)); }

// Magnitude used for ordering: |x|, with NaN as +inf (a strict weak order for sorting).
// On the bits, branch-free (a sign test mispredicts on every other gradient value: 14x slower loops):
// clearing the sign gives |x|, and every NaN's bits are above +inf's.
SC_HOST_DEVICE float magnitude(float x) {
  const uint32_t a = float_bits(x) & 0x7fffffffu;
  return bits_float(a < 0x7f800000u ? a : 0x7f800000u);
}

}  // namespace sparsecomm
