// runtime/cuda/arena.cpp: see arena.hpp.
#include "arena.hpp"

#include <string>

#include "caching_allocator.hpp"
#include "check.hpp"

namespace modar::gpu {

DeviceArena::~DeviceArena() {
  if (base_ != nullptr) {
    counted_cuda_free(base_);  // a destructor must not throw; a failure here is unrecoverable anyway
  }
}

void DeviceArena::reserve(size_t capacity_bytes) {
  const size_t rounded = aligned_bytes(capacity_bytes);
  if (rounded <= capacity_bytes_) {
    return;
  }
  if (used_bytes_ != 0) {
    throw BackendError("device arena: cannot grow from " + std::to_string(capacity_bytes_) +
                       " to " + std::to_string(rounded) + " bytes while " +
                       std::to_string(used_bytes_) + " bytes are allocated; call reset() first");
  }
  if (base_ != nullptr) {
    counted_cuda_free(base_);
    base_ = nullptr;
    capacity_bytes_ = 0;
  }
  base_ = static_cast<char*>(counted_cuda_malloc(rounded));
  capacity_bytes_ = rounded;
}

void* DeviceArena::allocate(size_t bytes) {
  const size_t rounded = aligned_bytes(bytes);
  if (rounded > capacity_bytes_ - used_bytes_) {
    throw BackendError("device arena: request of " + std::to_string(bytes) +
                       " bytes does not fit (" + std::to_string(used_bytes_) + " of " +
                       std::to_string(capacity_bytes_) +
                       " bytes in use); reserve a larger arena before the step");
  }
  char* pointer = base_ + used_bytes_;
  used_bytes_ += rounded;
  if (used_bytes_ > high_water_bytes_) {
    high_water_bytes_ = used_bytes_;
  }
  return pointer;
}

}  // namespace modar::gpu
