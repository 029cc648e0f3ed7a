// runtime/cpu/dar.cpp: the DAR coefficient head, the read mix and the
// transport / gated write (docs/model.md AttnRes/DAR; docs/dar_math.md 3.2, 5.3).  modar's
// parameterisation (mHC-style; the paper's exact equations are not public).
//
// Coefficient head, per token t (retrieved R [n, T, d], D = n d):
//   z      = [R_0[t]; ...; R_{n-1}[t]] * z_rstd,  z_rstd = (|[R]|^2 / D + eps)^-1/2
//   u      = z W                  (W [D, outputs] row-major)
//   c_o    = scale[group(o)] u_o + bias_o   groups: alpha [0, n), beta [n, 2n),
//                                           transport [2n, outputs)
//   alpha  = sigmoid(c_alpha),  beta = 2 sigmoid(c_beta)
//   n = 2: rho = sigmoid(c_rho), M = [[rho, 1-rho], [1-rho, rho]]
//   n > 2: M = Sinkhorn(exp(c_M)) with `sinkhorn_iterations` rounds of
//          (normalise rows, then columns); exactly doubly stochastic only in the
//          limit, column sums are exact after each round.
// Backward: dc_alpha = dalpha alpha (1-alpha), dc_beta = dbeta beta (1 - beta/2),
//   n = 2: drho = dM00 + dM11 - dM01 - dM10, dc_rho = drho rho (1-rho);
//   n > 2: reverse mode through the unrolled Sinkhorn rounds (replayed per token);
//   dscale_g += sum dc_o u_o, dbias += dc, du = scale dc, dW += z^T du,
//   dz = W du, and the unweighted RMSNorm backward over the D values
//   dR = z_rstd (dz - z (dz . z) / D).
// Mix:   h[t] = sum_j alpha[t, j] R_j[t]
// Write: P_new[j, t] = sum_k M[t, j, k] P[k, t] + beta[t, j] y[t]
//   backward: dP[k] += sum_j M[j, k] dout[j], dM[j, k] += <dout[j], P[k]>,
//             dbeta[j] += <dout[j], y>, dy += sum_j beta[j] dout[j].
// Layout: stream-major [n, T, d] for R, P, out; [T, n] for alpha / beta;
// [T, n, n] for M.  Per-token work is independent (parallel over t); the
// parameter gradients (dW, dbias, dscale) are reduced in a fixed token order.
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {
namespace {

// Forward Sinkhorn on one n x n matrix of logits; `history` (optional) keeps
// A_0 and the matrix after each row / column normalisation for the backward.
template <class C>
void sinkhorn(const C* logits, int64_t n, int iterations, C* result,
              std::vector<std::vector<C>>* history) {
  std::vector<C> a(static_cast<size_t>(n * n));
  C max_logit = logits[0];
  for (int64_t i = 1; i < n * n; ++i)
    max_logit = std::max(max_logit, logits[i]);
  // The shift cancels in the normalisations (its gradient is zero).
  for (int64_t i = 0; i < n * n; ++i)
    a[static_cast<size_t>(i)] = std::exp(logits[i] - max_logit);
  if (history)
    history->push_back(a);
  // One normalisation: every row (line u = row i, element v = column j) or
  // every column (u = j, v = i) divided by its sum, summed in v order.
  auto normalize_lines = [&](bool rows) {
    const int64_t u_stride = rows ? n : 1, v_stride = rows ? 1 : n;
    for (int64_t u = 0; u < n; ++u) {
      C sum = 0;
      for (int64_t v = 0; v < n; ++v)
        sum += a[static_cast<size_t>(u * u_stride + v * v_stride)];
      for (int64_t v = 0; v < n; ++v)
        a[static_cast<size_t>(u * u_stride + v * v_stride)] /= sum;
    }
    if (history)
      history->push_back(a);
  };
  for (int it = 0; it < iterations; ++it) {
    normalize_lines(true);
    normalize_lines(false);
  }
  std::copy(a.begin(), a.end(), result);
}

// Reverse mode of sinkhorn(): dM (n x n) -> dlogits.
template <class C>
void sinkhorn_backward(const std::vector<std::vector<C>>& history, int64_t n, const C* dresult,
                       C* dlogits) {
  std::vector<C> g(dresult, dresult + n * n);
  const auto at = [n](int64_t i, int64_t j) { return static_cast<size_t>(i * n + j); };
  for (size_t step = history.size() - 1; step >= 1; --step) {
    const std::vector<C>& out = history[step];     // after the normalisation
    const std::vector<C>& in = history[step - 1];  // before it
    const bool column_step = (step % 2) == 0;      // odd: rows, even: columns
    std::vector<C> dg(g.size());
    for (int64_t outer = 0; outer < n; ++outer) {
      // y = x / sum(x) over a line: dx = (dy - <dy, y>) / sum(x)
      C sum = 0, inner = 0;
      for (int64_t m = 0; m < n; ++m) {
        const size_t idx = column_step ? at(m, outer) : at(outer, m);
        sum += in[idx];
        inner += g[idx] * out[idx];
      }
      for (int64_t m = 0; m < n; ++m) {
        const size_t idx = column_step ? at(m, outer) : at(outer, m);
        dg[idx] = (g[idx] - inner) / sum;
      }
    }
    g.swap(dg);
  }
  for (int64_t i = 0; i < n * n; ++i)
    dlogits[i] = g[static_cast<size_t>(i)] * history[0][static_cast<size_t>(i)];
}

int coefficient_group(int64_t output, int64_t n) {
  return output < n ? 0 : (output < 2 * n ? 1 : 2);
}

}  // namespace

void CpuBackend::run_op(const DarCoefficientsForwardArgs& call) {
  const int64_t n = call.retrieved.shape[0], tokens = call.retrieved.shape[1],
                d = call.retrieved.shape[2];
  const int64_t outputs = call.weight.shape[1], width = n * d;
  dispatch_compute(call.retrieved.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> r_in(call.retrieved);
    const C* w = call.weight.ptr<C>();
    const C* b = call.bias.ptr<C>();
    const C* sc = call.scale.ptr<C>();
    C* alpha_p = call.alpha.ptr<C>();
    C* beta_p = call.beta.ptr<C>();
    C* m_p = call.transport.empty() ? nullptr : call.transport.ptr<C>();
    C* rstd_p = call.z_rstd.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * width * outputs))
    for (int64_t t = 0; t < tokens; ++t) {
      C sum_squares = 0;
      for (int64_t j = 0; j < n; ++j) {
        const C* row = r_in.data() + (j * tokens + t) * d;
        for (int64_t c = 0; c < d; ++c)
          sum_squares += row[c] * row[c];
      }
      const C inv =
          C(1) / std::sqrt(sum_squares / static_cast<C>(width) + static_cast<C>(call.params.eps));
      rstd_p[t] = inv;
      std::vector<C> c_values(static_cast<size_t>(outputs), C(0));
      for (int64_t j = 0; j < n; ++j) {
        const C* row = r_in.data() + (j * tokens + t) * d;
        for (int64_t c = 0; c < d; ++c) {
          const C z = row[c] * inv;
          const C* w_row = w + (j * d + c) * outputs;
          for (int64_t o = 0; o < outputs; ++o)
            c_values[static_cast<size_t>(o)] += z * w_row[o];
        }
      }
      for (int64_t o = 0; o < outputs; ++o) {
        c_values[static_cast<size_t>(o)] =
            sc[coefficient_group(o, n)] * c_values[static_cast<size_t>(o)] + b[o];
      }
      for (int64_t j = 0; j < n; ++j) {
        alpha_p[t * n + j] = sigmoid(c_values[static_cast<size_t>(j)]);
        beta_p[t * n + j] = C(2) * sigmoid(c_values[static_cast<size_t>(n + j)]);
      }
      if (m_p) {
        C* m = m_p + t * n * n;
        if (n == 2) {
          const C rho = sigmoid(c_values[4]);
          m[0] = rho, m[1] = C(1) - rho, m[2] = C(1) - rho, m[3] = rho;
        } else {
          sinkhorn<C>(c_values.data() + 2 * n, n, call.params.sinkhorn_iterations, m, nullptr);
        }
      }
    }
  });
}

void CpuBackend::run_op(const DarCoefficientsBackwardArgs& call) {
  const int64_t n = call.retrieved.shape[0], tokens = call.retrieved.shape[1],
                d = call.retrieved.shape[2];
  const int64_t outputs = call.weight.shape[1], width = n * d;
  const bool has_transport = !call.transport.empty();
  dispatch_compute(call.retrieved.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> r_in(call.retrieved);
    Output<C> dr_acc(call.dretrieved, OutputMode::accumulate);
    const C* w = call.weight.ptr<C>();
    const C* b = call.bias.ptr<C>();
    const C* sc = call.scale.ptr<C>();
    const C* alpha_p = call.alpha.ptr<C>();
    const C* beta_p = call.beta.ptr<C>();
    const C* m_p = has_transport ? call.transport.ptr<C>() : nullptr;
    const C* da = call.dalpha.ptr<C>();
    const C* db = call.dbeta.ptr<C>();
    const C* dm = call.dtransport.empty() ? nullptr : call.dtransport.ptr<C>();
    const C* rstd_p = call.z_rstd.ptr<C>();
    std::vector<C> dw(call.dweight.empty() ? 0 : static_cast<size_t>(width * outputs), C(0));
    std::vector<C> dbias_sum(static_cast<size_t>(outputs), C(0));
    std::vector<C> dscale_sum(3, C(0));
    std::vector<C> z(static_cast<size_t>(width)), u(static_cast<size_t>(outputs)),
        dc(static_cast<size_t>(outputs)), du(static_cast<size_t>(outputs)),
        dz(static_cast<size_t>(width));
    // Serial over tokens: the parameter reductions stay deterministic and the
    // work per token (D x outputs) is tiny.
    for (int64_t t = 0; t < tokens; ++t) {
      const C inv = rstd_p[t];
      for (int64_t j = 0; j < n; ++j) {
        const C* row = r_in.data() + (j * tokens + t) * d;
        for (int64_t c = 0; c < d; ++c)
          z[static_cast<size_t>(j * d + c)] = row[c] * inv;
      }
      std::fill(u.begin(), u.end(), C(0));
      for (int64_t i = 0; i < width; ++i) {
        const C* w_row = w + i * outputs;
        for (int64_t o = 0; o < outputs; ++o)
          u[static_cast<size_t>(o)] += z[static_cast<size_t>(i)] * w_row[o];
      }
      std::fill(dc.begin(), dc.end(), C(0));
      for (int64_t j = 0; j < n; ++j) {
        const C a = alpha_p[t * n + j];
        const C bt = beta_p[t * n + j];
        dc[static_cast<size_t>(j)] = da[t * n + j] * a * (C(1) - a);
        dc[static_cast<size_t>(n + j)] = db[t * n + j] * bt * (C(1) - bt / C(2));
      }
      if (has_transport && dm) {
        const C* g = dm + t * n * n;
        if (n == 2) {
          const C rho = m_p[t * 4];
          dc[4] = (g[0] + g[3] - g[1] - g[2]) * rho * (C(1) - rho);
        } else {
          std::vector<C> logits(static_cast<size_t>(n * n));
          for (int64_t o = 0; o < n * n; ++o) {
            logits[static_cast<size_t>(o)] =
                sc[2] * u[static_cast<size_t>(2 * n + o)] + b[2 * n + o];
          }
          std::vector<std::vector<C>> history;
          std::vector<C> replay(static_cast<size_t>(n * n));
          sinkhorn<C>(logits.data(), n, call.params.sinkhorn_iterations, replay.data(), &history);
          sinkhorn_backward<C>(history, n, g, dc.data() + 2 * n);
        }
      }
      for (int64_t o = 0; o < outputs; ++o) {
        const int group = coefficient_group(o, n);
        dscale_sum[static_cast<size_t>(group)] +=
            dc[static_cast<size_t>(o)] * u[static_cast<size_t>(o)];
        dbias_sum[static_cast<size_t>(o)] += dc[static_cast<size_t>(o)];
        du[static_cast<size_t>(o)] = dc[static_cast<size_t>(o)] * sc[group];
      }
      C dz_dot_z = 0;
      for (int64_t i = 0; i < width; ++i) {
        const C* w_row = w + i * outputs;
        C sum = 0;
        for (int64_t o = 0; o < outputs; ++o) {
          sum += w_row[o] * du[static_cast<size_t>(o)];
          if (!dw.empty())
            dw[static_cast<size_t>(i * outputs + o)] +=
                z[static_cast<size_t>(i)] * du[static_cast<size_t>(o)];
        }
        dz[static_cast<size_t>(i)] = sum;
        dz_dot_z += sum * z[static_cast<size_t>(i)];
      }
      if (dr_acc.data()) {
        const C mean = dz_dot_z / static_cast<C>(width);
        for (int64_t j = 0; j < n; ++j) {
          C* dst = dr_acc.data() + (j * tokens + t) * d;
          for (int64_t c = 0; c < d; ++c) {
            const size_t i = static_cast<size_t>(j * d + c);
            dst[c] += inv * (dz[i] - z[i] * mean);
          }
        }
      }
    }
    dr_acc.commit();
    if (!dw.empty())
      store_converted(dw.data(), call.dweight, true);
    if (!call.dbias.empty())
      store_converted(dbias_sum.data(), call.dbias, true);
    if (!call.dscale.empty())
      store_converted(dscale_sum.data(), call.dscale, true);
  });
}

void CpuBackend::run_op(const DarMixForwardArgs& call) {
  const int64_t n = call.retrieved.shape[0], tokens = call.retrieved.shape[1],
                d = call.retrieved.shape[2];
  dispatch_compute(call.retrieved.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> r_in(call.retrieved);
    Output<C> out_w(call.out, OutputMode::overwrite);
    const C* a = call.alpha.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * n * d))
    for (int64_t t = 0; t < tokens; ++t) {
      C* dst = out_w.data() + t * d;
      for (int64_t c = 0; c < d; ++c)
        dst[c] = 0;
      for (int64_t j = 0; j < n; ++j)
        add_scaled_row(dst, a[t * n + j], r_in.data() + (j * tokens + t) * d, d);
    }
    out_w.commit();
  });
}

void CpuBackend::run_op(const DarMixBackwardArgs& call) {
  const int64_t n = call.retrieved.shape[0], tokens = call.retrieved.shape[1],
                d = call.retrieved.shape[2];
  dispatch_compute(call.retrieved.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> r_in(call.retrieved), g_in(call.dout);
    Output<C> dr_acc(call.dretrieved, OutputMode::accumulate);
    const C* a = call.alpha.ptr<C>();
    C* da = call.dalpha.empty() ? nullptr : call.dalpha.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * n * d))
    for (int64_t t = 0; t < tokens; ++t) {
      const C* grad = g_in.data() + t * d;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = (j * tokens + t) * d;
        if (dr_acc.data())
          add_scaled_row(dr_acc.data() + row, a[t * n + j], grad, d);
        if (da)
          da[t * n + j] += dot_row(r_in.data() + row, grad, d);
      }
    }
    dr_acc.commit();
  });
}

void CpuBackend::run_op(const DarWriteForwardArgs& call) {
  const int64_t n = call.out.shape[0], tokens = call.out.shape[1], d = call.out.shape[2];
  dispatch_compute(call.out.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> p_in(call.partial), y_in(call.y);
    Output<C> out_w(call.out, OutputMode::overwrite);
    const C* m = call.transport.empty() ? nullptr : call.transport.ptr<C>();
    const C* bt = call.beta.empty() ? nullptr : call.beta.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * n * (n + 1) * d))
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        C* dst = out_w.data() + (j * tokens + t) * d;
        for (int64_t c = 0; c < d; ++c)
          dst[c] = 0;
        if (m) {
          for (int64_t k = 0; k < n; ++k)
            add_scaled_row(dst, m[(t * n + j) * n + k], p_in.data() + (k * tokens + t) * d, d);
        }
        if (bt)
          add_scaled_row(dst, bt[t * n + j], y_in.data() + t * d, d);
      }
    }
    out_w.commit();
  });
}

void CpuBackend::run_op(const DarWriteBackwardArgs& call) {
  const int64_t n = call.dout.shape[0], tokens = call.dout.shape[1], d = call.dout.shape[2];
  dispatch_compute(call.dout.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g_in(call.dout), p_in(call.partial), y_in(call.y);
    Output<C> dp_acc(call.dpartial, OutputMode::accumulate),
        dy_acc(call.dy, OutputMode::accumulate);
    const C* m = call.transport.empty() ? nullptr : call.transport.ptr<C>();
    const C* bt = call.beta.empty() ? nullptr : call.beta.ptr<C>();
    C* dm = call.dtransport.empty() ? nullptr : call.dtransport.ptr<C>();
    C* db = call.dbeta.empty() ? nullptr : call.dbeta.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * n * (n + 1) * d))
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        const C* grad = g_in.data() + (j * tokens + t) * d;
        if (m) {
          for (int64_t k = 0; k < n; ++k) {
            const int64_t row = (k * tokens + t) * d;
            if (dp_acc.data())
              add_scaled_row(dp_acc.data() + row, m[(t * n + j) * n + k], grad, d);
            if (dm)
              dm[(t * n + j) * n + k] += dot_row(grad, p_in.data() + row, d);
          }
        }
        if (bt) {
          if (db)
            db[t * n + j] += dot_row(grad, y_in.data() + t * d, d);
          if (dy_acc.data())
            add_scaled_row(dy_acc.data() + t * d, bt[t * n + j], grad, d);
        }
      }
    }
    dp_acc.commit();
    dy_acc.commit();
  });
}

}  // namespace modar::runtime::cpu
