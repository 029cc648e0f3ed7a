// runtime/cuda/attention_epilogue.cu: see attention_epilogue.cuh.
//
// One block per (sequence, position) row; the row's `width` bf16 elements go
// through 16-byte vectors (8 bf16) when width is a multiple of 8 and the
// pointers are 16-byte aligned, which cuDNN requires of its tensors anyway;
// a scalar loop covers any other width.  Grids over rows are capped at one
// wave of resident blocks (grid_stride_block_cap) and stride over the rest.
#include <cuda_bf16.h>

#include "attention_epilogue.cuh"
#include "check.hpp"
#include "common.cuh"

namespace modar::gpu {
namespace {

constexpr int kThreads = 128;

__global__ void clamp_lengths_kernel(const int32_t* lengths, int32_t* out, int batch, int seq) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < batch) {
    const int value = lengths == nullptr ? seq : lengths[i];
    out[i] = value < 0 ? 0 : (value > seq ? seq : value);
  }
}

__device__ __forceinline__ bool row_is_valid(const int32_t* lengths, int64_t row, int seq) {
  if (lengths == nullptr) return true;
  const int b = static_cast<int>(row / seq);  // one divide per row, not per element
  const int t = static_cast<int>(row - static_cast<int64_t>(b) * seq);
  return t < lengths[b];
}

__global__ void zero_padded_rows_kernel(__nv_bfloat16* out, float* lse, const int32_t* lengths,
                                        int64_t rows, int seq, int heads, int width,
                                        bool vector) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (row_is_valid(lengths, row, seq)) continue;
    __nv_bfloat16* base = out + row * width;
    if (vector) {
      uint4* v = reinterpret_cast<uint4*>(base);
      for (int i = threadIdx.x; i < width / 8; i += blockDim.x) v[i] = make_uint4(0, 0, 0, 0);
    } else {
      for (int i = threadIdx.x; i < width; i += blockDim.x) base[i] = __float2bfloat16(0.0f);
    }
    const int b = static_cast<int>(row / seq);
    const int t = static_cast<int>(row - static_cast<int64_t>(b) * seq);
    for (int h = threadIdx.x; h < heads; h += blockDim.x) {
      lse[(static_cast<int64_t>(b) * heads + h) * seq + t] = 0.0f;
    }
  }
}

__device__ __forceinline__ void add8(uint4& acc, const uint4 update) {
  __nv_bfloat162* a = reinterpret_cast<__nv_bfloat162*>(&acc);
  const __nv_bfloat162* u = reinterpret_cast<const __nv_bfloat162*>(&update);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = __bfloat1622float2(a[j]);
    const float2 y = __bfloat1622float2(u[j]);
    a[j] = __floats2bfloat162_rn(x.x + y.x, x.y + y.y);
  }
}

__global__ void accumulate_rows_kernel(__nv_bfloat16* grad, const __nv_bfloat16* update,
                                       const int32_t* lengths, int64_t rows, int seq, int width,
                                       bool vector) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (!row_is_valid(lengths, row, seq)) continue;
    __nv_bfloat16* g = grad + row * width;
    const __nv_bfloat16* u = update + row * width;
    if (vector) {
      uint4* gv = reinterpret_cast<uint4*>(g);
      const uint4* uv = reinterpret_cast<const uint4*>(u);
      for (int i = threadIdx.x; i < width / 8; i += blockDim.x) {
        uint4 acc = gv[i];
        add8(acc, uv[i]);
        gv[i] = acc;
      }
    } else {
      for (int i = threadIdx.x; i < width; i += blockDim.x) {
        g[i] = __float2bfloat16(__bfloat162float(g[i]) + __bfloat162float(u[i]));
      }
    }
  }
}

unsigned row_blocks(int64_t rows) {
  const int64_t cap = grid_stride_block_cap(kThreads);
  return static_cast<unsigned>(rows < 1 ? 1 : (rows < cap ? rows : cap));
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

void launch_clamp_lengths(const int32_t* lengths, int32_t* out, int64_t batch, int64_t seq,
                          cudaStream_t stream) {
  if (batch == 0) return;
  clamp_lengths_kernel<<<static_cast<unsigned>(ceil_div(batch, 128)), 128, 0, stream>>>(
      lengths, out, static_cast<int>(batch), static_cast<int>(seq));
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_zero_padded_rows(void* out, float* lse, const int32_t* lengths, int64_t batch,
                             int64_t seq, int64_t heads, int64_t width, cudaStream_t stream) {
  const int64_t rows = batch * seq;
  if (lengths == nullptr || rows == 0) return;
  const bool vector = width % 8 == 0 && aligned16(out);
  zero_padded_rows_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(
      static_cast<__nv_bfloat16*>(out), lse, lengths, rows, static_cast<int>(seq),
      static_cast<int>(heads), static_cast<int>(width), vector);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_accumulate_rows(void* grad, const void* update, const int32_t* lengths,
                            int64_t batch, int64_t seq, int64_t width, cudaStream_t stream) {
  const int64_t rows = batch * seq;
  if (grad == nullptr || rows == 0 || width == 0) return;
  const bool vector = width % 8 == 0 && aligned16(grad) && aligned16(update);
  accumulate_rows_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(
      static_cast<__nv_bfloat16*>(grad), static_cast<const __nv_bfloat16*>(update), lengths,
      rows, static_cast<int>(seq), static_cast<int>(width), vector);
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
