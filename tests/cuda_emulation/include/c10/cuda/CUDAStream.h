// Test-only stand-in for torch's <c10/cuda/CUDAStream.h> in the emulated CUDA build of
// csrc/torch/cuda.cpp (tests/cuda_emulation/torch_binding.cpp): the only member cuda.cpp uses,
// getCurrentCUDAStream(), converted to a cudaStream_t. The emulation ignores streams (its
// launches are synchronous), so the stream is null.
#pragma once
#include <cuda_runtime_api.h>  // the emulation's (csrc/emulation/include), as torch's includes CUDA's

namespace c10 {
namespace cuda {

class CUDAStream {
 public:
  operator cudaStream_t() const { return nullptr; }
  cudaStream_t stream() const { return nullptr; }
};

inline CUDAStream getCurrentCUDAStream() { return {}; }

}  // namespace cuda
}  // namespace c10
