// runtime/cuda/arena.hpp: one device allocation per step, bump allocation.
//
// The backend sizes the arena before a step (reserve(), the only place that
// may call cudaMalloc / cudaFree), then every temporary of the step is carved
// out of it by allocate() (a pointer bump, 256-byte aligned) and the whole
// arena is rewound by reset() at the start of the next step.  So nothing on
// the timed path allocates, and an arena that is too small fails loudly with
// the size asked for instead of silently falling back to cudaMalloc.
//
// Not thread-safe; one arena per backend (per stream).
#pragma once

#include <cstddef>
#include <cstdint>

namespace modar::gpu {

class DeviceArena {
 public:
  static constexpr size_t kAlignmentBytes = 256;
  // Bytes one allocation of `bytes` takes from the arena (rounded up to the alignment).
  static constexpr size_t aligned_bytes(size_t bytes) {
    return (bytes + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
  }

  DeviceArena() = default;
  explicit DeviceArena(size_t capacity_bytes) { reserve(capacity_bytes); }
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Grow the single backing allocation to at least capacity_bytes.  Throws
  // modar::BackendError if anything is allocated from the arena (growing would
  // invalidate those pointers) or if cudaMalloc fails.
  void reserve(size_t capacity_bytes);
  // Bump-allocate.  Throws modar::BackendError naming the request, the bytes
  // in use and the capacity when the arena is full.
  void* allocate(size_t bytes);
  template <typename T>
  T* allocate_elements(int64_t count) {
    return static_cast<T*>(allocate(static_cast<size_t>(count) * sizeof(T)));
  }
  // Forget every allocation (the memory stays reserved).
  void reset() { used_bytes_ = 0; }

  size_t capacity_bytes() const { return capacity_bytes_; }
  size_t used_bytes() const { return used_bytes_; }
  size_t high_water_bytes() const { return high_water_bytes_; }

 private:
  char* base_ = nullptr;
  size_t capacity_bytes_ = 0;
  size_t used_bytes_ = 0;
  size_t high_water_bytes_ = 0;
};

}  // namespace modar::gpu
