// runtime/cuda/attention.cuh: causal / full attention with GQA, per-sequence
// valid lengths, online softmax, saved lse.  Kernels: attention.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

inline constexpr int kAttentionMaxHeadDim = 256;

struct AttentionLaunchParams {
  const void* q = nullptr;                 // [batch, seq, heads, d_head]
  const void* k = nullptr;                 // [batch, seq, kv_heads, d_head]
  const void* v = nullptr;                 // [batch, seq, kv_heads, d_head]
  void* out = nullptr;                     // [batch, seq, heads, d_head]
  float* lse = nullptr;                    // [batch, heads, seq]
  const int32_t* valid_lengths = nullptr;  // [batch] or null (= seq)
  // backward only
  const void* dout = nullptr;  // [batch, seq, heads, d_head]
  void* dq = nullptr;          // += (or null)
  void* dk = nullptr;          // += (or null)
  void* dv = nullptr;          // += (or null)
  float* delta = nullptr;      // scratch [batch, heads, seq]: D_i = <dout_i, out_i>
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t d_head = 0;
  float softmax_scale = 0.0f;
  bool causal = true;
  Elem type = Elem::fp32;
};
void launch_attention_forward(const AttentionLaunchParams& params, cudaStream_t stream);
void launch_attention_backward(const AttentionLaunchParams& params, cudaStream_t stream);

}  // namespace modar::gpu
