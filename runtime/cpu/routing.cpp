// runtime/cpu/routing.cpp: the Mixture-of-Depths routing ops (SPEC 1.1).
//
//   router      logits[i] = x[i] . w_r          x [rows, d], w_r [d], logits [rows]
//   topk        per sequence exactly k positions with the largest logits; ties
//               break toward the LOWER position; output positions ASCENDING
//               (so causality among the selected tokens is the original order).
//               Selection = the first k of the order (logit desc, position asc),
//               which is a strict total order, so exactly k come out even when
//               logits tie (a threshold `>= kth value` would not).  NaN logits
//               rank below every number.
//   topk_ragged the same with a per-sequence count into a padded [b, k_max]
//               layout; unused slots hold -1.
//   gather      out[i, j] = x[i, idx[i, j]]     (zero row for idx = -1)
//   scatter     x[i, p] += g(r[i, p]) delta[i, j], p = idx[i, j]; only the
//               branch output delta is scaled, never the residual x.
// Layout: x [b, s, d], idx [b, k], delta [b, k, d], r [b, s]; all row-major.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {
namespace {

// Selects the `count` best positions of one sequence into `out` (ascending).
template <class C>
void select_top(const C* logits, int64_t seq, int64_t count, int32_t* out,
                std::vector<int32_t>& order) {
  order.resize(static_cast<size_t>(seq));
  std::iota(order.begin(), order.end(), 0);
  auto key = [logits](int32_t p) {
    const C value = logits[p];
    return std::isnan(value) ? -std::numeric_limits<C>::infinity() : value;
  };
  auto better = [&key](int32_t a, int32_t b) {
    const C ka = key(a), kb = key(b);
    if (ka != kb)
      return ka > kb;
    return a < b;  // ties (and NaN vs -inf) toward the lower position
  };
  if (count > 0 && count < seq) {
    std::nth_element(order.begin(), order.begin() + (count - 1), order.end(), better);
  }
  std::sort(order.begin(), order.begin() + count);
  std::copy(order.begin(), order.begin() + count, out);
}

template <class C>
C gate_value(C r, RouterScale gate) {
  return gate == RouterScale::linear ? r : sigmoid(r);
}

template <class C>
C gate_derivative(C r, RouterScale gate) {
  if (gate == RouterScale::linear)
    return C(1);
  const C s = sigmoid(r);
  return s * (C(1) - s);
}

}  // namespace

void CpuBackend::router_forward_impl(const TensorView& x, const TensorView& w,
                                     const TensorView& logits) {
  const int64_t rows = x.rows(), d = x.dim(-1);
  dispatch_compute(x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(x), w_in(w);
    ConstMatrixMap<C> xm(x_in.data(), rows, d);
    Eigen::Map<const Eigen::Matrix<C, Eigen::Dynamic, 1>> wv(w_in.data(), d);
    Eigen::Map<Eigen::Matrix<C, Eigen::Dynamic, 1>> out(logits.ptr<C>(), rows);
    out.noalias() = xm * wv;
  });
}

void CpuBackend::router_backward_impl(const TensorView& dlogits, const TensorView& x,
                                      const TensorView& w, const TensorView& dx,
                                      const TensorView& dw) {
  const int64_t rows = x.rows(), d = x.dim(-1);
  dispatch_compute(x.dtype, [&](auto tag) {
    using C = decltype(tag);
    using Vector = Eigen::Matrix<C, Eigen::Dynamic, 1>;
    Input<C> x_in(x), w_in(w);
    Eigen::Map<const Vector> g(dlogits.ptr<C>(), rows);
    if (!dx.empty()) {
      Output<C> dx_acc(dx, OutputMode::accumulate);
      MatrixMap<C> dxm(dx_acc.data(), rows, d);
      Eigen::Map<const Vector> wv(w_in.data(), d);
      dxm.noalias() += g * wv.transpose();
      dx_acc.commit();
    }
    if (!dw.empty()) {
      ConstMatrixMap<C> xm(x_in.data(), rows, d);
      const Vector grad = xm.transpose() * g;
      store_converted(grad.data(), dw, true);
    }
  });
}

void CpuBackend::topk_impl(const TensorView& logits, const TensorView& indices) {
  const int64_t batch = logits.shape[0], seq = logits.shape[1], k = indices.shape[1];
  dispatch_compute(logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<int32_t> order;
    for (int64_t i = 0; i < batch; ++i) {
      select_top<C>(logits.ptr<C>() + i * seq, seq, k, indices.ptr<int32_t>() + i * k, order);
    }
  });
}

void CpuBackend::topk_ragged_impl(const TensorView& logits, const TensorView& counts,
                                  const TensorView& indices) {
  const int64_t batch = logits.shape[0], seq = logits.shape[1], k_max = indices.shape[1];
  check_index_range("topk_ragged", "counts", counts, 0, k_max + 1);
  dispatch_compute(logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<int32_t> order;
    for (int64_t i = 0; i < batch; ++i) {
      int32_t* row = indices.ptr<int32_t>() + i * k_max;
      const int64_t count = counts.ptr<int32_t>()[i];
      select_top<C>(logits.ptr<C>() + i * seq, seq, count, row, order);
      std::fill(row + count, row + k_max, -1);
    }
  });
}

void CpuBackend::topk_mask_impl(const TensorView& indices, const TensorView& mask) {
  const int64_t batch = indices.shape[0], k = indices.shape[1], seq = mask.shape[1];
  check_index_range("topk_mask", "indices", indices, -1, seq);
  dispatch_compute(mask.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<C> values(static_cast<size_t>(batch * seq), C(0));
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = indices.ptr<int32_t>()[i * k + j];
        if (p >= 0)
          values[static_cast<size_t>(i * seq + p)] = C(1);
      }
    }
    store_converted(values.data(), mask, false);
  });
}

void CpuBackend::gather_rows_forward_impl(const TensorView& x, const TensorView& indices,
                                          const TensorView& out) {
  const int64_t batch = x.shape[0], seq = x.shape[1], d = x.shape[2], k = indices.shape[1];
  check_index_range("gather_rows_forward", "indices", indices, -1, seq);
  const int32_t* idx = indices.ptr<int32_t>();
  const int64_t row_bytes = d * scalar_bytes(x.dtype);
  const char* src = static_cast<const char*>(x.data);
  char* dst = static_cast<char*>(out.data);
  // A pure copy: no conversion needed whatever the dtype.
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = idx[i * k + j];
      char* dst_row = dst + (i * k + j) * row_bytes;
      if (p < 0) {
        std::fill(dst_row, dst_row + row_bytes, char(0));
      } else {
        std::copy(src + (i * seq + p) * row_bytes, src + (i * seq + p + 1) * row_bytes, dst_row);
      }
    }
  }
}

void CpuBackend::gather_rows_backward_impl(const TensorView& dout, const TensorView& indices,
                                           const TensorView& dx) {
  const int64_t batch = dx.shape[0], seq = dx.shape[1], d = dx.shape[2], k = indices.shape[1];
  check_index_range("gather_rows_backward", "indices", indices, -1, seq);
  const int32_t* idx = indices.ptr<int32_t>();
  dispatch_compute(dx.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g(dout);
    Output<C> dx_acc(dx, OutputMode::accumulate);
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = idx[i * k + j];
        if (p < 0)
          continue;
        const C* src = g.data() + (i * k + j) * d;
        C* dst = dx_acc.data() + (i * seq + p) * d;
        for (int64_t c = 0; c < d; ++c)
          dst[c] += src[c];
      }
    }
    dx_acc.commit();
  });
}

void CpuBackend::scatter_add_scaled_forward_impl(const TensorView& x, const TensorView& indices,
                                                 const TensorView& router_logits,
                                                 const TensorView& delta, RouterScale gate) {
  const int64_t batch = x.shape[0], seq = x.shape[1], d = x.shape[2], k = indices.shape[1];
  check_index_range("scatter_add_scaled_forward", "indices", indices, -1, seq);
  const int32_t* idx = indices.ptr<int32_t>();
  dispatch_compute(x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> delta_in(delta);
    Output<C> x_mod(x, OutputMode::modify);
    const C* r = router_logits.ptr<C>();
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = idx[i * k + j];
        if (p < 0)
          continue;
        const C factor = gate_value(r[i * seq + p], gate);
        const C* src = delta_in.data() + (i * k + j) * d;
        C* dst = x_mod.data() + (i * seq + p) * d;
        for (int64_t c = 0; c < d; ++c)
          dst[c] += factor * src[c];
      }
    }
    x_mod.commit();
  });
}

void CpuBackend::scatter_add_scaled_backward_impl(const TensorView& dx, const TensorView& indices,
                                                  const TensorView& router_logits,
                                                  const TensorView& delta, RouterScale gate,
                                                  const TensorView& ddelta,
                                                  const TensorView& drouter_logits) {
  const int64_t batch = dx.shape[0], seq = dx.shape[1], d = dx.shape[2], k = indices.shape[1];
  check_index_range("scatter_add_scaled_backward", "indices", indices, -1, seq);
  const int32_t* idx = indices.ptr<int32_t>();
  dispatch_compute(dx.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g(dx), delta_in(delta);
    Output<C> ddelta_acc(ddelta, OutputMode::accumulate);
    const C* r = router_logits.ptr<C>();
    C* dr = drouter_logits.empty() ? nullptr : drouter_logits.ptr<C>();
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = idx[i * k + j];
        if (p < 0)
          continue;
        const C logit = r[i * seq + p];
        const C* grad_row = g.data() + (i * seq + p) * d;
        const C* delta_row = delta_in.data() + (i * k + j) * d;
        if (ddelta_acc.data()) {
          const C factor = gate_value(logit, gate);
          C* dst = ddelta_acc.data() + (i * k + j) * d;
          for (int64_t c = 0; c < d; ++c)
            dst[c] += factor * grad_row[c];
        }
        if (dr) {
          C dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += grad_row[c] * delta_row[c];
          dr[i * seq + p] += gate_derivative(logit, gate) * dot;
        }
      }
    }
    ddelta_acc.commit();
  });
}

}  // namespace modar::runtime::cpu
