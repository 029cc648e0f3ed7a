// modar/runtime/cuda_backend.hpp: what the CUDA backend offers beyond the
// Backend interface (only available when modar is built with MODAR_CUDA=ON,
// i.e. when the target modar_runtime_cuda exists; the core never includes it:
// the CUDA backend registers itself, see backend.hpp).
//
// The profiler records these as provenance of a measured GPU profile (docs/cost_model.md:
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

// ---- caching allocator (runtime/cuda/caching_allocator.hpp) -----------------
// Counters of one CUDA backend's caching device allocator.  After a warm-up
// step, a step with the same shapes should add requests and cache_hits only:
// device_mallocs stays where it was.
struct CudaAllocatorStats {
  int64_t requests = 0;             // Backend::allocate calls (and cuDNN temporaries)
  int64_t cache_hits = 0;           // requests served from a free list (no cudaMalloc)
  int64_t frees = 0;                // deallocate calls (never a cudaFree or a sync)
  int64_t device_mallocs = 0;       // cudaMalloc calls the allocator made
  int64_t device_frees = 0;         // cudaFree calls (only when the device ran full)
  int64_t bytes_in_use = 0;         // size-class bytes handed out
  int64_t bytes_cached = 0;         // size-class bytes on the free lists
  int64_t peak_bytes_reserved = 0;  // max of in use + cached
};
// Throws modar::BackendError when `backend` is not a CUDA backend.
class Backend;
CudaAllocatorStats cuda_allocator_stats(const Backend& backend);
// Every cudaMalloc the CUDA backend made in this process (allocator, arena,
// workspaces): a step that allocates nothing leaves it unchanged.
int64_t cuda_device_malloc_calls();

// Test hook: cap every grid-stride kernel at `max_blocks` blocks (0: the
// default, one wave of resident blocks on the device), so that small test
// sizes exercise the striding paths.
void set_cuda_grid_limit_for_testing(int64_t max_blocks);

// ---- attention path (runtime/cuda/cudnn_attention.hpp) ----------------------
// automatic: cuDNN's fused SDPA (tensor cores) where it supports the call (bf16,
// d_head a multiple of 8, cuDNN >= 9 found at run time as libcudnn.so.9), else
// the reference kernel (runtime/cuda/attention.cu).  cudnn: the same, but an
// unsupported call throws BackendError instead of falling back (benchmarks and
// the fast path's tests).  reference: always the reference kernel.
// The default is automatic, or the environment's MODAR_CUDA_ATTENTION
// (auto | cudnn | reference) read when the first backend is made.
enum class CudaAttentionPath { automatic, cudnn, reference };
void set_cuda_attention_path(CudaAttentionPath path);
CudaAttentionPath cuda_attention_path();
// One line: the cuDNN version found (or why none is used) and how many
// attention calls of this process ran on each path.
std::string cuda_attention_report();
struct CudaAttentionCounts {
  int64_t cudnn_forward = 0, cudnn_backward = 0;
  int64_t reference_forward = 0, reference_backward = 0;
};
CudaAttentionCounts cuda_attention_counts();

// The L2 size of the backend's device, for L2-rotating buffers in the profiler.
int64_t cuda_l2_cache_bytes(int device = 0);

// The backend's DeviceFacts (Backend::facts() of a CUDA backend on `device`).
DeviceFacts cuda_device_facts(int device = 0);

// The CUDA backend (make_backend("cuda") calls it through the registry) on
// device 0, or under mpirun on device (node-local rank mod device count), so
// that the ranks of a node use one GPU each (comm.hpp); throws
// BackendError("no CUDA device: ...") without a GPU.
std::unique_ptr<Backend> make_cuda_backend();
// The backend's cudaStream_t (as void*: no CUDA header here) and device
// ordinal, for the NCCL communicator; BackendError for a non-CUDA backend.
void* cuda_backend_stream(const Backend& backend);
int cuda_backend_device(const Backend& backend);

}  // namespace modar::runtime
