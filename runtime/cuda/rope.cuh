// runtime/cuda/rope.cuh: rotary position embedding at gathered positions.
// Kernels: rope.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

struct RopeLaunchParams {
  const void* in = nullptr;            // forward: x; backward: dout   [rows, heads, d_head]
  void* out = nullptr;                 // forward: out (may alias in); backward: dx (+=)
  const int32_t* positions = nullptr;  // [rows] original token positions
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t d_head = 0;  // even
  double theta_base = 10000.0;
  bool backward = false;  // false: out = R(pos) in;  true: out += R(pos)^T in
  Elem type = Elem::fp32;
};
void launch_rope(const RopeLaunchParams& params, cudaStream_t stream);

}  // namespace modar::gpu
