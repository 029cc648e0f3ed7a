// runtime/cuda/rope.cu: rotary position embedding (GPT-NeoX half rotation) at
// the ORIGINAL positions of the (possibly gathered) rows.
//
// Math: for i < h = d_head / 2, angle = pos * theta_base^(-2i / d_head),
//   forward   x'[i] = x[i] cos - x[i+h] sin,   x'[i+h] = x[i+h] cos + x[i] sin
//   backward  dx[i] += dy[i] cos + dy[i+h] sin, dx[i+h] += dy[i+h] cos - dy[i] sin
//
// Trigonometry from tables, in fp32 arithmetic: positions reach 1e4 and more,
// where an fp32 angle would already be off by ~1e-3 rad, so the angle is never
// formed in fp32.  Instead pos = 256 hi + lo and two tables, computed ONCE per
// (theta_base, d_head) in fp64 and stored as fp32 (cos, sin) pairs,
//   low[lo][i]  = (cos, sin)(lo f_i),   high[hi][i] = (cos, sin)(256 hi f_i),
// are combined by the angle-sum formulas (4 fp32 multiplies, error a few fp32
// ulps).  Positions outside [0, 65536) take the fp64 path (pow / sincos).
//
// Layout: [rows, heads, d_head]; one thread per (row, head, group of 4 pairs)
// with 8-byte (bf16) / 16-byte (fp32) loads when h % 4 == 0 and the tensors
// are aligned, else one pair per thread.  32-bit index arithmetic (the
// launcher requires fewer than 2^31 thread items).
#include <map>
#include <mutex>
#include <utility>

#include "caching_allocator.hpp"
#include "check.hpp"
#include "common.cuh"
#include "rope.cuh"

namespace modar::gpu {

namespace {

constexpr int kTableSide = 256;  // positions < kTableSide^2 use the tables

__global__ void rope_table_kernel(float2* low, float2* high, double theta_base, int d_head) {
  const int half = d_head / 2;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= kTableSide * half) return;
  const int j = idx / half;
  const int i = idx - j * half;
  const double inv_freq = pow(theta_base, -2.0 * static_cast<double>(i) / d_head);
  double s = 0.0, c = 1.0;
  sincos(static_cast<double>(j) * inv_freq, &s, &c);
  low[idx] = make_float2(static_cast<float>(c), static_cast<float>(s));
  sincos(static_cast<double>(j) * kTableSide * inv_freq, &s, &c);
  high[idx] = make_float2(static_cast<float>(c), static_cast<float>(s));
}

__device__ __forceinline__ float2 rotation(const RopeLaunchParams& p, const float2* low,
                                           const float2* high, int pos, int i, int half) {
  if (pos >= 0 && pos < kTableSide * kTableSide) {
    const float2 l = low[(pos & (kTableSide - 1)) * half + i];
    const float2 h = high[(pos >> 8) * half + i];
    return make_float2(h.x * l.x - h.y * l.y, h.y * l.x + h.x * l.y);
  }
  const double inv_freq =
      pow(p.theta_base, -2.0 * static_cast<double>(i) / static_cast<double>(p.d_head));
  double s = 0.0, c = 1.0;
  sincos(static_cast<double>(pos) * inv_freq, &s, &c);
  return make_float2(static_cast<float>(c), static_cast<float>(s));
}

__device__ __forceinline__ void rotate(float a, float b, float2 cs, bool backward, float& out_a,
                                       float& out_b) {
  if (!backward) {
    out_a = a * cs.x - b * cs.y;
    out_b = b * cs.x + a * cs.y;
  } else {
    out_a = a * cs.x + b * cs.y;
    out_b = b * cs.x - a * cs.y;
  }
}

template <typename T, int kVec>
struct Pack;
template <>
struct Pack<float, 4> {
  using type = float4;
};
template <>
struct Pack<__nv_bfloat16, 4> {
  using type = uint2;  // 4 bf16 = 8 bytes
};

template <typename T>
__device__ __forceinline__ void unpack4(const typename Pack<T, 4>::type& v, float (&x)[4]);
template <>
__device__ __forceinline__ void unpack4<float>(const float4& v, float (&x)[4]) {
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
template <>
__device__ __forceinline__ void unpack4<__nv_bfloat16>(const uint2& v, float (&x)[4]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  const float2 a = __bfloat1622float2(h[0]);
  const float2 b = __bfloat1622float2(h[1]);
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}
template <typename T>
__device__ __forceinline__ typename Pack<T, 4>::type pack4(const float (&x)[4]);
template <>
__device__ __forceinline__ float4 pack4<float>(const float (&x)[4]) {
  return make_float4(x[0], x[1], x[2], x[3]);
}
template <>
__device__ __forceinline__ uint2 pack4<__nv_bfloat16>(const float (&x)[4]) {
  uint2 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
  h[0] = __floats2bfloat162_rn(x[0], x[1]);
  h[1] = __floats2bfloat162_rn(x[2], x[3]);
  return v;
}

// kVec = 4: four consecutive pairs per thread, vector loads; kVec = 1: one pair.
template <typename T, int kVec>
__global__ void rope_kernel(RopeLaunchParams p, const float2* low, const float2* high) {
  const int half = static_cast<int>(p.d_head / 2);
  const int groups = half / kVec;  // thread items per (row, head)
  const int heads = static_cast<int>(p.heads);
  const int items = static_cast<int>(p.rows * p.heads) * groups;  // < 2^31 (launcher)
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items;
       idx += gridDim.x * blockDim.x) {
    const int row_head = idx / groups;
    const int i0 = (idx - row_head * groups) * kVec;
    const int row = row_head / heads;
    const int pos = p.positions[row];
    const int64_t base = static_cast<int64_t>(row_head) * p.d_head;
    if constexpr (kVec == 4) {
      using V = typename Pack<T, 4>::type;
      float a[4], b[4], ra[4], rb[4];
      unpack4<T>(*reinterpret_cast<const V*>(in + base + i0), a);
      unpack4<T>(*reinterpret_cast<const V*>(in + base + i0 + half), b);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        rotate(a[j], b[j], rotation(p, low, high, pos, i0 + j, half), p.backward, ra[j], rb[j]);
      }
      if (p.backward) {
        float oa[4], ob[4];
        unpack4<T>(*reinterpret_cast<const V*>(out + base + i0), oa);
        unpack4<T>(*reinterpret_cast<const V*>(out + base + i0 + half), ob);
#pragma unroll
        for (int j = 0; j < 4; ++j) ra[j] += oa[j], rb[j] += ob[j];
      }
      *reinterpret_cast<V*>(out + base + i0) = pack4<T>(ra);
      *reinterpret_cast<V*>(out + base + i0 + half) = pack4<T>(rb);
    } else {
      const float a = load_float(in + base + i0);
      const float b = load_float(in + base + i0 + half);
      float ra = 0.0f, rb = 0.0f;
      rotate(a, b, rotation(p, low, high, pos, i0, half), p.backward, ra, rb);
      if (p.backward) {
        ra += load_float(out + base + i0);
        rb += load_float(out + base + i0 + half);
      }
      store_float(out + base + i0, ra);
      store_float(out + base + i0 + half, rb);
    }
  }
}

// The tables of one (theta_base, d_head), built on first use and kept for the
// life of the process (2 x 256 x d_head / 2 float pairs: 128 KB at d_head 128).
std::pair<const float2*, const float2*> rope_tables(double theta_base, int64_t d_head,
                                                    cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<double, int64_t>, float2*> tables;
  std::lock_guard<std::mutex> lock(mutex);
  const int64_t half = d_head / 2;
  auto found = tables.find({theta_base, d_head});
  if (found == tables.end()) {
    const int64_t entries = kTableSide * half;
    auto* table = static_cast<float2*>(counted_cuda_malloc(sizeof(float2) * 2 * entries));
    rope_table_kernel<<<static_cast<unsigned>(ceil_div(entries, 256)), 256, 0, stream>>>(
        table, table + entries, theta_base, static_cast<int>(d_head));
    MODAR_CUDA_CHECK_LAUNCH();
    // Other backends' streams may read the table next: finish it now (once).
    MODAR_CUDA_CHECK(cudaStreamSynchronize(stream));
    found = tables.emplace(std::make_pair(theta_base, d_head), table).first;
  }
  return {found->second, found->second + kTableSide * half};
}

bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

}  // namespace

void launch_rope(const RopeLaunchParams& p, cudaStream_t stream) {
  MODAR_GPU_REQUIRE(
      "rope", p.d_head > 0 && p.d_head % 2 == 0 && p.heads > 0,
      "need an even d_head > 0 and heads > 0, got d_head = " + std::to_string(p.d_head));
  const int64_t half = p.d_head / 2;
  const int64_t pairs = p.rows * p.heads * half;
  if (pairs == 0) {
    return;
  }
  MODAR_GPU_REQUIRE("rope", pairs < (int64_t{1} << 31),
                    "rows x heads x d_head / 2 must be below 2^31, got " + std::to_string(pairs));
  const auto [low, high] = rope_tables(p.theta_base, p.d_head, stream);
  const int vector_bytes = p.type == Elem::fp32 ? 16 : 8;
  const bool vector = half % 4 == 0 && aligned(p.in, vector_bytes) &&
                      aligned(p.out, vector_bytes) && (half * elem_bytes(p.type)) % vector_bytes == 0;
  const int64_t items = vector ? pairs / 4 : pairs;
  const unsigned blocks = grid_stride_blocks(items, kRowThreads);
  if (p.type == Elem::fp32) {
    if (vector) {
      rope_kernel<float, 4><<<blocks, kRowThreads, 0, stream>>>(p, low, high);
    } else {
      rope_kernel<float, 1><<<blocks, kRowThreads, 0, stream>>>(p, low, high);
    }
  } else {
    if (vector) {
      rope_kernel<__nv_bfloat16, 4><<<blocks, kRowThreads, 0, stream>>>(p, low, high);
    } else {
      rope_kernel<__nv_bfloat16, 1><<<blocks, kRowThreads, 0, stream>>>(p, low, high);
    }
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
