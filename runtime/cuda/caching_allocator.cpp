// runtime/cuda/caching_allocator.cpp: see caching_allocator.hpp.
#include "caching_allocator.hpp"

#include <algorithm>
#include <atomic>
#include <string>

#include "check.hpp"

namespace modar::gpu {

namespace {
std::atomic<int64_t> g_malloc_calls{0};
std::atomic<int64_t> g_free_calls{0};
}  // namespace

cudaError_t try_counted_cuda_malloc(void** pointer, size_t bytes) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return cudaMalloc(pointer, bytes);
}

void* counted_cuda_malloc(size_t bytes) {
  void* pointer = nullptr;
  MODAR_CUDA_CHECK(try_counted_cuda_malloc(&pointer, bytes));
  return pointer;
}

void counted_cuda_free(void* pointer) noexcept {
  if (pointer != nullptr) {
    g_free_calls.fetch_add(1, std::memory_order_relaxed);
    cudaFree(pointer);
  }
}

int64_t cuda_malloc_calls() {
  return g_malloc_calls.load(std::memory_order_relaxed);
}

int64_t cuda_free_calls() {
  return g_free_calls.load(std::memory_order_relaxed);
}

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes <= kSmallLimitBytes) {
    const size_t granules = (std::max<size_t>(bytes, 1) + kSmallGranuleBytes - 1) /
                            kSmallGranuleBytes;
    return granules * kSmallGranuleBytes;
  }
  // Largest power of two <= bytes, then quarter steps of it.
  size_t power = kSmallLimitBytes;
  while (power <= bytes / 2) {
    power *= 2;
  }
  const size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::~CachingAllocator() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
  }
  for (auto& [size, blocks] : free_) {
    for (void* block : blocks) {
      counted_cuda_free(block);
    }
  }
  // Blocks still handed out belong to tensors that outlive the backend (a
  // caller's bug); free them too rather than leak device memory.
  for (auto& [block, size] : live_) {
    counted_cuda_free(block);
  }
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = size_class(bytes);
  ++stats_.requests;
  auto list = free_.find(size);
  if (list != free_.end() && !list->second.empty()) {
    void* block = list->second.back();
    list->second.pop_back();
    live_.emplace(block, size);
    ++stats_.cache_hits;
    stats_.bytes_cached -= static_cast<int64_t>(size);
    stats_.bytes_in_use += static_cast<int64_t>(size);
    return block;
  }
  void* block = nullptr;
  cudaError_t status = try_counted_cuda_malloc(&block, size);
  ++stats_.device_mallocs;
  if (status != cudaSuccess && stats_.bytes_cached > 0) {
    cudaGetLastError();  // clear the error; retry after giving back the cache
    release_cached();
    status = try_counted_cuda_malloc(&block, size);
    ++stats_.device_mallocs;
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw BackendError("cuda allocate: cudaMalloc of " + std::to_string(bytes) + " bytes (size class " +
                       std::to_string(size) + ") failed: " + cudaGetErrorName(status) + " (" +
                       cudaGetErrorString(status) + "); " + std::to_string(stats_.bytes_in_use) +
                       " bytes in use by the backend");
  }
  live_.emplace(block, size);
  stats_.bytes_in_use += static_cast<int64_t>(size);
  stats_.peak_bytes_reserved =
      std::max(stats_.peak_bytes_reserved, stats_.bytes_in_use + stats_.bytes_cached);
  return block;
}

void CachingAllocator::deallocate(void* pointer) noexcept {
  if (pointer == nullptr) {
    return;
  }
  const auto found = live_.find(pointer);
  if (found == live_.end()) {
    return;
  }
  const size_t size = found->second;
  live_.erase(found);
  ++stats_.frees;
  stats_.bytes_in_use -= static_cast<int64_t>(size);
  stats_.bytes_cached += static_cast<int64_t>(size);
  try {
    free_[size].push_back(pointer);
  } catch (...) {  // out of host memory: give the block back to the device instead
    stats_.bytes_cached -= static_cast<int64_t>(size);
    cudaStreamSynchronize(stream_);
    counted_cuda_free(pointer);
    ++stats_.device_frees;
  }
}

void CachingAllocator::release_cached() noexcept {
  if (stats_.bytes_cached == 0) {
    return;
  }
  cudaStreamSynchronize(stream_);  // queued kernels may still read a cached block
  for (auto& [size, blocks] : free_) {
    for (void* block : blocks) {
      counted_cuda_free(block);
      ++stats_.device_frees;
    }
    blocks.clear();
  }
  stats_.bytes_cached = 0;
}

}  // namespace modar::gpu

// ---- grid-stride caps (launch.hpp) ---------------------------------------------
namespace modar::gpu {

namespace {
std::atomic<int64_t> g_grid_cap_override{0};
}  // namespace

int64_t grid_stride_block_cap(int threads) {
  const int64_t forced = g_grid_cap_override.load(std::memory_order_relaxed);
  if (forced > 0) {
    return forced;
  }
  static const int multiprocessors = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        count <= 0) {
      cudaGetLastError();
      return 132;  // an H100 / H200; only reached when the query itself fails
    }
    return count;
  }();
  const int per_multiprocessor = threads > 0 && threads <= 2048 ? 2048 / threads : 1;
  return int64_t{multiprocessors} * per_multiprocessor;
}

void set_grid_stride_block_cap(int64_t blocks) {
  g_grid_cap_override.store(blocks > 0 ? blocks : 0, std::memory_order_relaxed);
}

}  // namespace modar::gpu
