// CUDA registration of the sparsecomm torch ops: csrc/cuda launchers on torch's current
// stream, no host synchronisation. Compiled only into CUDA builds (setup.py).
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>
#include "block_ops.h"
#include "../cuda/launchers.h"

namespace sparsecomm {
namespace torch_binding {
namespace {

struct CudaDevice {
  using Guard = c10::cuda::CUDAGuard;
  template <typename T, typename... Args> static void block_pack(Args... args) {
    cuda::block_pack<T>(args..., at::cuda::getCurrentCUDAStream());
  }
  template <typename T, typename... Args> static void block_unpack(Args... args) {
    cuda::block_unpack<T>(args..., at::cuda::getCurrentCUDAStream());
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(sparsecomm, CUDA, m) { register_block_ops<CudaDevice>(m); }

}  // namespace torch_binding
}  // namespace sparsecomm
