// runtime/cuda/check.hpp: every CUDA runtime and cuBLAS(Lt) call is checked.
//
// A failing call becomes a modar::BackendError whose message names the call as
// written in the source, the file and line, and the library's error name and
// string, e.g.
//   "CUDA error: cudaMalloc(&ptr, bytes) at runtime/cuda/arena.cpp:41:
//    cudaErrorMemoryAllocation (out of memory)"
// Kernel launches are followed by MODAR_CUDA_CHECK_LAUNCH(), which reports the
// launch-configuration errors that cudaGetLastError() holds (asynchronous
// faults surface at the next synchronising call, which is checked too).
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "modar/base/errors.hpp"

namespace modar::gpu {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    throw_cuda_error(status, call, file, line);
  }
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw_cublas_error(status, call, file, line);
  }
}

// Host-side argument check for launchers: throws modar::ShapeError with the
// launcher's name and the condition that failed.
[[noreturn]] void throw_argument_error(const char* op, const std::string& what);

// Grid size of a one-block-per-row launch: `rows` (named `rows_name` in the
// message) must be in [0, 2^31 - 1], the grid's x limit; throws
// modar::ShapeError otherwise.
unsigned one_block_per_row(const char* op, const char* rows_name, int64_t rows);

}  // namespace modar::gpu

#define MODAR_CUDA_CHECK(call) ::modar::gpu::check_cuda((call), #call, __FILE__, __LINE__)
#define MODAR_CUBLAS_CHECK(call) ::modar::gpu::check_cublas((call), #call, __FILE__, __LINE__)
#define MODAR_CUDA_CHECK_LAUNCH() \
  ::modar::gpu::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
// MODAR_GPU_REQUIRE(op, cond, message-expression): message is only built on failure.
#define MODAR_GPU_REQUIRE(op, cond, message)               \
  do {                                                     \
    if (!(cond)) {                                         \
      ::modar::gpu::throw_argument_error((op), (message)); \
    }                                                      \
  } while (false)
