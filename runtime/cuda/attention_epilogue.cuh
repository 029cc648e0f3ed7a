// runtime/cuda/attention_epilogue.cuh: the small kernels around cuDNN's fused
// SDPA (cudnn_attention.cpp), which has its own conventions:
//   * sequence lengths must lie in [0, seq]: ours are clamped (the backend
//     contract: out-of-range lengths are clamped, never read out of bounds);
//   * padded query rows (t >= length) must have out = 0 and lse = 0, and
//     cuDNN leaves them unspecified;
//   * cuDNN OVERWRITES dq / dk / dv; the Backend contract ACCUMULATES (+=)
//     and padded rows receive no gradient.
// All are bandwidth-bound row kernels with 16-byte bf16 accesses.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

// out[i] = clamp(lengths[i], 0, seq), or seq when lengths is null.
void launch_clamp_lengths(const int32_t* lengths, int32_t* out, int64_t batch, int64_t seq,
                          cudaStream_t stream);

// For every sequence b and t >= lengths[b]: out[b, t, :] = 0 (bf16, `width`
// elements per row) and lse[b, h, t] = 0 for all h < heads.
void launch_zero_padded_rows(void* out, float* lse, const int32_t* lengths, int64_t batch,
                             int64_t seq, int64_t heads, int64_t width, cudaStream_t stream);

// grad[b, t, :] += update[b, t, :] for t < lengths[b] (all t when lengths is
// null); bf16, `width` elements per row, fp32 sum rounded once.
void launch_accumulate_rows(void* grad, const void* update, const int32_t* lengths,
                            int64_t batch, int64_t seq, int64_t width, cudaStream_t stream);

}  // namespace modar::gpu
