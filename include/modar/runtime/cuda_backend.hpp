// modar/runtime/cuda_backend.hpp: what the CUDA backend offers beyond the
// Backend interface (only available when modar is built with MODAR_CUDA=ON,
// i.e. when the target modar_runtime_cuda exists; the core never includes it:
// the CUDA backend registers itself, see backend.hpp).
//
// The profiler records these as provenance of a measured GPU profile (SPEC 3:
// device name, driver, clocks, CUDA and cuBLAS versions).  No CUDA header is
// included here: plain C++ types only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "modar/runtime/backend.hpp"

namespace modar::runtime {

struct CudaDeviceInfo {
  int device_index = 0;
  std::string name;                  // "NVIDIA H200"
  int compute_capability_major = 0;  // 9 for Hopper
  int compute_capability_minor = 0;
  int multiprocessors = 0;
  int max_sm_clock_khz = 0;      // cudaDevAttrClockRate (peak, not the current clock)
  int max_memory_clock_khz = 0;  // cudaDevAttrMemoryClockRate
  int memory_bus_width_bits = 0;
  int64_t l2_cache_bytes = 0;
  int64_t memory_bytes = 0;  // total device memory
  int64_t shared_memory_per_block_optin_bytes = 0;
  int driver_version = 0;   // cudaDriverGetVersion, e.g. 13000
  int runtime_version = 0;  // cudaRuntimeGetVersion
  int cublas_version = 0;   // cublasLtGetVersion, e.g. 130100
  std::string pci_bus_id;   // "0000:19:00.0"
};

// Throws modar::BackendError("no CUDA device: <reason>") when the driver or
// device is missing (cudaGetDeviceCount fails or returns 0) or `device` is out
// of range.
CudaDeviceInfo cuda_device_info(int device = 0);

// The same as flat key = value strings for DeviceProfile::provenance
// ("gpu_name", "compute_capability", "driver_version", "cuda_runtime_version",
// "cublas_version", "sm_clock_max_mhz", "memory_clock_max_mhz", "l2_cache_bytes",
// "memory_bytes", "multiprocessors", "pci_bus_id").
std::map<std::string, std::string> cuda_provenance(int device = 0);

// The L2 size of the backend's device, for L2-rotating buffers in the profiler.
int64_t cuda_l2_cache_bytes(int device = 0);

// The backend's DeviceFacts (Backend::facts() of a CUDA backend on `device`).
DeviceFacts cuda_device_facts(int device = 0);

// The CUDA backend on device 0 (make_backend("cuda") calls it through the
// registry); throws BackendError("no CUDA device: ...") without a GPU.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace modar::runtime
