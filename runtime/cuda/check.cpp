// runtime/cuda/check.cpp: error formatting for check.hpp (kept out of line so
// that every call site stays one compare and one branch).
#include "check.hpp"

#include <cublas_v2.h>

#include <climits>

namespace modar::gpu {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw BackendError(std::string("CUDA error: ") + call + " at " + file + ":" +
                     std::to_string(line) + ": " + cudaGetErrorName(status) + " (" +
                     cudaGetErrorString(status) + ")");
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw BackendError(std::string("cuBLAS error: ") + call + " at " + file + ":" +
                     std::to_string(line) + ": " + cublasGetStatusName(status) + " (" +
                     cublasGetStatusString(status) + ")");
}

void throw_argument_error(const char* op, const std::string& what) {
  throw ShapeError(std::string("cuda ") + op + ": " + what);
}

unsigned one_block_per_row(const char* op, const char* rows_name, int64_t rows) {
  constexpr int64_t kMaxGridX = INT32_MAX;
  MODAR_GPU_REQUIRE(op, rows >= 0 && rows <= kMaxGridX,
                    std::string(rows_name) + " must be in [0, " + std::to_string(kMaxGridX) +
                        "] (one block each), got " + std::to_string(rows));
  return static_cast<unsigned>(rows);
}

}  // namespace modar::gpu
