// Test-only stand-in for torch's <c10/cuda/CUDAGuard.h> in the emulated CUDA build of
// csrc/torch/cuda.cpp (tests/cuda_emulation/torch_binding.cpp). The emulated CUDA device is
// the host: the ops are registered on the CPU key and read CPU tensors, so the guard selects
// nothing and only checks that (the real guard likewise refuses a non-CUDA device).
#pragma once
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

namespace c10 {
namespace cuda {

struct CUDAGuard {
  explicit CUDAGuard(Device device) {
    TORCH_CHECK(device.is_cpu(), "emulated CUDAGuard: the emulated CUDA device is the host (CPU tensors), got ",
                device);
  }
  CUDAGuard(const CUDAGuard&) = delete;
  CUDAGuard& operator=(const CUDAGuard&) = delete;
};

}  // namespace cuda
}  // namespace c10
