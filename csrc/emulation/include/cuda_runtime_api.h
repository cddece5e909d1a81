// Stand-in for CUDA's <cuda_runtime_api.h> in the CPU emulation build (tests put this folder
// on the include path instead of a CUDA toolkit): everything comes from the emulation.
#pragma once
#include "../cuda_emulation.h"
