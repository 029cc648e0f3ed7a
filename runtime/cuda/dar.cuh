// runtime/cuda/dar.cuh: DAR coefficient heads, stream mix, transport and gated
// write.  Kernels: dar.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

inline constexpr int kDarMaxStreams = 4;
inline constexpr int kDarMaxOutputs = 2 * kDarMaxStreams + kDarMaxStreams * kDarMaxStreams;
inline constexpr int kDarMaxSinkhornIterations = 64;

struct DarCoefficientLaunchParams {
  const void* retrieved = nullptr;  // [n, tokens, d]
  const float* weight = nullptr;    // [n * d, outputs]
  const float* bias = nullptr;      // [outputs]
  const float* scale = nullptr;     // [3]  (alpha, beta, transport groups)
  float* alpha = nullptr;           // [tokens, n]
  float* beta = nullptr;            // [tokens, n]
  float* transport = nullptr;       // [tokens, n, n] or null (no transport outputs)
  float* z_rstd = nullptr;          // [tokens]
  // backward (alpha / beta / transport / z_rstd are then inputs)
  const float* dalpha = nullptr;      // [tokens, n] or null
  const float* dbeta = nullptr;       // [tokens, n] or null
  const float* dtransport = nullptr;  // [tokens, n, n] or null
  void* dretrieved = nullptr;         // += or null
  float* dweight = nullptr;           // += or null
  float* dbias = nullptr;             // += or null
  float* dscale = nullptr;            // [3] += or null
  // scratch (backward): dc and per-group dc*u sums per token, and dW partials
  float* token_dc = nullptr;      // [tokens, outputs]
  float* token_dscale = nullptr;  // [tokens, 3]
  float* partial = nullptr;       // kReduceSplits * n * d * outputs
  int64_t streams = 0;
  int64_t tokens = 0;
  int64_t d = 0;
  int64_t outputs = 0;
  float eps = 1e-6f;
  int sinkhorn_iterations = 20;
  Elem type = Elem::fp32;
};
void launch_dar_coefficients_forward(const DarCoefficientLaunchParams& p, cudaStream_t stream);
void launch_dar_coefficients_backward(const DarCoefficientLaunchParams& p, cudaStream_t stream);

struct DarMixParams {
  const void* retrieved = nullptr;  // [n, tokens, d]
  const float* alpha = nullptr;     // [tokens, n]
  void* out = nullptr;              // [tokens, d]
  const void* dout = nullptr;       // backward
  void* dretrieved = nullptr;       // += or null
  float* dalpha = nullptr;          // += or null
  int64_t streams = 0;
  int64_t tokens = 0;
  int64_t d = 0;
  Elem type = Elem::fp32;
};
void launch_dar_mix_forward(const DarMixParams& p, cudaStream_t stream);
void launch_dar_mix_backward(const DarMixParams& p, cudaStream_t stream);

// out[j, t] = sum_k transport[t, j, k] partial[k, t] + beta[t, j] y[t]
struct DarWriteParams {
  const float* transport = nullptr;  // [tokens, n, n] or null (together with partial)
  const void* partial = nullptr;     // [n, tokens, d] or null
  const float* beta = nullptr;       // [tokens, n] or null (together with y)
  const void* y = nullptr;           // [tokens, d] or null
  void* out = nullptr;               // [n, tokens, d]
  const void* dout = nullptr;        // backward
  float* dtransport = nullptr;       // += or null
  void* dpartial = nullptr;          // += or null
  float* dbeta = nullptr;            // += or null
  void* dy = nullptr;                // += or null
  int64_t streams = 0;
  int64_t tokens = 0;
  int64_t d = 0;
  Elem type = Elem::fp32;
};
void launch_dar_write_forward(const DarWriteParams& p, cudaStream_t stream);
void launch_dar_write_backward(const DarWriteParams& p, cudaStream_t stream);

}  // namespace modar::gpu
