// runtime/cuda/caching_allocator.hpp: the CUDA backend's caching device
// allocator (Backend::allocate / deallocate and the temporaries of the cuDNN
// attention path).
//
// Every request is rounded up to a size class and served from that class's
// free list when it holds a block; only a miss calls cudaMalloc.  A freed block
// goes back on its class's list at once, with NO stream synchronisation and no
// cudaFree: the backend orders all of its work on one stream, so a kernel that
// is still queued and reads the old block runs before any later kernel that
// writes the block's next owner (stream order is the whole safety argument;
// the allocator serves exactly one stream and is not thread-safe).  So after a
// warm-up step has populated the lists, a step with the same shapes makes no
// cudaMalloc / cudaFree at all; the statistics show it.
//
// Size classes: up to 1 MiB, multiples of 512 bytes; above, four classes per
// power of two (2^k, 1.25 2^k, 1.5 2^k, 1.75 2^k), so at most 25% of a large
// block is slack.  When cudaMalloc fails, the allocator synchronises the
// stream, releases every cached block and tries once more before throwing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "modar/runtime/cuda_backend.hpp"

namespace modar::gpu {

// cudaMalloc / cudaFree through one counter, so that tests can assert that a
// step allocates nothing (the arena, the GEMM workspace and this allocator all
// allocate through these).
void* counted_cuda_malloc(size_t bytes);  // throws BackendError on failure
cudaError_t try_counted_cuda_malloc(void** pointer, size_t bytes);
void counted_cuda_free(void* pointer) noexcept;
int64_t cuda_malloc_calls();
int64_t cuda_free_calls();

class CachingAllocator {
 public:
  static constexpr size_t kSmallLimitBytes = size_t{1} << 20;
  static constexpr size_t kSmallGranuleBytes = 512;
  // The size class (bytes actually reserved) of a request; 0 bytes -> 512.
  static size_t size_class(size_t bytes);

  explicit CachingAllocator(cudaStream_t stream) : stream_(stream) {}
  ~CachingAllocator();  // synchronises the stream, then frees every block it made
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes);          // throws modar::BackendError when the device is full
  void deallocate(void* pointer) noexcept;  // null is ignored; unknown pointers are ignored
  // Synchronise the stream and cudaFree every cached (free) block.
  void release_cached() noexcept;
  runtime::CudaAllocatorStats stats() const { return stats_; }

 private:
  cudaStream_t stream_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> free blocks
  std::unordered_map<void*, size_t> live_;               // block -> size class
  runtime::CudaAllocatorStats stats_;
};

}  // namespace modar::gpu
