// runtime/cuda/moe.cuh: the Mixture-of-Experts ops on the GPU (route, load
// balancing and z losses, dispatch, permute / combine).  The grouped GEMM is
// one cuBLASLt GEMM per expert, issued by the backend (cuda_backend.cpp).
// Kernels: moe.cu; semantics: runtime/cpu/moe.cpp (the reference).
#pragma once

#include "launch.hpp"

namespace modar::gpu {

// Router statistics: logits / probs [tokens, experts] fp32, indices i32
// [tokens, k], gates fp32 [tokens, k].
struct MoeRouteParams {
  int64_t tokens = 0;
  int64_t experts = 0;
  int64_t k = 0;
  bool renormalize = false;
};

// p = softmax(logits); indices = top-k by logit (descending, ties to the lower
// expert, NaN last); gates = p[indices] (renormalize: / their sum).
void launch_moe_route_forward(const MoeRouteParams& p, const float* logits, float* probs,
                              int32_t* indices, float* gates, cudaStream_t stream);
// dlogits += softmax backward of dp, dp[indices_j] = dgates_j (renormalize:
// (dgates_j - <dgates, gates>) / sum_j probs[indices_j]).
void launch_moe_route_backward(const MoeRouteParams& p, const float* dgates, const float* probs,
                               const int32_t* indices, const float* gates, float* dlogits,
                               cudaStream_t stream);
// loss[0] = E sum_e f_e P_e, loss[1] = mean_t logsumexp_t^2 (double sums).
void launch_moe_aux_loss_forward(const MoeRouteParams& p, const float* logits, const float* probs,
                                 const int32_t* indices, float* loss, cudaStream_t stream);
// dlogits += daux d aux / d logits + dz d z / d logits.  `counts_scratch`:
// `experts` floats of device scratch.
void launch_moe_aux_loss_backward(const MoeRouteParams& p, double daux, double dz,
                                  const float* logits, const float* probs, const int32_t* indices,
                                  float* dlogits, float* counts_scratch, cudaStream_t stream);

// Keep / drop each assignment (priority: every first choice in token order,
// then every second choice...; capacity 0 = dropless; indices >= experts are
// null experts) and number the kept ones expert-major, token order within an
// expert.  counts [experts], slots [tokens, k] (-1 = dropped).  One device
// thread: a sequential scan, as the priority order is inherently serial.
// `cursor_scratch`: `experts` int32 of device scratch.
void launch_moe_dispatch(int64_t tokens, int64_t k, int64_t experts, int64_t capacity,
                         const int32_t* indices, int32_t* counts, int32_t* slots,
                         int32_t* cursor_scratch, cudaStream_t stream);

// Rows of tokens x [tokens, d] and of expert slots [rows, d], Elem storage.
struct MoeRowsParams {
  int64_t tokens = 0;
  int64_t k = 0;
  int64_t d = 0;
  int64_t rows = 0;  // expert-slot rows
  const int32_t* slots = nullptr;
  Elem type = Elem::fp32;
};

// out[slot] = x[t] (pure row copy); rows no slot names are zero
void launch_moe_permute_forward(const MoeRowsParams& p, const void* x, void* out,
                                cudaStream_t stream);
// dx[t] += sum_j dout[slot_j]
void launch_moe_permute_backward(const MoeRowsParams& p, const void* dout, void* dx,
                                 cudaStream_t stream);
// out[t] = sum_j gates_j y[slot_j]
void launch_moe_unpermute_forward(const MoeRowsParams& p, const void* y, const float* gates,
                                  void* out, cudaStream_t stream);
// dy[slot_j] += gates_j dout[t];  dgates_j += <dout[t], y[slot_j]>  (either may be null)
void launch_moe_unpermute_backward(const MoeRowsParams& p, const void* dout, const void* y,
                                   const float* gates, void* dy, float* dgates,
                                   cudaStream_t stream);

}  // namespace modar::gpu
