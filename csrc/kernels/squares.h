// The sum of squares of a gradient in float64 (DGC's clipping norm, squared), in one fixed
// order that the CPU and CUDA launchers both follow, so that they give the same bits whatever
// their thread counts and grids (and the same on every run).
//
// The order: tiles of kSquareTile elements. In a tile, lane j of kSquareLanes adds the squares
// of elements j, j + lanes, j + 2 lanes, ... in turn (a float's square is exact in float64: 24
// significant bits, squared, fit in 53), then the lanes are added pairwise (pairwise_lanes:
// lane j += lane j + h for h = lanes / 2, ..., 1, the order of a CUDA block's tree reduction).
// The tiles' sums are added the same way: lane j takes tiles j, j + lanes, ... in turn, then
// pairwise. NaN and infinities propagate (the clipping factor's policy is the caller's).
#pragma once
#include "common.h"

namespace sparsecomm {

constexpr int kSquareLanes = 256;  // a CUDA block's threads
constexpr int64_t kSquareTile = 16 * kSquareLanes;

SC_HOST_DEVICE int64_t square_tiles(int64_t numel) { return (numel + kSquareTile - 1) / kSquareTile; }

SC_HOST_DEVICE double square(float x) {
  const double v = x;
  return v * v;
}

// lanes[0] + ... + lanes[kSquareLanes - 1], added pairwise; overwrites lanes (host; CUDA blocks
// add in the same order in shared memory).
inline double pairwise_lanes(double* lanes) {
  for (int h = kSquareLanes / 2; h > 0; h >>= 1)
    for (int j = 0; j < h; ++j) lanes[j] += lanes[j + h];
  return lanes[0];
}

}  // namespace sparsecomm
