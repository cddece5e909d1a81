// Framework-free basics shared by every kernel, launcher and binding:
// the host/device qualifier and 16-bit float storage types with float conversion.
//
// Gradients arrive as float32, float16 or bfloat16. Kernels compute in float32 and store
// back with round-to-nearest-even, so CPU and CUDA (and torch and TF) give identical bits.
// The 16-bit types are plain storage structs, layout-compatible with c10::Half /
// c10::BFloat16 / Eigen::half / Eigen::bfloat16 / __half, so bindings pass raw pointers.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SC_HOST_DEVICE inline
#endif

// M(T) for each storage type T of a gradient: the launchers' explicit instantiations.
#define SC_FOR_FLOAT_TYPES(M) M(float) M(half16) M(bfloat16)

namespace sparsecomm {

struct half16 {
  uint16_t bits;
};
struct bfloat16 {
  uint16_t bits;
};

#if defined(__CUDA_ARCH__)
SC_HOST_DEVICE uint32_t float_bits(float f) { return __float_as_uint(f); }
SC_HOST_DEVICE float bits_float(uint32_t u) { return __uint_as_float(u); }
#else
// std::bit_cast (C++20) on the host: memcpy, a register move once compiled.
template <typename To, typename From>
SC_HOST_DEVICE To host_bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}
SC_HOST_DEVICE uint32_t float_bits(float f) { return host_bit_cast<uint32_t>(f); }
SC_HOST_DEVICE float bits_float(uint32_t u) { return host_bit_cast<float>(u); }
#endif

SC_HOST_DEVICE float to_float(float x) { return x; }

SC_HOST_DEVICE float to_float(bfloat16 x) { return bits_float(uint32_t(x.bits) << 16); }

SC_HOST_DEVICE float to_float(half16 x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1fu;
  const uint32_t mant = x.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float mag = float(mant) * 5.9604644775390625e-8f;
    return bits_float(sign | float_bits(mag));
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

template <typename T>
SC_HOST_DEVICE T from_float(float x);

template <>
SC_HOST_DEVICE float from_float<float>(float x) {
  return x;
}

template <>
SC_HOST_DEVICE bfloat16 from_float<bfloat16>(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16{uint16_t(((u >> 16) & 0x8000u) | 0x7fc0u)};  // quiet nan
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bfloat16{uint16_t(u >> 16)};
}

template <>
SC_HOST_DEVICE half16 from_float<half16>(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return half16{uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u))};
  if (a >= 0x477ff000u) return half16{uint16_t(sign | 0x7c00u)};  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5 puts the half-subnormal ulp (2^-24)
    // at float's ulp, so the FPU's own rounding is the half rounding (ties to even).
    const float shifted = bits_float(a) + 0.5f;
    return half16{uint16_t(sign | (float_bits(shifted) - 0x3f000000u))};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return half16{uint16_t(sign | (a >> 13))};
}

// The factor sparse_unpack multiplies each sum by: a number the host knows, or *numerator /
// divisor read where the kernel runs. Horovod's reduced placeholder (the op's scaling times the
// ranks) stays on the GPU that way: the host never reads it, so decompress does not wait for
// the device. The division is in double, then rounded to float, as the host's would be.
struct UnpackScale {
  float factor = 1.0f;
  const float* numerator = nullptr;
  int64_t divisor = 1;

  UnpackScale(float f) : factor(f) {}  // NOLINT(google-explicit-constructor): a plain number is a scale
  UnpackScale(const float* n, int64_t d) : numerator(n), divisor(d) {}

  SC_HOST_DEVICE float value() const { return numerator ? float(double(*numerator) / double(divisor)) : factor; }
};

}  // namespace sparsecomm
