// runtime/cuda/depth_read.cu: AttnRes / DAR depth reads (docs/dar_math.md 4, 5.1, 5.2, 6).
//
// Prefix read, per query q and token t over sources r (no 1/sqrt(d)):
//   s_r = q' . key[r, t] * rstd[r, t],  lse = log sum_r exp(s_r),
//   out[q, t] = sum_r exp(s_r - lse) value[r, t]
// Backward (docs/dar_math.md 5.1), with a_r = exp(s_r - lse), k^_r = key[r, t] rstd_r:
//   dp_r = <value_r, dout>,  Delta = <out, dout>,  ds_r = a_r (dp_r - Delta + dlse)
//   dvalue_r += a_r dout;  dkey_r += ds_r rstd_r (q' - s_r k^_r / d);  dq' += sum ds_r k^_r
// (the key term includes the path through rstd, so rstd is never differentiated).
// Merge (docs/dar_math.md 5.2): s_P = q' . k_P rstd_P, p = sigmoid(s_P - lse),
//   out = o + p (v_P - o);  backward: do += (1 - p) dout, dv_P += p dout,
//   g = <dout, v_P - o>, ds_P = p (1 - p) g, dlse -= ds_P, key path as above.
//
// Layout: sources-major [R][T][d] (a contiguous slice of the stream-major
// bank), stats [R][T] / [Q][T] fp32.  "Full d per token": a block of
// kRowThreads threads owns one token and each thread owns the columns
// c = tid + 256 u (u < kColumnsPerThread, so d <= 8192), kept in registers.
//  * Prefix forward: grid (T, Q); ONE pass over the sources with an online
//    softmax (running max m, sum l, accumulator in registers), a block
//    reduction per source for the logit.
//  * Prefix backward: kDepthReadBlocks blocks loop over tokens.  Per token a
//    first pass computes the (query, source) statistics into shared memory, a
//    second pass sums every gradient element over the queries in fp32 and
//    writes it once (dkeys / dvalues may be the same tensor: then one combined
//    write), so a bf16 gradient is rounded once, as on the CPU.  dq' goes into
//    the block's own fp32 partial row, reduced at the end (deterministic).
//  * Merge forward / backward: one block per token; the backward's dq' also
//    through per-block partials.
#include "check.hpp"
#include "common.cuh"
#include "depth_read.cuh"

namespace modar::gpu {

namespace {

constexpr int kColumnsPerThread = static_cast<int>(kDepthReadMaxDim / kRowThreads);  // 32
constexpr float kNegativeInfinity = -__builtin_huge_valf();

template <typename T>
__global__ void __launch_bounds__(kRowThreads) prefix_forward_kernel(DepthReadPrefixParams p) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int64_t q = blockIdx.y;
  const T* keys = static_cast<const T*>(p.keys);
  const T* values = static_cast<const T*>(p.values);
  const float* query = p.queries + q * p.d;
  float acc[kColumnsPerThread];
#pragma unroll
  for (int u = 0; u < kColumnsPerThread; ++u) {
    acc[u] = 0.0f;
  }
  float running_max = kNegativeInfinity;
  float running_sum = 0.0f;
  for (int64_t r = 0; r < p.sources; ++r) {
    const int64_t row = (r * p.tokens + t) * p.d;
    float partial_dot = 0.0f;
    for (int64_t c = threadIdx.x; c < p.d; c += kRowThreads) {
      partial_dot += query[c] * load_float(keys + row + c);
    }
    const float score = block_sum(partial_dot, scratch) * p.key_rstd[r * p.tokens + t];
    const float new_max = fmaxf(running_max, score);
    const float correction = running_max == kNegativeInfinity ? 0.0f : expf(running_max - new_max);
    const float weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
    running_max = new_max;
#pragma unroll
    for (int u = 0; u < kColumnsPerThread; ++u) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kRowThreads;
      if (c < p.d) {
        acc[u] = acc[u] * correction + weight * load_float(values + row + c);
      }
    }
  }
  T* out = static_cast<T*>(p.out) + (q * p.tokens + t) * p.d;
  const float inv_sum = 1.0f / running_sum;
#pragma unroll
  for (int u = 0; u < kColumnsPerThread; ++u) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kRowThreads;
    if (c < p.d) {
      store_float(out + c, acc[u] * inv_sum);
    }
  }
  if (threadIdx.x == 0) {
    p.lse[q * p.tokens + t] = running_max + logf(running_sum);
  }
}

// Adds one element's key and value gradients at `at`: once, summed, when the
// keys and values are one tensor (`shared`), else into each one given.
template <typename T>
__device__ __forceinline__ void add_key_value_grad(T* dkeys, T* dvalues, bool shared, int64_t at,
                                                   float dkey, float dvalue) {
  if (shared) {
    store_float(dkeys + at, load_float(dkeys + at) + dkey + dvalue);
  } else {
    if (dvalues != nullptr) {
      store_float(dvalues + at, load_float(dvalues + at) + dvalue);
    }
    if (dkeys != nullptr) {
      store_float(dkeys + at, load_float(dkeys + at) + dkey);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) prefix_backward_kernel(DepthReadPrefixParams p) {
  __shared__ float scratch[32];
  // [3][queries][sources]: s_qr, a_qr, ds_qr of the current token
  extern __shared__ float source_stats[];
  const int64_t pairs = p.queries_count * p.sources;
  float* scores = source_stats;
  float* weights = scores + pairs;
  float* dscores = weights + pairs;
  const T* keys = static_cast<const T*>(p.keys);
  const T* values = static_cast<const T*>(p.values);
  const T* dout_all = static_cast<const T*>(p.dout);
  const T* out_all = static_cast<const T*>(p.out);
  T* dkeys = static_cast<T*>(p.dkeys);
  T* dvalues = static_cast<T*>(p.dvalues);
  // One tensor for both gradients (AttnRes): one read-modify-write per element.
  const bool shared_grad = dkeys != nullptr && dkeys == dvalues;
  float* dq_partial =
      p.partial != nullptr ? p.partial + blockIdx.x * p.queries_count * p.d : nullptr;
  const float inv_d = 1.0f / static_cast<float>(p.d);
  if (dq_partial != nullptr) {
    for (int64_t i = threadIdx.x; i < p.queries_count * p.d; i += kRowThreads) {
      dq_partial[i] = 0.0f;
    }
  }
  __syncthreads();  // zeroed by other threads than the ones that accumulate
  for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    // Pass 1: the per-(query, source) statistics of token t.
    for (int64_t q = 0; q < p.queries_count; ++q) {
      const float* query = p.queries + q * p.d;
      const T* dout = dout_all + (q * p.tokens + t) * p.d;
      const T* out = out_all + (q * p.tokens + t) * p.d;
      const float lse = p.lse[q * p.tokens + t];
      const float dlse = p.dlse != nullptr ? p.dlse[q * p.tokens + t] : 0.0f;
      // Delta = <out, dout> (as the CPU backend; equals sum_r a_r dp_r when out
      // is the forward's output, and stays consistent with a rounded bf16 out).
      float partial_delta = 0.0f;
      for (int64_t c = threadIdx.x; c < p.d; c += kRowThreads) {
        partial_delta += load_float(out + c) * load_float(dout + c);
      }
      const float delta = block_sum(partial_delta, scratch);
      for (int64_t r = 0; r < p.sources; ++r) {
        const int64_t row = (r * p.tokens + t) * p.d;
        float partial_score = 0.0f;
        float partial_dp = 0.0f;
        for (int64_t c = threadIdx.x; c < p.d; c += kRowThreads) {
          partial_score += query[c] * load_float(keys + row + c);
          partial_dp += load_float(values + row + c) * load_float(dout + c);
        }
        const float score = block_sum(partial_score, scratch) * p.key_rstd[r * p.tokens + t];
        const float dp = block_sum(partial_dp, scratch);
        const float weight = expf(score - lse);
        if (threadIdx.x == 0) {
          scores[q * p.sources + r] = score;
          weights[q * p.sources + r] = weight;
          dscores[q * p.sources + r] = weight * (dp - delta + dlse);
        }
      }
    }
    __syncthreads();
    // Pass 2: every gradient element of token t summed over the queries in
    // fp32 and written ONCE (a bf16 gradient is rounded once, as on the CPU).
    for (int64_t r = 0; r < p.sources; ++r) {
      const int64_t row = (r * p.tokens + t) * p.d;
      const float rstd = p.key_rstd[r * p.tokens + t];
      for (int64_t c = threadIdx.x; c < p.d; c += kRowThreads) {
        const float key_hat = load_float(keys + row + c) * rstd;
        float dvalue = 0.0f;
        float dkey = 0.0f;
        for (int64_t q = 0; q < p.queries_count; ++q) {
          const int64_t pair = q * p.sources + r;
          const float ds = dscores[pair];
          dvalue += weights[pair] * load_float(dout_all + (q * p.tokens + t) * p.d + c);
          dkey += ds * rstd * (p.queries[q * p.d + c] - scores[pair] * key_hat * inv_d);
          if (dq_partial != nullptr) {
            dq_partial[q * p.d + c] += ds * key_hat;
          }
        }
        add_key_value_grad(dkeys, dvalues, shared_grad, row + c, dkey, dvalue);
      }
    }
    __syncthreads();  // source_stats is rewritten for the next token
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) merge_forward_kernel(DepthReadMergeParams p) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int64_t row = t * p.d;
  const T* keys = static_cast<const T*>(p.partial_keys);
  const T* values = static_cast<const T*>(p.partial_values);
  const T* prefix = static_cast<const T*>(p.prefix_out);
  T* out = static_cast<T*>(p.out);
  float partial_dot = 0.0f;
  for (int64_t c = threadIdx.x; c < p.d; c += kRowThreads) {
    partial_dot += p.query[c] * load_float(keys + row + c);
  }
  const float score = block_sum(partial_dot, scratch) * p.partial_key_rstd[t];
  const float weight = sigmoid(score - p.prefix_lse[t]);
  for (int64_t c = threadIdx.x; c < p.d; c += kRowThreads) {
    const float o = load_float(prefix + row + c);
    store_float(out + row + c, o + weight * (load_float(values + row + c) - o));
  }
  if (threadIdx.x == 0) {
    p.partial_weight[t] = weight;
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) merge_backward_kernel(DepthReadMergeParams p) {
  __shared__ float scratch[32];
  const T* keys = static_cast<const T*>(p.partial_keys);
  const T* values = static_cast<const T*>(p.partial_values);
  const T* prefix = static_cast<const T*>(p.prefix_out);
  const T* dout = static_cast<const T*>(p.dout);
  T* dprefix = static_cast<T*>(p.dprefix_out);
  T* dkeys = static_cast<T*>(p.dpartial_keys);
  T* dvalues = static_cast<T*>(p.dpartial_values);
  const bool shared_grad = dkeys != nullptr && dkeys == dvalues;  // one write per element
  const float inv_d = 1.0f / static_cast<float>(p.d);
  float dq_acc[kColumnsPerThread];
#pragma unroll
  for (int u = 0; u < kColumnsPerThread; ++u) {
    dq_acc[u] = 0.0f;
  }
  for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    const int64_t row = t * p.d;
    const float rstd = p.partial_key_rstd[t];
    const float weight = p.partial_weight[t];
    float partial_score = 0.0f;
    float partial_g = 0.0f;
    for (int64_t c = threadIdx.x; c < p.d; c += kRowThreads) {
      partial_score += p.query[c] * load_float(keys + row + c);
      partial_g += load_float(dout + row + c) *
                   (load_float(values + row + c) - load_float(prefix + row + c));
    }
    const float score = block_sum(partial_score, scratch) * rstd;
    const float g = block_sum(partial_g, scratch);
    const float ds = weight * (1.0f - weight) * g;
    if (threadIdx.x == 0 && p.dprefix_lse != nullptr) {
      p.dprefix_lse[t] -= ds;
    }
#pragma unroll
    for (int u = 0; u < kColumnsPerThread; ++u) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kRowThreads;
      if (c < p.d) {
        const float dout_c = load_float(dout + row + c);
        if (dprefix != nullptr) {
          store_float(dprefix + row + c, load_float(dprefix + row + c) + (1.0f - weight) * dout_c);
        }
        const float key_hat = load_float(keys + row + c) * rstd;
        const float dvalue = weight * dout_c;
        const float dkey = ds * rstd * (p.query[c] - score * key_hat * inv_d);
        add_key_value_grad(dkeys, dvalues, shared_grad, row + c, dkey, dvalue);
        dq_acc[u] += ds * key_hat;
      }
    }
  }
  if (p.partial != nullptr) {
#pragma unroll
    for (int u = 0; u < kColumnsPerThread; ++u) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kRowThreads;
      if (c < p.d) {
        p.partial[blockIdx.x * p.d + c] = dq_acc[u];
      }
    }
  }
}

void check_dim(const char* op, int64_t d) {
  MODAR_GPU_REQUIRE(
      op, d >= 1 && d <= kDepthReadMaxDim,
      "d must be in [1, " + std::to_string(kDepthReadMaxDim) + "], got " + std::to_string(d));
}

int token_blocks(int64_t tokens) {
  return static_cast<int>(tokens < kDepthReadBlocks ? tokens : kDepthReadBlocks);
}

}  // namespace

void launch_depth_read_prefix_forward(const DepthReadPrefixParams& p, cudaStream_t stream) {
  check_dim("depth_read_prefix_forward", p.d);
  MODAR_GPU_REQUIRE(
      "depth_read_prefix_forward", p.sources >= 1 && p.queries_count <= 65535,
      "need sources >= 1 and queries in [0, 65535], got sources = " + std::to_string(p.sources) +
          ", queries = " + std::to_string(p.queries_count));
  if (p.tokens == 0 || p.queries_count == 0) {
    return;
  }
  const dim3 grid(one_block_per_row("depth_read_prefix_forward", "tokens", p.tokens),
                  static_cast<unsigned>(p.queries_count));
  launch_typed(p.type, [&](auto tag) {
    prefix_forward_kernel<decltype(tag)><<<grid, kRowThreads, 0, stream>>>(p);
  });
}

void launch_depth_read_prefix_backward(const DepthReadPrefixParams& p, cudaStream_t stream) {
  check_dim("depth_read_prefix_backward", p.d);
  MODAR_GPU_REQUIRE("depth_read_prefix_backward",
                    p.sources >= 1 && p.sources <= kDepthReadMaxSources,
                    "sources must be in [1, " + std::to_string(kDepthReadMaxSources) + "], got " +
                        std::to_string(p.sources));
  MODAR_GPU_REQUIRE(
      "depth_read_prefix_backward", p.sources * p.queries_count <= kDepthReadMaxSourceQueryPairs,
      "sources * queries must be <= " + std::to_string(kDepthReadMaxSourceQueryPairs) +
          " (the backward keeps 3 floats per pair in 48 KB of shared memory), got " +
          std::to_string(p.sources * p.queries_count));
  MODAR_GPU_REQUIRE("depth_read_prefix_backward", p.dqueries == nullptr || p.partial != nullptr,
                    "a query gradient needs the partial-sum scratch");
  if (p.tokens == 0 || p.queries_count == 0) {
    return;
  }
  DepthReadPrefixParams params = p;
  if (p.dqueries == nullptr) {
    params.partial = nullptr;
  }
  const int blocks = token_blocks(p.tokens);
  const size_t shared_bytes = sizeof(float) * 3 * static_cast<size_t>(p.sources * p.queries_count);
  launch_typed(p.type, [&](auto tag) {
    prefix_backward_kernel<decltype(tag)><<<blocks, kRowThreads, shared_bytes, stream>>>(params);
  });
  if (p.dqueries != nullptr) {
    launch_reduce_partials(p.partial, blocks, p.queries_count * p.d, p.dqueries, Elem::fp32,
                           stream);
  }
}

void launch_depth_read_merge_forward(const DepthReadMergeParams& p, cudaStream_t stream) {
  check_dim("depth_read_merge_forward", p.d);
  if (p.tokens == 0) {
    return;
  }
  const unsigned blocks = one_block_per_row("depth_read_merge_forward", "tokens", p.tokens);
  launch_typed(p.type, [&](auto tag) {
    merge_forward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(p);
  });
}

void launch_depth_read_merge_backward(const DepthReadMergeParams& p, cudaStream_t stream) {
  check_dim("depth_read_merge_backward", p.d);
  MODAR_GPU_REQUIRE("depth_read_merge_backward", p.dquery == nullptr || p.partial != nullptr,
                    "a query gradient needs the partial-sum scratch");
  if (p.tokens == 0) {
    return;
  }
  DepthReadMergeParams params = p;
  if (p.dquery == nullptr) {
    params.partial = nullptr;
  }
  const int blocks = token_blocks(p.tokens);
  launch_typed(p.type, [&](auto tag) {
    merge_backward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(params);
  });
  if (p.dquery != nullptr) {
    launch_reduce_partials(p.partial, blocks, p.d, p.dquery, Elem::fp32, stream);
  }
}

}  // namespace modar::gpu
