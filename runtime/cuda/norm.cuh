// runtime/cuda/norm.cuh: RMSNorm forward / backward and the partial-sum reduce.
// Kernels: norm.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

struct RmsNormParams {
  const void* x = nullptr;       // [rows, d]
  const void* weight = nullptr;  // [d] or null (unweighted)
  void* out = nullptr;           // [rows, d] or null (only rstd)
  float* rstd = nullptr;         // [rows]
  int64_t rows = 0;
  int64_t d = 0;
  float eps = 1e-6f;
  Elem type = Elem::fp32;
};
void launch_rmsnorm_forward(const RmsNormParams& params, cudaStream_t stream);

struct RmsNormBackwardParams {
  const void* dout = nullptr;      // [rows, d]
  const void* x = nullptr;         // [rows, d]
  const void* weight = nullptr;    // [d] or null
  const float* rstd = nullptr;     // [rows]
  void* dx = nullptr;              // [rows, d] +=, or null
  void* dweight = nullptr;         // [d] +=, or null (needs weight)
  Elem dweight_type = Elem::fp32;  // the weight's type or fp32
  float* partial = nullptr;        // kReduceSplits * d floats when dweight != null
  int64_t rows = 0;
  int64_t d = 0;
  Elem type = Elem::fp32;
};
void launch_rmsnorm_backward(const RmsNormBackwardParams& params, cudaStream_t stream);

}  // namespace modar::gpu
