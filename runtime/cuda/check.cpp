// runtime/cuda/check.cpp: error formatting for check.hpp (kept out of line so
// that every call site stays one compare and one branch).
#include "check.hpp"

#include <cublas_v2.h>

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

}  // namespace modar::gpu
