// runtime/cuda/rope.cu: rotary position embedding (GPT-NeoX half rotation) at
// the ORIGINAL positions of the (possibly gathered) rows.
//
// Math: for i < h = d_head / 2, angle = pos * theta_base^(-2i / d_head),
//   forward   x'[i] = x[i] cos - x[i+h] sin,   x'[i+h] = x[i+h] cos + x[i] sin
//   backward  dx[i] += dy[i] cos + dy[i+h] sin, dx[i+h] += dy[i+h] cos - dy[i] sin
// The angle and its sine / cosine are computed in fp64: positions reach 1e4
// and more, where an fp32 angle would already be off by ~1e-3 rad.
// Layout: [rows, heads, d_head]; one thread per (row, head, i) pair.
#include "check.hpp"
#include "common.cuh"
#include "rope.cuh"

namespace modar::gpu {

namespace {

template <typename T>
__global__ void rope_kernel(RopeLaunchParams p) {
  const int64_t half = p.d_head / 2;
  const int64_t pairs = p.rows * p.heads * half;
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t row_head = idx / half;
    const int64_t row = row_head / p.heads;
    const double inv_freq =
        pow(p.theta_base, -2.0 * static_cast<double>(i) / static_cast<double>(p.d_head));
    double sin_value = 0.0;
    double cos_value = 1.0;
    sincos(static_cast<double>(p.positions[row]) * inv_freq, &sin_value, &cos_value);
    const float s = static_cast<float>(sin_value);
    const float c = static_cast<float>(cos_value);
    const int64_t base = row_head * p.d_head;
    const float a = load_float(in + base + i);
    const float b = load_float(in + base + i + half);
    if (!p.backward) {
      store_float(out + base + i, a * c - b * s);
      store_float(out + base + i + half, b * c + a * s);
    } else {
      store_float(out + base + i, load_float(out + base + i) + a * c + b * s);
      store_float(out + base + i + half, load_float(out + base + i + half) + b * c - a * s);
    }
  }
}

}  // namespace

void launch_rope(const RopeLaunchParams& p, cudaStream_t stream) {
  MODAR_GPU_REQUIRE(
      "rope", p.d_head > 0 && p.d_head % 2 == 0 && p.heads > 0,
      "need an even d_head > 0 and heads > 0, got d_head = " + std::to_string(p.d_head));
  const int64_t pairs = p.rows * p.heads * (p.d_head / 2);
  if (pairs == 0) {
    return;
  }
  const unsigned blocks = grid_stride_blocks(pairs, kRowThreads);
  if (p.type == Elem::fp32) {
    rope_kernel<float><<<blocks, kRowThreads, 0, stream>>>(p);
  } else {
    rope_kernel<__nv_bfloat16><<<blocks, kRowThreads, 0, stream>>>(p);
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
