// runtime/cuda/topk.cu: MoD router logits and the per-sequence exact top-k.
//
// Math (docs/model.md MoD): r_i = x_i . w_r; per sequence select EXACTLY k positions with
// the largest r, ties toward the lower position, output ascending.
//
// Top-k, one block per sequence:
//  1. key(i) = order-preserving uint32 of r_i (sign bit flipped for positives,
//     all bits flipped for negatives; -0 is first canonicalised to +0 and NaN
//     to -inf, so the order equals the CPU backend's comparison).  Rows of up to kCachedKeysMax
//     keys are cached in shared memory, longer rows are re-read from global (L2).
//  2. Radix select, 4 passes of 8 bits from the top: a 256-bin shared-memory
//     histogram of the keys that match the prefix found so far, then warp 0
//     finds the digit whose suffix count first reaches the remaining rank.
//     Result: the threshold key thr (= the k-th largest) and take_equal = how
//     many keys equal to thr belong to the top k (count_gt = k - take_equal).
//  3. Stable blocked compaction in index order with cub::BlockScan: each
//     thread owns ITEMS consecutive positions of a tile; one exclusive scan of
//     the packed pair (count_gt << 32 | count_eq) gives, for every position,
//     how many keys > thr and == thr precede it.  A key > thr goes to slot
//     gt_before + min(eq_before, take_equal); a key == thr goes to slot
//     gt_before + eq_before if eq_before < take_equal.  So the output is
//     exactly k, ascending, and ties are taken from the lowest positions.
// Ragged k (predictor mode): counts[b] per sequence, slots [k, k_max) = -1.
#include <cub/block/block_scan.cuh>

#include "check.hpp"
#include "common.cuh"
#include "topk.cuh"

namespace modar::gpu {

namespace {

constexpr int kTopkThreads = 512;
constexpr int kTopkItems = 4;
constexpr int kTopkTile = kTopkThreads * kTopkItems;
constexpr int64_t kCachedKeysMax = 8192;  // 32 KB of shared memory

__device__ __forceinline__ uint32_t order_key(float value) {
  if (value == 0.0f) {
    value = 0.0f;  // -0 -> +0: equal floats must give equal keys
  }
  if (isnan(value)) {
    value = -__builtin_huge_valf();  // as the CPU: NaN ranks with -inf (below every number)
  }
  const uint32_t bits = __float_as_uint(value);
  return (bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u);
}

template <typename T>
__global__ void router_forward_kernel(const T* x, const T* w, float* logits, int64_t rows,
                                      int64_t d) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) {
    return;  // whole warp leaves together
  }
  const T* x_row = x + row * d;
  float sum = 0.0f;
  for (int64_t c = lane; c < d; c += kWarpSize) {
    sum += load_float(x_row + c) * load_float(w + c);
  }
  sum = warp_sum(sum);
  if (lane == 0) {
    logits[row] = sum;
  }
}

template <typename T>
__global__ void router_dx_kernel(const float* dlogits, const T* w, T* dx, int64_t rows, int64_t d) {
  const int64_t total = rows * d;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / d;
    const int64_t c = i - row * d;
    store_float(dx + i, load_float(dx + i) + dlogits[row] * load_float(w + c));
  }
}

// partial[split][c] = sum over the split's rows of dlogits[i] x[i, c]
template <typename T>
__global__ void router_dw_partial_kernel(const float* dlogits, const T* x, float* partial,
                                         int64_t rows, int64_t d) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int split = blockIdx.y;
  if (c >= d) {
    return;
  }
  const int64_t rows_per_split = ceil_div(rows, gridDim.y);
  const int64_t begin = split * rows_per_split;
  const int64_t end = min(rows, begin + rows_per_split);
  float sum = 0.0f;
  for (int64_t row = begin; row < end; ++row) {
    sum += dlogits[row] * load_float(x + row * d + c);
  }
  partial[split * d + c] = sum;
}

__global__ void __launch_bounds__(kTopkThreads) topk_kernel(TopkParams p, int cache_keys) {
  using BlockScan = cub::BlockScan<unsigned long long, kTopkThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ uint32_t histogram[256];
  __shared__ uint32_t selected_digit;
  __shared__ uint32_t selected_remaining;
  extern __shared__ uint32_t cached_keys[];  // seq_len entries when cache_keys

  const int64_t sequence = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t s = p.seq_len;
  const float* row = p.logits + sequence * s;
  int32_t* out = p.indices + sequence * p.k_max;

  int64_t k = p.counts != nullptr ? static_cast<int64_t>(p.counts[sequence]) : p.k_max;
  k = k < 0 ? 0 : k;
  k = k > p.k_max ? p.k_max : k;
  k = k > s ? s : k;
  for (int64_t slot = k + tid; slot < p.k_max; slot += kTopkThreads) {
    out[slot] = -1;
  }
  if (k == 0) {
    return;  // k is uniform over the block: no thread is left at a barrier
  }

  if (cache_keys != 0) {
    for (int64_t i = tid; i < s; i += kTopkThreads) {
      cached_keys[i] = order_key(row[i]);
    }
  }
  // (The first barrier of the radix loop orders these stores before any read.)
  auto key_at = [&](int64_t i) -> uint32_t {
    return cache_keys != 0 ? cached_keys[i] : order_key(row[i]);
  };

  uint32_t prefix = 0;
  uint32_t prefix_mask = 0;
  uint32_t remaining = static_cast<uint32_t>(k);  // rank still to find among matching keys
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int bin = tid; bin < 256; bin += kTopkThreads) {
      histogram[bin] = 0;
    }
    __syncthreads();
    for (int64_t i = tid; i < s; i += kTopkThreads) {
      const uint32_t key = key_at(i);
      if ((key & prefix_mask) == prefix) {
        atomicAdd(&histogram[(key >> shift) & 0xffu], 1u);
      }
    }
    __syncthreads();
    if (tid < kWarpSize) {
      // Lane l owns the digits 255 - 8l .. 248 - 8l (descending order).
      const int lane = tid;
      uint32_t counts[8];
      uint32_t local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        counts[j] = histogram[255 - (lane * 8 + j)];
        local += counts[j];
      }
      uint32_t inclusive = local;
#pragma unroll
      for (int offset = 1; offset < kWarpSize; offset *= 2) {
        const uint32_t other = __shfl_up_sync(kFullWarpMask, inclusive, offset);
        if (lane >= offset) {
          inclusive += other;
        }
      }
      uint32_t before = inclusive - local;  // keys with a larger digit
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (before < remaining && before + counts[j] >= remaining) {
          selected_digit = static_cast<uint32_t>(255 - (lane * 8 + j));
          selected_remaining = remaining - before;
        }
        before += counts[j];
      }
    }
    __syncthreads();
    prefix |= selected_digit << shift;
    prefix_mask |= 0xffu << shift;
    remaining = selected_remaining;
    // The next writes to histogram / selected_* happen after at least one more
    // barrier, which every thread reaches only after reading them here.
  }
  const uint32_t threshold = prefix;
  const uint64_t take_equal = remaining;

  unsigned long long running = 0;  // (count_gt << 32) | count_eq over earlier tiles
  for (int64_t tile = 0; tile < s; tile += kTopkTile) {
    const int64_t first = tile + static_cast<int64_t>(tid) * kTopkItems;
    uint32_t flags[kTopkItems];  // 2 = greater, 1 = equal, 0 = neither
    unsigned long long local = 0;
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      flags[j] = 0;
      if (first + j < s) {
        const uint32_t key = key_at(first + j);
        flags[j] = key > threshold ? 2u : (key == threshold ? 1u : 0u);
      }
      local += flags[j] == 2u ? (1ull << 32) : (flags[j] == 1u ? 1ull : 0ull);
    }
    unsigned long long exclusive = 0;
    unsigned long long aggregate = 0;
    BlockScan(scan_storage).ExclusiveSum(local, exclusive, aggregate);
    __syncthreads();  // scan_storage is reused by the next tile
    unsigned long long before = running + exclusive;
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      const uint64_t gt_before = before >> 32;
      const uint64_t eq_before = before & 0xffffffffull;
      if (flags[j] == 2u) {
        const uint64_t eq_taken = eq_before < take_equal ? eq_before : take_equal;
        out[gt_before + eq_taken] = static_cast<int32_t>(first + j);
        before += 1ull << 32;
      } else if (flags[j] == 1u) {
        if (eq_before < take_equal) {
          out[gt_before + eq_before] = static_cast<int32_t>(first + j);
        }
        before += 1ull;
      }
    }
    running += aggregate;
  }
}

template <typename T>
__global__ void topk_mask_kernel(const int32_t* indices, T* mask, int64_t batch, int64_t seq_len,
                                 int64_t k) {
  // One block per sequence: zero the row, barrier, then mark the selection.
  const int64_t sequence = blockIdx.x;
  T* mask_row = mask + sequence * seq_len;
  for (int64_t i = threadIdx.x; i < seq_len; i += blockDim.x) {
    store_float(mask_row + i, 0.0f);
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    const int32_t position = indices[sequence * k + j];
    if (position >= 0 && position < seq_len) {
      store_float(mask_row + position, 1.0f);
    }
  }
}

}  // namespace

void launch_router_forward(const void* x, const void* w, float* logits, int64_t rows, int64_t d,
                           Elem type, cudaStream_t stream) {
  if (rows == 0) {
    return;
  }
  constexpr int warps_per_block = kRowThreads / kWarpSize;
  const auto blocks = static_cast<unsigned>(ceil_div(rows, warps_per_block));
  if (type == Elem::fp32) {
    router_forward_kernel<<<blocks, kRowThreads, 0, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(w), logits, rows, d);
  } else {
    router_forward_kernel<<<blocks, kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                              static_cast<const __nv_bfloat16*>(w),
                                                              logits, rows, d);
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_router_backward(const float* dlogits, const void* x, const void* w, void* dx, void* dw,
                            Elem dw_type, float* partial, int64_t rows, int64_t d, Elem type,
                            cudaStream_t stream) {
  if (rows == 0) {
    return;
  }
  if (dx != nullptr) {
    const unsigned blocks = grid_stride_blocks(rows * d, kRowThreads);
    if (type == Elem::fp32) {
      router_dx_kernel<<<blocks, kRowThreads, 0, stream>>>(dlogits, static_cast<const float*>(w),
                                                           static_cast<float*>(dx), rows, d);
    } else {
      router_dx_kernel<<<blocks, kRowThreads, 0, stream>>>(
          dlogits, static_cast<const __nv_bfloat16*>(w), static_cast<__nv_bfloat16*>(dx), rows, d);
    }
    MODAR_CUDA_CHECK_LAUNCH();
  }
  if (dw != nullptr) {
    const dim3 grid(static_cast<unsigned>(ceil_div(d, kRowThreads)), kReduceSplits);
    if (type == Elem::fp32) {
      router_dw_partial_kernel<<<grid, kRowThreads, 0, stream>>>(
          dlogits, static_cast<const float*>(x), partial, rows, d);
    } else {
      router_dw_partial_kernel<<<grid, kRowThreads, 0, stream>>>(
          dlogits, static_cast<const __nv_bfloat16*>(x), partial, rows, d);
    }
    MODAR_CUDA_CHECK_LAUNCH();
    launch_reduce_partials(partial, kReduceSplits, d, dw, dw_type, stream);
  }
}

void launch_topk(const TopkParams& params, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("topk", params.seq_len > 0 && params.seq_len <= INT32_MAX,
                    "seq_len must be in [1, 2^31), got " + std::to_string(params.seq_len));
  MODAR_GPU_REQUIRE("topk", params.k_max >= 0 && params.k_max <= params.seq_len,
                    "k_max must be in [0, seq_len], got " + std::to_string(params.k_max));
  if (params.batch == 0) {
    return;
  }
  const bool cache = params.seq_len <= kCachedKeysMax;
  const size_t shared_bytes = cache ? static_cast<size_t>(params.seq_len) * sizeof(uint32_t) : 0;
  topk_kernel<<<one_block_per_row("topk", "batch", params.batch), kTopkThreads, shared_bytes,
                stream>>>(params, cache ? 1 : 0);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_topk_mask(const int32_t* indices, void* mask, int64_t batch, int64_t seq_len, int64_t k,
                      Elem type, cudaStream_t stream) {
  if (batch == 0) {
    return;
  }
  const unsigned blocks = one_block_per_row("topk_mask", "batch", batch);
  if (type == Elem::fp32) {
    topk_mask_kernel<<<blocks, kRowThreads, 0, stream>>>(indices, static_cast<float*>(mask), batch,
                                                         seq_len, k);
  } else {
    topk_mask_kernel<<<blocks, kRowThreads, 0, stream>>>(indices, static_cast<__nv_bfloat16*>(mask),
                                                         batch, seq_len, k);
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
