// runtime/cuda/depth_read.cuh: AttnRes / DAR depth reads (prefix over the
// completed bank entries, closed-form merge of the partial).  Kernels:
// depth_read.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

inline constexpr int64_t kDepthReadMaxSources = 1024;
inline constexpr int64_t kDepthReadMaxDim = 8192;  // kRowThreads * kColumnsPerThread
// Token-loop blocks of the backward kernels: two per multiprocessor of a
// 132-SM H100 / H200 (128 left 4 SMs idle); the fp32 partials scale with it.
inline constexpr int kDepthReadBlocks = 264;
inline constexpr int64_t kDepthReadMaxSourceQueryPairs = 4000;  // 3 floats each: < 48 KB of smem

struct DepthReadPrefixParams {
  const void* keys = nullptr;       // [sources, tokens, d]
  const float* key_rstd = nullptr;  // [sources, tokens]
  const void* values = nullptr;     // [sources, tokens, d] (may equal keys)
  const float* queries = nullptr;   // [queries, d]
  void* out = nullptr;              // [queries, tokens, d]
  float* lse = nullptr;             // [queries, tokens]
  // backward
  const void* dout = nullptr;   // [queries, tokens, d]
  const float* dlse = nullptr;  // [queries, tokens] or null (= 0)
  void* dkeys = nullptr;        // += or null (may equal dvalues)
  void* dvalues = nullptr;      // += or null
  float* dqueries = nullptr;    // [queries, d] += or null
  float* partial = nullptr;     // scratch: kDepthReadBlocks * queries * d floats
  int64_t sources = 0;
  int64_t tokens = 0;
  int64_t queries_count = 0;
  int64_t d = 0;
  Elem type = Elem::fp32;
};
void launch_depth_read_prefix_forward(const DepthReadPrefixParams& params, cudaStream_t stream);
void launch_depth_read_prefix_backward(const DepthReadPrefixParams& params, cudaStream_t stream);

struct DepthReadMergeParams {
  const void* prefix_out = nullptr;         // [tokens, d]
  const float* prefix_lse = nullptr;        // [tokens]
  const void* partial_keys = nullptr;       // [tokens, d]
  const float* partial_key_rstd = nullptr;  // [tokens]
  const void* partial_values = nullptr;     // [tokens, d]
  const float* query = nullptr;             // [d]
  void* out = nullptr;                      // [tokens, d]
  float* partial_weight = nullptr;          // [tokens]  p (forward output, backward input)
  // backward
  const void* dout = nullptr;
  void* dprefix_out = nullptr;      // += or null
  float* dprefix_lse = nullptr;     // += or null
  void* dpartial_keys = nullptr;    // += or null (may equal dpartial_values)
  void* dpartial_values = nullptr;  // += or null
  float* dquery = nullptr;          // [d] += or null
  float* partial = nullptr;         // scratch: kDepthReadBlocks * d floats
  int64_t tokens = 0;
  int64_t d = 0;
  Elem type = Elem::fp32;
};
void launch_depth_read_merge_forward(const DepthReadMergeParams& params, cudaStream_t stream);
void launch_depth_read_merge_backward(const DepthReadMergeParams& params, cudaStream_t stream);

}  // namespace modar::gpu
