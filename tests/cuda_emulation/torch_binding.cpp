// csrc/torch/cuda.cpp built against the CUDA emulation, as a test-only torch op library:
// the ops of csrc/torch/ops.cpp (the same schemas) under the namespace sparsecomm_cuda_emulated,
// implemented by cuda.cpp's CudaDevice policy and registered on the CPU key, since the
// emulated launchers (csrc/cuda/*.cu, launches rewritten by build_driver.py) read host memory.
// c10/cuda's stream and guard come from include/c10/cuda (stand-ins), cudaStream_t and the
// launch machinery from csrc/emulation. Built by build_torch_binding.py; tests/conftest.py
// runs the op tests on it as the device "cuda-emulated".
#define SC_TORCH_LIBRARY TORCH_LIBRARY(sparsecomm_cuda_emulated, m)
#define SC_TORCH_CUDA_LIBRARY_IMPL TORCH_LIBRARY_IMPL(sparsecomm_cuda_emulated, CPU, m)
#include "../../csrc/torch/ops.cpp"   // (its PyInit__C comes along, unused: torch loads this library)
#include "../../csrc/torch/cuda.cpp"

// The emulation's own, in a namespace apart from the ops' (whose schemas match the real build's):
// the kernels launched so far, and the binding's reads of device data on the host, for the tests
// that count a step's launches and reads.
TORCH_LIBRARY(sparsecomm_cuda_emulation, m) {
  m.def("launches() -> int", []() -> int64_t { return sc_emu::launches.load(); });
  m.def("host_reads() -> int", []() -> int64_t { return sparsecomm::torch_binding::host_reads.load(); });
}
