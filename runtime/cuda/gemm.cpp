// runtime/cuda/gemm.cpp: see gemm.hpp for the semantics and the layout trick.
#include "gemm.hpp"

#include <cstdint>
#include <string>

#include "check.hpp"

namespace modar::gpu {

namespace {

cudaDataType_t to_cuda_type(GemmType type) {
  return type == GemmType::fp32 ? CUDA_R_32F : CUDA_R_16BF;
}

size_t element_bytes(GemmType type) {
  return type == GemmType::fp32 ? 4 : 2;
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic
// must not pick a kernel that assumes more alignment than the pointers have.
int pointer_alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  int alignment = 256;
  while (alignment > 1 && (address % static_cast<uintptr_t>(alignment)) != 0) {
    alignment /= 2;
  }
  return alignment;
}

std::string shape_string(const GemmArgs& a) {
  return "m=" + std::to_string(a.m) + " n=" + std::to_string(a.n) + " k=" + std::to_string(a.k) +
         " lda=" + std::to_string(a.lda) + " ldb=" + std::to_string(a.ldb) +
         " ldc=" + std::to_string(a.ldc) + " batch=" + std::to_string(a.batch) +
         (a.transpose_a ? " A^T" : "") + (a.transpose_b ? " B^T" : "");
}

}  // namespace

struct LtGemm::Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A = our B
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B = our A
  cublasLtMatrixLayout_t layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    if (layout_c != nullptr)
      cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_b != nullptr)
      cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_a != nullptr)
      cublasLtMatrixLayoutDestroy(layout_a);
    if (operation != nullptr)
      cublasLtMatmulDescDestroy(operation);
  }
};

LtGemm::LtGemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  MODAR_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_ != nullptr) {
    cublasLtDestroy(handle_);
  }
}

LtGemm::Plan& LtGemm::plan_for(const GemmArgs& g, int alignment_bytes) {
  const Key key{g.m,
                g.n,
                g.k,
                g.transpose_a,
                g.transpose_b,
                g.lda,
                g.ldb,
                g.ldc,
                g.batch,
                g.stride_a,
                g.stride_b,
                g.stride_c,
                static_cast<int>(g.input_type),
                static_cast<int>(g.output_type),
                g.beta != 0.0f ? 1 : 0,
                alignment_bytes};
  auto found = plans_.find(key);
  if (found != plans_.end()) {
    return *found->second;
  }
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t in_type = to_cuda_type(g.input_type);
  const cudaDataType_t out_type = to_cuda_type(g.output_type);
  MODAR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_lt_a = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MODAR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                                    &op_lt_a, sizeof(op_lt_a)));
  MODAR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB,
                                                    &op_lt_b, sizeof(op_lt_b)));
  // Column-major views: lt_a = B^T-ish (rows x cols as stored), lt_b = A, C is n x m.
  const uint64_t lt_a_rows = static_cast<uint64_t>(g.transpose_b ? g.k : g.n);
  const uint64_t lt_a_cols = static_cast<uint64_t>(g.transpose_b ? g.n : g.k);
  const uint64_t lt_b_rows = static_cast<uint64_t>(g.transpose_a ? g.m : g.k);
  const uint64_t lt_b_cols = static_cast<uint64_t>(g.transpose_a ? g.k : g.m);
  MODAR_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->layout_a, in_type, lt_a_rows, lt_a_cols, g.ldb));
  MODAR_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->layout_b, in_type, lt_b_rows, lt_b_cols, g.lda));
  MODAR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &plan->layout_c, out_type, static_cast<uint64_t>(g.n), static_cast<uint64_t>(g.m), g.ldc));
  if (g.batch > 1) {
    const int32_t batch = static_cast<int32_t>(g.batch);
    const struct {
      cublasLtMatrixLayout_t layout;
      int64_t stride;
    } batched[3] = {
        {plan->layout_a, g.stride_b}, {plan->layout_b, g.stride_a}, {plan->layout_c, g.stride_c}};
    for (const auto& entry : batched) {
      MODAR_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          entry.layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      MODAR_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          entry.layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &entry.stride,
          sizeof(entry.stride)));
    }
  }
  cublasLtMatmulPreference_t preference = nullptr;
  MODAR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = workspace_bytes_;
  const uint32_t alignment = static_cast<uint32_t>(alignment_bytes);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes));
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment,
                                                    sizeof(alignment));
    }
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->operation, plan->layout_a,
                                            plan->layout_b, plan->layout_c, plan->layout_c,
                                            preference, 1, &result, &returned);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  MODAR_CUBLAS_CHECK(status);
  if (returned == 0) {
    throw BackendError("cuBLASLt: no algorithm for GEMM " + shape_string(g));
  }
  plan->algo = result.algo;
  auto& stored = *plan;
  plans_.emplace(key, std::move(plan));
  return stored;
}

void LtGemm::run(const GemmArgs& args, cudaStream_t stream) {
  GemmArgs g = args;
  const char* op = "gemm";
  MODAR_GPU_REQUIRE(op, g.m >= 0 && g.n >= 0 && g.k > 0 && g.batch >= 1,
                    "need m, n >= 0, k > 0, batch >= 1; got " + shape_string(g));
  if (g.lda == 0)
    g.lda = g.transpose_a ? g.m : g.k;
  if (g.ldb == 0)
    g.ldb = g.transpose_b ? g.k : g.n;
  if (g.ldc == 0)
    g.ldc = g.n;
  if (g.m == 0 || g.n == 0) {
    return;
  }
  MODAR_GPU_REQUIRE(op, g.lda >= (g.transpose_a ? g.m : g.k),
                    "lda too small for op(A): " + shape_string(g));
  MODAR_GPU_REQUIRE(op, g.ldb >= (g.transpose_b ? g.k : g.n),
                    "ldb too small for op(B): " + shape_string(g));
  MODAR_GPU_REQUIRE(op, g.ldc >= g.n, "ldc too small for C: " + shape_string(g));
  MODAR_GPU_REQUIRE(op, g.a != nullptr && g.b != nullptr && g.c != nullptr, "null operand pointer");
  MODAR_GPU_REQUIRE(op, g.batch <= INT32_MAX, "batch count exceeds int32");
  if (g.batch > 1) {
    MODAR_GPU_REQUIRE(op, g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c > 0,
                      "batched GEMM needs non-negative strides and stride_c > 0");
  }
  // The alignment preference is the largest power of two dividing every
  // pointer, row pitch and batch stride (in bytes).
  int alignment = 256;
  for (const void* pointer : {g.a, g.b, static_cast<const void*>(g.c)}) {
    const int a = pointer_alignment(pointer);
    alignment = a < alignment ? a : alignment;
  }
  const size_t in_bytes = element_bytes(g.input_type);
  const size_t out_bytes = element_bytes(g.output_type);
  for (const size_t row_bytes :
       {static_cast<size_t>(g.lda) * in_bytes, static_cast<size_t>(g.ldb) * in_bytes,
        static_cast<size_t>(g.ldc) * out_bytes, static_cast<size_t>(g.stride_a) * in_bytes,
        static_cast<size_t>(g.stride_b) * in_bytes, static_cast<size_t>(g.stride_c) * out_bytes}) {
    if (row_bytes == 0) {
      continue;
    }
    while (alignment > 1 && row_bytes % static_cast<size_t>(alignment) != 0) {
      alignment /= 2;
    }
  }
  Plan& plan = plan_for(g, alignment);
  // cuBLASLt's A is our B and its B is our A (see the header).
  MODAR_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.operation, &g.alpha, g.b, plan.layout_a, g.a,
                                    plan.layout_b, &g.beta, g.c, plan.layout_c, g.c, plan.layout_c,
                                    &plan.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace modar::gpu
