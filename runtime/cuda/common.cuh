// runtime/cuda/common.cuh: small device helpers shared by the kernel files.
//
// Storage types: every kernel that reads or writes activations is a template
// over the storage type T in {float, __nv_bfloat16}; arithmetic is always in
// fp32 (load_float / store_float convert).  Indices are int32 (token rows,
// positions), sizes that can pass 2^31 elements are int64.
//
// Reductions: warp_sum / warp_max use __shfl_xor_sync over the full warp, so
// every lane of the warp must call them.  block_sum / block_max use a
// 32-float shared scratch and two __syncthreads(); every thread of the block
// must call them in uniform control flow, and blockDim.x must be a multiple of
// 32.  They return the result to every thread.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "check.hpp"
#include "launch.hpp"

namespace modar::gpu {

inline constexpr unsigned kFullWarpMask = 0xffffffffu;
inline constexpr int kWarpSize = 32;

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Blocks for a grid-stride loop over `count` elements with `threads` per
// block: enough to cover every element once, at least 1, at most
// grid_stride_block_cap() (launch.hpp: one full wave of resident blocks,
// multiprocessors x 2048 / threads, so a large op is a persistent grid that
// strides; tests lower the cap to make small ops stride too).
inline unsigned grid_stride_blocks(int64_t count, int threads) {
  const int64_t blocks = ceil_div(count, threads);
  const int64_t cap = grid_stride_block_cap(threads);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

// Launches a kernel templated on the storage type `type` names: calls
// launch(T{}) with T = float or __nv_bfloat16 (the lambda launches
// kernel<decltype(tag)>), then checks the launch.
template <class Launch>
void launch_typed(Elem type, Launch&& launch) {
  type == Elem::fp32 ? launch(float{}) : launch(__nv_bfloat16{});
  MODAR_CUDA_CHECK_LAUNCH();
}

__device__ __forceinline__ float load_float(const float* p) {
  return *p;
}
__device__ __forceinline__ float load_float(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void store_float(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_float(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16(v);
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly reduction over the warp: every lane ends with the same value.
template <typename Combine>
__device__ __forceinline__ float warp_reduce(float v, Combine combine) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = combine(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  return warp_reduce(v, SumOp{});
}

__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, MaxOp{});
}

// The first half of a block reduction: each warp's reduction of v in
// scratch[warp] (scratch: __shared__ float[32]), visible to every thread.
// Returns the number of warps.
template <typename Combine>
__device__ __forceinline__ int warp_results_in_scratch(float v, float* scratch, Combine combine) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_reduce(v, combine);
  if (lane == 0) {
    scratch[warp] = v;
  }
  __syncthreads();
  return warps;
}

// scratch: __shared__ float[32].  Ends with a barrier, so scratch may be
// reused by the next call.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warps = warp_results_in_scratch(v, scratch, SumOp{});
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) {
    total += scratch[w];  // same order in every thread: identical results
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int warps = warp_results_in_scratch(v, scratch, MaxOp{});
  float result = scratch[0];
  for (int w = 1; w < warps; ++w) {
    result = fmaxf(result, scratch[w]);
  }
  __syncthreads();
  return result;
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

}  // namespace modar::gpu

namespace modar::gpu {

// Sum `count` (<= kMax) per-thread values over the block at once.  values[i]
// for i >= count are ignored.  scratch: __shared__ float[32 * kMax].  On
// return values[i] holds the block total in every thread.  Same barrier rules
// as block_sum.
template <int kMax>
__device__ __forceinline__ void block_sum_many(float (&values)[kMax], int count, float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int i = 0; i < kMax; ++i) {
    if (i < count) {
      const float v = warp_sum(values[i]);
      if (lane == 0) {
        scratch[warp * kMax + i] = v;
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kMax; ++i) {
    if (i < count) {
      float total = 0.0f;
      for (int w = 0; w < warps; ++w) {
        total += scratch[w * kMax + i];
      }
      values[i] = total;
    }
  }
  __syncthreads();
}

}  // namespace modar::gpu
