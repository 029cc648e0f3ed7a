// runtime/cpu/rmsnorm.cpp: RMSNorm forward / backward.
//
// Per row x (length d):  rstd = (sum_i x_i^2 / d + eps)^(-1/2),
//                        out_i = x_i * rstd * w_i    (w = 1 when unweighted).
// Backward, with y_hat = x * rstd and g = dout (.) w:
//   dx_i += rstd * (g_i - y_hat_i * (sum_j g_j y_hat_j) / d)
//   dw_i += sum over rows of dout_i * y_hat_i
// Layout: x, out, dout, dx [rows, d] row-major; rstd [rows] (saved by the
// forward, the only statistic the backward needs).  Sums accumulate in the
// compute type (double for fp64 data, float otherwise).
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {

void CpuBackend::run_op(const RmsnormForwardArgs& call) {
  const int64_t rows = call.x.rows(), d = call.x.dim(-1);
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.x);
    Input<C> w_in(call.weight);
    Output<C> out_w(call.out, OutputMode::overwrite);
    C* rstd_p = call.rstd.ptr<C>();
    const C* xp = x_in.data();
    const C* wp = w_in.data();
    C* op = out_w.data();
    MODAR_PARALLEL_FOR_IF(worth_threads(rows * d))
    for (int64_t r = 0; r < rows; ++r) {
      const C* row = xp + r * d;
      C sum_squares = 0;
      for (int64_t i = 0; i < d; ++i)
        sum_squares += row[i] * row[i];
      const C inv = C(1) / std::sqrt(sum_squares / static_cast<C>(d) + static_cast<C>(call.eps));
      rstd_p[r] = inv;
      if (op) {
        C* dst = op + r * d;
        for (int64_t i = 0; i < d; ++i)
          dst[i] = row[i] * inv * (wp ? wp[i] : C(1));
      }
    }
    out_w.commit();
  });
}

void CpuBackend::run_op(const RmsnormBackwardArgs& call) {
  const int64_t rows = call.x.rows(), d = call.x.dim(-1);
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.x);
    Input<C> dout_in(call.dout);
    Input<C> w_in(call.weight);
    Output<C> dx_acc(call.dx, OutputMode::accumulate);
    const C* rstd_p = call.rstd.ptr<C>();
    const C* xp = x_in.data();
    const C* gp = dout_in.data();
    const C* wp = w_in.data();
    C* dxp = dx_acc.data();
    if (dxp) {
      MODAR_PARALLEL_FOR_IF(worth_threads(rows * d))
      for (int64_t r = 0; r < rows; ++r) {
        const C* xr = xp + r * d;
        const C* gr = gp + r * d;
        const C inv = rstd_p[r];
        C dot = 0;  // sum_j g_j y_hat_j
        for (int64_t i = 0; i < d; ++i)
          dot += gr[i] * (wp ? wp[i] : C(1)) * xr[i] * inv;
        const C mean_dot = dot / static_cast<C>(d);
        C* dst = dxp + r * d;
        for (int64_t i = 0; i < d; ++i) {
          dst[i] += inv * (gr[i] * (wp ? wp[i] : C(1)) - xr[i] * inv * mean_dot);
        }
      }
    }
    dx_acc.commit();
    if (!call.dweight.empty()) {
      std::vector<C> dw(static_cast<size_t>(d), C(0));
      for (int64_t r = 0; r < rows; ++r) {
        const C* xr = xp + r * d;
        const C* gr = gp + r * d;
        const C inv = rstd_p[r];
        for (int64_t i = 0; i < d; ++i)
          dw[static_cast<size_t>(i)] += gr[i] * xr[i] * inv;
      }
      store_converted(dw.data(), call.dweight, true);
    }
  });
}

}  // namespace modar::runtime::cpu
