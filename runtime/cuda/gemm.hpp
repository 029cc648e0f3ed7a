// runtime/cuda/gemm.hpp: GEMMs through cuBLASLt, row-major, fp32 accumulation.
//
// Semantics (row-major, as the CPU backend):
//   C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n],   for each batch b
//   op(A) = A (stored m x k, leading dim lda >= k) or A^T (stored k x m, lda >= m)
//   op(B) = B (stored k x n, ldb >= n)             or B^T (stored n x k, ldb >= k)
//   C stored m x n, ldc >= n.  Batches are strided (stride_* in elements).
// Types: A and B share one type (fp32 or bf16); C is fp32 or bf16; the compute
// type is always CUBLAS_COMPUTE_32F (no TF32 for fp32 operands, so fp32 GEMMs
// compare with the CPU at fp32 rounding).
//
// Layout trick: a row-major X (r x c, ld) is the column-major X^T (c x r, ld),
// so we ask cuBLASLt for the column-major product C^T = op(B)^T op(A)^T with
// the operands swapped; no data moves.
//
// Descriptors, layouts and the heuristic's algorithm are cached per shape, so
// a repeated GEMM costs one cublasLtMatmul call (no allocation: the workspace
// is handed in once).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace modar::gpu {

enum class GemmType : uint8_t { fp32, bf16 };

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0 = packed (the stored row length)
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batches
  float alpha = 1.0f;
  float beta = 0.0f;
  GemmType input_type = GemmType::fp32;   // A and B
  GemmType output_type = GemmType::fp32;  // C
};

class LtGemm {
 public:
  // workspace: device memory owned by the caller, alive as long as this object.
  LtGemm(void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Throws modar::ShapeError for inconsistent arguments and modar::BackendError
  // when cuBLASLt fails or finds no algorithm.
  void run(const GemmArgs& args, cudaStream_t stream);

  cublasLtHandle_t handle() const { return handle_; }

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int, int, int, int>;
  Plan& plan_for(const GemmArgs& args, int alignment_bytes);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace modar::gpu
