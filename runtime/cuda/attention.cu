// runtime/cuda/attention.cu: tiled, flash-style attention (correctness first).
//
// Math: per batch b, head h (kv head g = h / (heads / kv_heads)), query i and
// visible key j (j < len_b, and j <= i when causal; len_b = valid length):
//   s_ij = scale q_i . k_j,   lse_i = log sum_j exp(s_ij),   o_i = sum_j exp(s_ij - lse_i) v_j
// Padding queries (i >= len_b) get o = 0 and lse = 0 and no gradient.
// Backward (FlashAttention-2): D_i = <do_i, o_i>, p_ij = exp(s_ij - lse_i),
//   dv_j += sum_i p_ij do_i,  ds_ij = p_ij (do_i . v_j - D_i),
//   dq_i += scale sum_j ds_ij k_j,  dk_j += scale sum_i ds_ij q_i.
//
// Kernel design (fp32 arithmetic on CUDA cores; no tensor cores yet):
//  * Tiles of 32 queries x 32 keys; a block has 4 warps, each warp owns 8 rows
//    of the tile.  In the score step lane = the column (key or query) of the
//    other tile, so row max / row sum are warp shuffles and need no barrier;
//    in the accumulate step lane owns the feature columns c = lane + 32 t
//    (t < d_head / 32 <= 8), the accumulators live in registers, and the
//    probabilities are broadcast with __shfl_sync.
//  * Tiles are staged in shared memory as fp32.  Tiles read with lane = row
//    are padded to d_head + 1 floats per row (no bank conflicts); tiles read
//    as a broadcast row are not padded.
//  * Forward: online softmax over the key tiles (running max m, sum l), one
//    pass, writes o and lse.  Backward: a dk/dv kernel (one block per key
//    tile, looping over the query heads of its kv head and the query tiles)
//    and a dq kernel (one block per query tile, looping over key tiles);
//    both recompute p from the saved lse.  No atomics: deterministic.
//  * Dynamic shared memory is above 48 KB for d_head > 96; the launcher raises
//    the kernel's limit with cudaFuncSetAttribute.
#include "attention.cuh"
#include "check.hpp"
#include "common.cuh"

namespace modar::gpu {

namespace {

constexpr int kTile = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRowsPerWarp = kTile / kWarps;                          // 8
constexpr int kMaxColumnsPerLane = kAttentionMaxHeadDim / kWarpSize;  // 8
constexpr float kNegativeInfinity = -__builtin_huge_valf();

__device__ __forceinline__ int64_t qo_offset(const AttentionLaunchParams& p, int64_t b, int64_t pos,
                                             int64_t head) {
  return ((b * p.seq + pos) * p.heads + head) * p.d_head;
}
__device__ __forceinline__ int64_t kv_offset(const AttentionLaunchParams& p, int64_t b, int64_t pos,
                                             int64_t head) {
  return ((b * p.seq + pos) * p.kv_heads + head) * p.d_head;
}

// Valid length of sequence b, clamped to [0, seq]: index values are data the
// CUDA backend does not check (the CPU backend does), so a bad length must not
// turn into an out-of-bounds read.
__device__ __forceinline__ int64_t valid_length(const AttentionLaunchParams& p, int64_t b) {
  if (p.valid_lengths == nullptr) {
    return p.seq;
  }
  const int64_t len = p.valid_lengths[b];
  return len < 0 ? 0 : (len > p.seq ? p.seq : len);
}

// Stage rows [first, first + kTile) of a [.., heads_total, d_head] tensor into
// shared memory with the given row pitch; rows >= len are zero.
template <typename T>
__device__ void load_tile(float* tile, int pitch, const T* base, int64_t first, int64_t len,
                          int64_t row_stride, int d_head) {
  for (int idx = threadIdx.x; idx < kTile * d_head; idx += kThreads) {
    const int r = idx / d_head;
    const int c = idx - r * d_head;
    const int64_t row = first + r;
    tile[r * pitch + c] = row < len ? load_float(base + row * row_stride + c) : 0.0f;
  }
}

// The backward's recomputed probability p_ij = exp(scale q_i . k_j - lse_i)
// (0 where key j is not visible) and ds_ij = p_ij (do_i . v_j - D_i), from the
// staged rows: query i at q_tile / do_tile + query_at, key j at k_tile /
// v_tile + key_at.
struct ProbAndScoreGrad {
  float prob;
  float ds;
};
__device__ __forceinline__ ProbAndScoreGrad backward_prob(const float* q_tile, const float* do_tile,
                                                          int query_at, const float* k_tile,
                                                          const float* v_tile, int key_at, int d,
                                                          bool visible, float softmax_scale,
                                                          const float& lse, const float& delta) {
  float score = 0.0f;
  float dp = 0.0f;
  for (int c = 0; c < d; ++c) {
    score += q_tile[query_at + c] * k_tile[key_at + c];
    dp += do_tile[query_at + c] * v_tile[key_at + c];
  }
  const float prob = visible ? expf(score * softmax_scale - lse) : 0.0f;
  return {prob, prob * (dp - delta)};
}

template <typename T>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(AttentionLaunchParams p) {
  extern __shared__ float shared[];
  const int d = static_cast<int>(p.d_head);
  float* q_tile = shared;                    // [32][d]      (broadcast rows)
  float* k_tile = q_tile + kTile * d;        // [32][d + 1]  (lane = key)
  float* v_tile = k_tile + kTile * (d + 1);  // [32][d]      (lane = column)
  const int64_t b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const int64_t g = h / (p.heads / p.kv_heads);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t len = valid_length(p, b);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);

  load_tile(q_tile, d, q + qo_offset(p, b, 0, h), q0, len, p.heads * p.d_head, d);
  float row_max[kRowsPerWarp];
  float row_sum[kRowsPerWarp];
  float acc[kRowsPerWarp][kMaxColumnsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    row_max[rr] = kNegativeInfinity;
    row_sum[rr] = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxColumnsPerLane; ++t) {
      acc[rr][t] = 0.0f;
    }
  }
  // Keys needed by this query tile (uniform over the block).
  const int64_t last_query = q0 + kTile < len ? q0 + kTile : len;
  // A tile of padding queries skips the key loop and writes zeros.
  const int64_t key_end = q0 >= len ? 0 : (p.causal ? last_query : len);
  for (int64_t k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // previous tiles fully consumed (and q_tile stored, first time)
    load_tile(k_tile, d + 1, k + kv_offset(p, b, 0, g), k0, len, p.kv_heads * p.d_head, d);
    load_tile(v_tile, d, v + kv_offset(p, b, 0, g), k0, len, p.kv_heads * p.d_head, d);
    __syncthreads();
    const int64_t key = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t query = q0 + r;
      const bool visible = query < len && key < len && (!p.causal || key <= query);
      float score = 0.0f;
      for (int c = 0; c < d; ++c) {
        score += q_tile[r * d + c] * k_tile[lane * (d + 1) + c];
      }
      score = visible ? score * p.softmax_scale : kNegativeInfinity;
      const float tile_max = warp_max(score);
      const float new_max = fmaxf(row_max[rr], tile_max);
      const float prob = visible ? expf(score - new_max) : 0.0f;
      const float correction =
          row_max[rr] == kNegativeInfinity ? 0.0f : expf(row_max[rr] - new_max);
      row_sum[rr] = row_sum[rr] * correction + warp_sum(prob);
      row_max[rr] = new_max;
#pragma unroll
      for (int t = 0; t < kMaxColumnsPerLane; ++t) {
        acc[rr][t] *= correction;
      }
#pragma unroll 4
      for (int jj = 0; jj < kTile; ++jj) {
        const float pj = __shfl_sync(kFullWarpMask, prob, jj);
#pragma unroll
        for (int t = 0; t < kMaxColumnsPerLane; ++t) {
          const int c = lane + t * kWarpSize;
          if (c < d) {
            acc[rr][t] += pj * v_tile[jj * d + c];
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t query = q0 + warp * kRowsPerWarp + rr;
    if (query >= p.seq) {
      continue;
    }
    const bool valid = query < len;
    const float inv_sum = valid ? 1.0f / row_sum[rr] : 0.0f;
    T* out_row = out + qo_offset(p, b, query, h);
#pragma unroll
    for (int t = 0; t < kMaxColumnsPerLane; ++t) {
      const int c = lane + t * kWarpSize;
      if (c < d) {
        store_float(out_row + c, valid ? acc[rr][t] * inv_sum : 0.0f);
      }
    }
    if (lane == 0) {
      p.lse[(b * p.heads + h) * p.seq + query] = valid ? row_max[rr] + logf(row_sum[rr]) : 0.0f;
    }
  }
}

// D[b, h, i] = <dout_i, out_i>; one warp per (b, i, h).
template <typename T>
__global__ void attention_delta_kernel(AttentionLaunchParams p) {
  const int64_t item =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (item >= p.batch * p.seq * p.heads) {
    return;
  }
  const int64_t h = item % p.heads;
  const int64_t bi = item / p.heads;
  const int64_t i = bi % p.seq;
  const int64_t b = bi / p.seq;
  const T* dout = static_cast<const T*>(p.dout) + item * p.d_head;
  const T* out = static_cast<const T*>(p.out) + item * p.d_head;
  float sum = 0.0f;
  for (int64_t c = lane; c < p.d_head; c += kWarpSize) {
    sum += load_float(dout + c) * load_float(out + c);
  }
  sum = warp_sum(sum);
  if (lane == 0) {
    p.delta[(b * p.heads + h) * p.seq + i] = sum;
  }
}

// One block per (key tile, kv head, batch): dk and dv of 32 keys.
template <typename T>
__global__ void __launch_bounds__(kThreads) attention_dkdv_kernel(AttentionLaunchParams p) {
  extern __shared__ float shared[];
  const int d = static_cast<int>(p.d_head);
  float* k_tile = shared;                       // [32][d]     broadcast rows
  float* v_tile = k_tile + kTile * d;           // [32][d]     broadcast rows
  float* q_tile = v_tile + kTile * d;           // [32][d + 1] lane = query (dots), lane = column
  float* do_tile = q_tile + kTile * (d + 1);    // [32][d + 1]
  float* lse_tile = do_tile + kTile * (d + 1);  // [32]
  float* delta_tile = lse_tile + kTile;         // [32]
  const int64_t b = blockIdx.z;
  const int64_t g = blockIdx.y;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t len = valid_length(p, b);
  if (k0 >= len) {
    return;  // padding keys receive no gradient (uniform over the block)
  }
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t group = p.heads / p.kv_heads;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);

  load_tile(k_tile, d, k + kv_offset(p, b, 0, g), k0, len, p.kv_heads * p.d_head, d);
  load_tile(v_tile, d, v + kv_offset(p, b, 0, g), k0, len, p.kv_heads * p.d_head, d);
  float dk_acc[kRowsPerWarp][kMaxColumnsPerLane];
  float dv_acc[kRowsPerWarp][kMaxColumnsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int t = 0; t < kMaxColumnsPerLane; ++t) {
      dk_acc[rr][t] = 0.0f;
      dv_acc[rr][t] = 0.0f;
    }
  }
  const int64_t query_begin = p.causal ? k0 : 0;  // k0 is a multiple of kTile
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t h = g * group + hh;
    for (int64_t q0 = query_begin; q0 < len; q0 += kTile) {
      __syncthreads();  // previous tiles consumed (and k/v tiles stored, first time)
      load_tile(q_tile, d + 1, q + qo_offset(p, b, 0, h), q0, len, p.heads * p.d_head, d);
      load_tile(do_tile, d + 1, dout + qo_offset(p, b, 0, h), q0, len, p.heads * p.d_head, d);
      if (threadIdx.x < kTile) {
        const int64_t query = q0 + threadIdx.x;
        const int64_t stat = (b * p.heads + h) * p.seq + query;
        lse_tile[threadIdx.x] = query < len ? p.lse[stat] : 0.0f;
        delta_tile[threadIdx.x] = query < len ? p.delta[stat] : 0.0f;
      }
      __syncthreads();
      const int64_t query = q0 + lane;
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int r = warp * kRowsPerWarp + rr;
        const int64_t key = k0 + r;
        const bool visible = query < len && key < len && (!p.causal || key <= query);
        const ProbAndScoreGrad pd =
            backward_prob(q_tile, do_tile, lane * (d + 1), k_tile, v_tile, r * d, d, visible,
                          p.softmax_scale, lse_tile[lane], delta_tile[lane]);
#pragma unroll 4
        for (int ii = 0; ii < kTile; ++ii) {
          const float pi = __shfl_sync(kFullWarpMask, pd.prob, ii);
          const float dsi = __shfl_sync(kFullWarpMask, pd.ds, ii);
#pragma unroll
          for (int t = 0; t < kMaxColumnsPerLane; ++t) {
            const int c = lane + t * kWarpSize;
            if (c < d) {
              dv_acc[rr][t] += pi * do_tile[ii * (d + 1) + c];
              dk_acc[rr][t] += dsi * q_tile[ii * (d + 1) + c];
            }
          }
        }
      }
    }
  }
  T* dk = static_cast<T*>(p.dk);
  T* dv = static_cast<T*>(p.dv);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t key = k0 + warp * kRowsPerWarp + rr;
    if (key >= len) {
      continue;
    }
#pragma unroll
    for (int t = 0; t < kMaxColumnsPerLane; ++t) {
      const int c = lane + t * kWarpSize;
      if (c < d) {
        if (dk != nullptr) {
          T* target = dk + kv_offset(p, b, key, g) + c;
          store_float(target, load_float(target) + p.softmax_scale * dk_acc[rr][t]);
        }
        if (dv != nullptr) {
          T* target = dv + kv_offset(p, b, key, g) + c;
          store_float(target, load_float(target) + dv_acc[rr][t]);
        }
      }
    }
  }
}

// One block per (query tile, head, batch): dq of 32 queries.
template <typename T>
__global__ void __launch_bounds__(kThreads) attention_dq_kernel(AttentionLaunchParams p) {
  extern __shared__ float shared[];
  const int d = static_cast<int>(p.d_head);
  float* q_tile = shared;                    // [32][d]     broadcast rows
  float* do_tile = q_tile + kTile * d;       // [32][d]     broadcast rows
  float* k_tile = do_tile + kTile * d;       // [32][d + 1] lane = key (dots), lane = column
  float* v_tile = k_tile + kTile * (d + 1);  // [32][d + 1] lane = key
  const int64_t b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const int64_t g = h / (p.heads / p.kv_heads);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t len = valid_length(p, b);
  if (q0 >= len) {
    return;  // padding queries receive no gradient
  }
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);
  load_tile(q_tile, d, q + qo_offset(p, b, 0, h), q0, len, p.heads * p.d_head, d);
  load_tile(do_tile, d, dout + qo_offset(p, b, 0, h), q0, len, p.heads * p.d_head, d);
  float row_lse[kRowsPerWarp];
  float row_delta[kRowsPerWarp];
  float dq_acc[kRowsPerWarp][kMaxColumnsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t query = q0 + warp * kRowsPerWarp + rr;
    const int64_t stat = (b * p.heads + h) * p.seq + query;
    row_lse[rr] = query < len ? p.lse[stat] : 0.0f;
    row_delta[rr] = query < len ? p.delta[stat] : 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxColumnsPerLane; ++t) {
      dq_acc[rr][t] = 0.0f;
    }
  }
  const int64_t last_query = q0 + kTile < len ? q0 + kTile : len;
  const int64_t key_end = p.causal ? last_query : len;
  for (int64_t k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();
    load_tile(k_tile, d + 1, k + kv_offset(p, b, 0, g), k0, len, p.kv_heads * p.d_head, d);
    load_tile(v_tile, d + 1, v + kv_offset(p, b, 0, g), k0, len, p.kv_heads * p.d_head, d);
    __syncthreads();
    const int64_t key = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t query = q0 + r;
      const bool visible = query < len && key < len && (!p.causal || key <= query);
      const ProbAndScoreGrad pd =
          backward_prob(q_tile, do_tile, r * d, k_tile, v_tile, lane * (d + 1), d, visible,
                        p.softmax_scale, row_lse[rr], row_delta[rr]);
#pragma unroll 4
      for (int jj = 0; jj < kTile; ++jj) {
        const float dsj = __shfl_sync(kFullWarpMask, pd.ds, jj);
#pragma unroll
        for (int t = 0; t < kMaxColumnsPerLane; ++t) {
          const int c = lane + t * kWarpSize;
          if (c < d) {
            dq_acc[rr][t] += dsj * k_tile[jj * (d + 1) + c];
          }
        }
      }
    }
  }
  T* dq = static_cast<T*>(p.dq);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t query = q0 + warp * kRowsPerWarp + rr;
    if (query >= len) {
      continue;
    }
#pragma unroll
    for (int t = 0; t < kMaxColumnsPerLane; ++t) {
      const int c = lane + t * kWarpSize;
      if (c < d) {
        T* target = dq + qo_offset(p, b, query, h) + c;
        store_float(target, load_float(target) + p.softmax_scale * dq_acc[rr][t]);
      }
    }
  }
}

void check_attention(const char* op, const AttentionLaunchParams& p) {
  MODAR_GPU_REQUIRE(op, p.d_head >= 1 && p.d_head <= kAttentionMaxHeadDim,
                    "d_head must be in [1, " + std::to_string(kAttentionMaxHeadDim) + "], got " +
                        std::to_string(p.d_head));
  MODAR_GPU_REQUIRE(op, p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0,
                    "heads must be a positive multiple of kv_heads, got heads = " +
                        std::to_string(p.heads) + ", kv_heads = " + std::to_string(p.kv_heads));
  MODAR_GPU_REQUIRE(op, p.softmax_scale > 0.0f,
                    "softmax_scale must be > 0, got " + std::to_string(p.softmax_scale));
  MODAR_GPU_REQUIRE(op, p.heads <= 65535 && p.kv_heads <= 65535 && p.batch <= 65535,
                    "heads, kv_heads and batch must be <= 65535 (grid y/z), got heads = " +
                        std::to_string(p.heads) + ", batch = " + std::to_string(p.batch));
  MODAR_GPU_REQUIRE(op, ceil_div(p.seq, kTile) <= INT32_MAX,
                    "seq must be <= " + std::to_string(kTile) + " * (2^31 - 1) (grid x), got " +
                        std::to_string(p.seq));
}

template <typename Kernel>
void launch_with_shared(Kernel kernel, dim3 grid, size_t shared_bytes, cudaStream_t stream,
                        const AttentionLaunchParams& p) {
  if (shared_bytes > 48 * 1024) {
    MODAR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
  }
  kernel<<<grid, kThreads, shared_bytes, stream>>>(p);
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_attention_forward(const AttentionLaunchParams& p, cudaStream_t stream) {
  check_attention("attention_forward", p);
  if (p.batch == 0 || p.seq == 0) {
    return;
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(p.seq, kTile)), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.batch));
  const size_t shared_bytes = sizeof(float) * kTile * (3 * p.d_head + 1);
  if (p.type == Elem::fp32) {
    launch_with_shared(attention_forward_kernel<float>, grid, shared_bytes, stream, p);
  } else {
    launch_with_shared(attention_forward_kernel<__nv_bfloat16>, grid, shared_bytes, stream, p);
  }
}

void launch_attention_backward(const AttentionLaunchParams& p, cudaStream_t stream) {
  check_attention("attention_backward", p);
  MODAR_GPU_REQUIRE("attention_backward", p.delta != nullptr && p.dout != nullptr,
                    "needs dout and the delta scratch");
  if (p.batch == 0 || p.seq == 0 || (p.dq == nullptr && p.dk == nullptr && p.dv == nullptr)) {
    return;
  }
  const int64_t items = p.batch * p.seq * p.heads;
  const auto delta_blocks = static_cast<unsigned>(ceil_div(items, kRowThreads / kWarpSize));
  if (p.type == Elem::fp32) {
    attention_delta_kernel<float><<<delta_blocks, kRowThreads, 0, stream>>>(p);
  } else {
    attention_delta_kernel<__nv_bfloat16><<<delta_blocks, kRowThreads, 0, stream>>>(p);
  }
  MODAR_CUDA_CHECK_LAUNCH();
  const unsigned tiles = static_cast<unsigned>(ceil_div(p.seq, kTile));
  const size_t shared_bytes = sizeof(float) * kTile * (4 * p.d_head + 2 + 2);
  if (p.dk != nullptr || p.dv != nullptr) {
    const dim3 grid(tiles, static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.batch));
    if (p.type == Elem::fp32) {
      launch_with_shared(attention_dkdv_kernel<float>, grid, shared_bytes, stream, p);
    } else {
      launch_with_shared(attention_dkdv_kernel<__nv_bfloat16>, grid, shared_bytes, stream, p);
    }
  }
  if (p.dq != nullptr) {
    const dim3 grid(tiles, static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
    if (p.type == Elem::fp32) {
      launch_with_shared(attention_dq_kernel<float>, grid, shared_bytes, stream, p);
    } else {
      launch_with_shared(attention_dq_kernel<__nv_bfloat16>, grid, shared_bytes, stream, p);
    }
  }
}

}  // namespace modar::gpu
