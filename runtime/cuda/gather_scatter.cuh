// runtime/cuda/gather_scatter.cuh: MoD gather of routed rows and the scaled
// scatter-add into the residual.  Kernels: gather_scatter.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

enum class GateKind : uint8_t { linear, sigmoid };  // g(r) = r | sigmoid(r)

struct RoutedRowsParams {
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t k = 0;  // slots per sequence (index -1 = unused slot)
  int64_t d = 0;
  const int32_t* indices = nullptr;  // [batch, k]
  Elem type = Elem::fp32;
};

// out[b, j] = x[b, indices[b, j]] (zero row for -1)
void launch_gather_rows_forward(const RoutedRowsParams& p, const void* x, void* out,
                                cudaStream_t stream);
// dx[b, indices[b, j]] += dout[b, j]
void launch_gather_rows_backward(const RoutedRowsParams& p, const void* dout, void* dx,
                                 cudaStream_t stream);
// x[b, p] += g(r[b, p]) * delta[b, j], p = indices[b, j]
void launch_scatter_add_scaled_forward(const RoutedRowsParams& p, void* x,
                                       const float* router_logits, const void* delta, GateKind gate,
                                       cudaStream_t stream);
// ddelta[b, j] += g(r) dx[b, p];  drouter_logits[b, p] += g'(r) <dx[b, p], delta[b, j]>
void launch_scatter_add_scaled_backward(const RoutedRowsParams& p, const void* dx,
                                        const float* router_logits, const void* delta,
                                        GateKind gate, void* ddelta, float* drouter_logits,
                                        cudaStream_t stream);

}  // namespace modar::gpu
