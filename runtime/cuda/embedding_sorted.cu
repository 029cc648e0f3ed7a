// runtime/cuda/embedding_sorted.cu: see embedding_sorted.cuh.
#include <cub/device/device_radix_sort.cuh>

#include "caching_allocator.hpp"
#include "check.hpp"
#include "common.cuh"
#include "embedding_sorted.cuh"

namespace modar::gpu {
namespace {

__global__ void iota_kernel(int32_t* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = i;
  }
}

// One block per sorted position p that starts a run of equal tokens; the
// block's threads split the d columns.  Runs are found from the sorted keys,
// so no block depends on another.
template <typename S, typename T>
__global__ void segment_sum_kernel(const S* dout, const int32_t* keys, const int32_t* rows_sorted,
                                   T* dtable, int rows, int d, int vocab) {
  for (int p = blockIdx.x; p < rows; p += gridDim.x) {
    const int token = keys[p];
    if ((p > 0 && keys[p - 1] == token) || token < 0 || token >= vocab) continue;
    int end = p + 1;
    while (end < rows && keys[end] == token) ++end;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      float sum = 0.0f;
      for (int q = p; q < end; ++q) {
        sum += load_float(dout + static_cast<int64_t>(rows_sorted[q]) * d + c);
      }
      T* target = dtable + static_cast<int64_t>(token) * d + c;
      store_float(target, load_float(target) + sum);
    }
  }
}

template <typename S, typename T>
void launch_segments(const void* dout, const int32_t* keys, const int32_t* rows_sorted,
                     void* dtable, int rows, int d, int vocab, cudaStream_t stream) {
  const int64_t cap = grid_stride_block_cap(kRowThreads);
  const unsigned blocks = static_cast<unsigned>(rows < cap ? rows : cap);
  segment_sum_kernel<S, T><<<blocks, kRowThreads, 0, stream>>>(
      static_cast<const S*>(dout), keys, rows_sorted, static_cast<T*>(dtable), rows, d, vocab);
}

struct Scoped {
  CachingAllocator& allocator;
  void* pointer;
  Scoped(CachingAllocator& a, size_t bytes) : allocator(a), pointer(a.allocate(bytes)) {}
  ~Scoped() { allocator.deallocate(pointer); }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;
};

}  // namespace

void launch_embedding_backward_sorted(const void* dout, Elem dout_type, const int32_t* tokens,
                                      void* dtable, Elem dtable_type, int64_t rows, int64_t d,
                                      int64_t vocab, CachingAllocator& allocator,
                                      cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  MODAR_GPU_REQUIRE("embedding_backward",
                    rows < (int64_t{1} << 31) && d < (int64_t{1} << 31) && vocab < (int64_t{1} << 31),
                    "rows, d and vocab must each be below 2^31");
  const int n = static_cast<int>(rows);
  Scoped keys(allocator, sizeof(int32_t) * rows);
  Scoped row_ids(allocator, sizeof(int32_t) * rows);
  Scoped rows_sorted(allocator, sizeof(int32_t) * rows);
  iota_kernel<<<grid_stride_blocks(rows, kRowThreads), kRowThreads, 0, stream>>>(
      static_cast<int32_t*>(row_ids.pointer), n);
  MODAR_CUDA_CHECK_LAUNCH();
  size_t temp_bytes = 0;
  MODAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, tokens, static_cast<int32_t*>(keys.pointer),
      static_cast<const int32_t*>(row_ids.pointer), static_cast<int32_t*>(rows_sorted.pointer), n,
      0, 32, stream));
  Scoped temp(allocator, temp_bytes);
  // Radix sort is stable: equal tokens keep ascending row order.
  MODAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.pointer, temp_bytes, tokens, static_cast<int32_t*>(keys.pointer),
      static_cast<const int32_t*>(row_ids.pointer), static_cast<int32_t*>(rows_sorted.pointer), n,
      0, 32, stream));
  const auto* k = static_cast<const int32_t*>(keys.pointer);
  const auto* r = static_cast<const int32_t*>(rows_sorted.pointer);
  const int dd = static_cast<int>(d), v = static_cast<int>(vocab);
  if (dout_type == Elem::fp32 && dtable_type == Elem::fp32) {
    launch_segments<float, float>(dout, k, r, dtable, n, dd, v, stream);
  } else if (dout_type == Elem::fp32) {
    launch_segments<float, __nv_bfloat16>(dout, k, r, dtable, n, dd, v, stream);
  } else if (dtable_type == Elem::fp32) {
    launch_segments<__nv_bfloat16, float>(dout, k, r, dtable, n, dd, v, stream);
  } else {
    launch_segments<__nv_bfloat16, __nv_bfloat16>(dout, k, r, dtable, n, dd, v, stream);
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
