// runtime/cuda/topk.cuh: MoD router logits and the per-sequence exact top-k.
// Kernels and the algorithm description: topk.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

// logits[i] = x[i, :] . w   (x, w: Elem; logits fp32)
void launch_router_forward(const void* x, const void* w, float* logits, int64_t rows, int64_t d,
                           Elem type, cudaStream_t stream);
// dx[i, :] += dlogits[i] w (dx may be null);  dw[:] += sum_i dlogits[i] x[i, :] (dw may be
// null, its type dw_type may differ from x's; uses partial: kReduceSplits * d floats).
void launch_router_backward(const float* dlogits, const void* x, const void* w, void* dx, void* dw,
                            Elem dw_type, float* partial, int64_t rows, int64_t d, Elem type,
                            cudaStream_t stream);

struct TopkParams {
  const float* logits = nullptr;    // [batch, seq_len]
  const int32_t* counts = nullptr;  // [batch] per-sequence k (ragged) or null: k = k_max
  int32_t* indices = nullptr;       // [batch, k_max]; slots >= k hold -1
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t k_max = 0;
};
void launch_topk(const TopkParams& params, cudaStream_t stream);

// mask[b, s] = 1 at indices[b, j] >= 0, else 0  (mask: Elem)
void launch_topk_mask(const int32_t* indices, void* mask, int64_t batch, int64_t seq_len, int64_t k,
                      Elem type, cudaStream_t stream);

}  // namespace modar::gpu
