// runtime/cpu/gemm.cpp: C = alpha op(A) op(B) + beta C on Eigen.
//
// Layout: row-major contiguous.  Rank-3 operands (all three) are a batch of
// independent GEMMs over dim 0; otherwise each operand is flattened to
// [rows, last dim] (so x [b, s, d] times W [d, f] is one [b*s, d] x [d, f]
// GEMM).  op(X) = X^T is an Eigen transpose expression over the row-major map
// (no copy).  bf16 operands are converted to fp32 first and C is accumulated
// in fp32 (bf16 C is rounded once at the end).  beta == 0 never reads C, so C
// may hold garbage (uninitialised memory) in that case.
#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {
namespace {

struct MatrixShape {
  int64_t rows = 0;
  int64_t cols = 0;
};

template <class C>
void gemm_one(const C* a, MatrixShape a_shape, bool transpose_a, const C* b, MatrixShape b_shape,
              bool transpose_b, C* c, MatrixShape c_shape, C alpha, C beta) {
  ConstMatrixMap<C> a_map(a, a_shape.rows, a_shape.cols);
  ConstMatrixMap<C> b_map(b, b_shape.rows, b_shape.cols);
  MatrixMap<C> c_map(c, c_shape.rows, c_shape.cols);
  if (beta == C(0)) {
    c_map.setZero();
  } else if (beta != C(1)) {
    c_map *= beta;
  }
  if (!transpose_a && !transpose_b) {
    c_map.noalias() += alpha * (a_map * b_map);
  } else if (transpose_a && !transpose_b) {
    c_map.noalias() += alpha * (a_map.transpose() * b_map);
  } else if (!transpose_a && transpose_b) {
    c_map.noalias() += alpha * (a_map * b_map.transpose());
  } else {
    c_map.noalias() += alpha * (a_map.transpose() * b_map.transpose());
  }
}

}  // namespace

void CpuBackend::run_op(const GemmArgs& call) {
  const bool batched = call.a.rank == 3 && call.b.rank == 3 && call.c.rank == 3;
  const int64_t batch = batched ? call.a.shape[0] : 1;
  const MatrixShape a_shape = batched ? MatrixShape{call.a.shape[1], call.a.shape[2]}
                                      : MatrixShape{call.a.rows(), call.a.dim(-1)};
  const MatrixShape b_shape = batched ? MatrixShape{call.b.shape[1], call.b.shape[2]}
                                      : MatrixShape{call.b.rows(), call.b.dim(-1)};
  const MatrixShape c_shape = batched ? MatrixShape{call.c.shape[1], call.c.shape[2]}
                                      : MatrixShape{call.c.rows(), call.c.dim(-1)};
  dispatch_compute(call.a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(call.a);
    Input<C> b_in(call.b);
    // call.beta == 0: C is write-only, never read (call.a staged buffer starts at zero).
    Output<C> c_out(call.c, call.beta == 0.0 ? OutputMode::overwrite : OutputMode::modify);
    const int64_t a_step = a_shape.rows * a_shape.cols;
    const int64_t b_step = b_shape.rows * b_shape.cols;
    const int64_t c_step = c_shape.rows * c_shape.cols;
    for (int64_t i = 0; i < batch; ++i) {
      gemm_one<C>(a_in.data() + i * a_step, a_shape, call.transpose_a, b_in.data() + i * b_step,
                  b_shape, call.transpose_b, c_out.data() + i * c_step, c_shape,
                  static_cast<C>(call.alpha), static_cast<C>(call.beta));
    }
    c_out.commit();
  });
}

}  // namespace modar::runtime::cpu
