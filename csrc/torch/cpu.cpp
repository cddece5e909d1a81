// CPU registration of the sparsecomm torch ops: csrc/cpu launchers.
#include "block_ops.h"
#include "../cpu/launchers.h"

namespace sparsecomm {
namespace torch_binding {
namespace {

struct CpuDevice {
  struct Guard { explicit Guard(const at::Device&) {} };
  template <typename T, typename... Args> static void block_pack(Args... args) { cpu::block_pack<T>(args...); }
  template <typename T, typename... Args> static void block_unpack(Args... args) { cpu::block_unpack<T>(args...); }
};

}  // namespace

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) { register_block_ops<CpuDevice>(m); }

}  // namespace torch_binding
}  // namespace sparsecomm
