// runtime/cuda/norm.cu: RMSNorm forward / backward, and the column reduce of
// fp32 partial sums that every weight gradient over rows uses.
//
// Math: rstd = (mean_c x_c^2 + eps)^(-1/2);  out = x * rstd * w  (w = 1 when
// unweighted).  Backward with g = dout * w and x^ = x * rstd:
//   dx = rstd * (g - x^ * mean_c(g x^)),   dw_c = sum_rows dout_c x^_c.
// Layout: row-major [rows, d]; one block (kRowThreads threads) per row, the
// threads stride over d; statistics in fp32.  dw goes through per-split
// partials (rows cut into kReduceSplits contiguous ranges, one thread per
// column, coalesced) and launch_reduce_partials: deterministic, no atomics.
#include "check.hpp"
#include "common.cuh"
#include "norm.cuh"

namespace modar::gpu {

namespace {

template <typename T>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_forward_kernel(RmsNormParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.d;
  const T* w = static_cast<const T*>(p.weight);
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    const float v = load_float(x + c);
    sum_sq += v * v;
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float rstd = rsqrtf(sum_sq / static_cast<float>(p.d) + p.eps);
  if (threadIdx.x == 0) {
    p.rstd[row] = rstd;
  }
  if (p.out != nullptr) {
    T* out = static_cast<T*>(p.out) + row * p.d;
    for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
      const float scale = w != nullptr ? load_float(w + c) : 1.0f;
      store_float(out + c, load_float(x + c) * rstd * scale);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_dx_kernel(RmsNormBackwardParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.d;
  const T* dout = static_cast<const T*>(p.dout) + row * p.d;
  const T* w = static_cast<const T*>(p.weight);
  T* dx = static_cast<T*>(p.dx) + row * p.d;
  const float rstd = p.rstd[row];
  float dot = 0.0f;  // sum_c g_c x^_c
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    const float g = load_float(dout + c) * (w != nullptr ? load_float(w + c) : 1.0f);
    dot += g * load_float(x + c) * rstd;
  }
  dot = block_sum(dot, scratch);
  const float mean_dot = dot / static_cast<float>(p.d);
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    const float g = load_float(dout + c) * (w != nullptr ? load_float(w + c) : 1.0f);
    const float x_hat = load_float(x + c) * rstd;
    store_float(dx + c, load_float(dx + c) + rstd * (g - x_hat * mean_dot));
  }
}

template <typename T>
__global__ void rmsnorm_dweight_partial_kernel(RmsNormBackwardParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.d) {
    return;
  }
  const int64_t rows_per_split = ceil_div(p.rows, gridDim.y);
  const int64_t begin = blockIdx.y * rows_per_split;
  const int64_t end = min(p.rows, begin + rows_per_split);
  const T* x = static_cast<const T*>(p.x);
  const T* dout = static_cast<const T*>(p.dout);
  float sum = 0.0f;
  for (int64_t row = begin; row < end; ++row) {
    sum += load_float(dout + row * p.d + c) * load_float(x + row * p.d + c) * p.rstd[row];
  }
  p.partial[blockIdx.y * p.d + c] = sum;
}

template <typename T>
__global__ void reduce_partials_kernel(const float* partial, int splits, int64_t columns, T* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= columns) {
    return;
  }
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) {
    sum += partial[s * columns + c];
  }
  store_float(out + c, load_float(out + c) + sum);
}

}  // namespace

void launch_reduce_partials(const float* partial, int splits, int64_t columns, void* out,
                            Elem out_type, cudaStream_t stream) {
  if (columns == 0) {
    return;
  }
  const auto blocks = static_cast<unsigned>(ceil_div(columns, kRowThreads));
  if (out_type == Elem::fp32) {
    reduce_partials_kernel<<<blocks, kRowThreads, 0, stream>>>(partial, splits, columns,
                                                               static_cast<float*>(out));
  } else {
    reduce_partials_kernel<<<blocks, kRowThreads, 0, stream>>>(partial, splits, columns,
                                                               static_cast<__nv_bfloat16*>(out));
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_rmsnorm_forward(const RmsNormParams& params, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("rmsnorm_forward", params.d > 0 && params.rstd != nullptr,
                    "need d > 0 and an rstd output, got d = " + std::to_string(params.d));
  if (params.rows == 0) {
    return;
  }
  const unsigned blocks = one_block_per_row("rmsnorm_forward", "rows", params.rows);
  launch_typed(params.type, [&](auto tag) {
    rmsnorm_forward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(params);
  });
}

void launch_rmsnorm_backward(const RmsNormBackwardParams& params, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("rmsnorm_backward", params.d > 0,
                    "need d > 0, got d = " + std::to_string(params.d));
  MODAR_GPU_REQUIRE("rmsnorm_backward",
                    params.dweight == nullptr || (params.weight != nullptr && params.partial),
                    "a weight gradient needs the weight and partial-sum scratch");
  if (params.rows == 0) {
    return;
  }
  if (params.dx != nullptr) {
    const unsigned blocks = one_block_per_row("rmsnorm_backward", "rows", params.rows);
    launch_typed(params.type, [&](auto tag) {
      rmsnorm_dx_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(params);
    });
  }
  if (params.dweight != nullptr) {
    const dim3 grid(static_cast<unsigned>(ceil_div(params.d, kRowThreads)), kReduceSplits);
    launch_typed(params.type, [&](auto tag) {
      rmsnorm_dweight_partial_kernel<decltype(tag)><<<grid, kRowThreads, 0, stream>>>(params);
    });
    launch_reduce_partials(params.partial, kReduceSplits, params.d, params.dweight,
                           params.dweight_type, stream);
  }
}

}  // namespace modar::gpu
