// runtime/cpu/routing.cpp: the Mixture-of-Depths routing ops (docs/model.md MoD).
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

// The geometry every gather / scatter shares: the sequence tensor's [b, s, d], the k
// kept slots of `indices` [b, k], each index checked to be -1 (an empty slot) or a
// position < s before any row moves.
struct RoutedRows {
  int64_t batch, seq, d, k;
  const int32_t* idx;
};

RoutedRows routed_rows(const char* op, const TensorView& sequence, const TensorView& indices) {
  const int64_t seq = sequence.shape[1];
  check_index_range(op, "call.indices", indices, -1, seq);
  return {sequence.shape[0], seq, sequence.shape[2], indices.shape[1], indices.ptr<int32_t>()};
}

// dst[i, p] += factor(i, p) src[i, j] for each kept top-k position p = idx[i, j]
// of row i (p < 0: an empty slot): the gather's backward (factor 1) and the
// routed delta's scatter (factor g(r)).
template <class C, class Factor>
void scatter_kept_rows(C* dst, const C* src, const RoutedRows& rows, Factor factor) {
  const auto [batch, seq, d, k, idx] = rows;
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = idx[i * k + j];
      if (p < 0)
        continue;
      const C w = factor(i, p);
      const C* row = src + (i * k + j) * d;
      C* out = dst + (i * seq + p) * d;
      for (int64_t c = 0; c < d; ++c)
        out[c] += w * row[c];
    }
  }
}

}  // namespace

void CpuBackend::run_op(const RouterForwardArgs& call) {
  const int64_t rows = call.x.rows(), d = call.x.dim(-1);
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.x), w_in(call.w);
    ConstMatrixMap<C> xm(x_in.data(), rows, d);
    Eigen::Map<const Eigen::Matrix<C, Eigen::Dynamic, 1>> wv(w_in.data(), d);
    Eigen::Map<Eigen::Matrix<C, Eigen::Dynamic, 1>> out(call.logits.ptr<C>(), rows);
    out.noalias() = xm * wv;
  });
}

void CpuBackend::run_op(const RouterBackwardArgs& call) {
  const int64_t rows = call.x.rows(), d = call.x.dim(-1);
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    using Vector = Eigen::Matrix<C, Eigen::Dynamic, 1>;
    Input<C> x_in(call.x), w_in(call.w);
    Eigen::Map<const Vector> g(call.dlogits.ptr<C>(), rows);
    if (!call.dx.empty()) {
      Output<C> dx_acc(call.dx, OutputMode::accumulate);
      MatrixMap<C> dxm(dx_acc.data(), rows, d);
      Eigen::Map<const Vector> wv(w_in.data(), d);
      dxm.noalias() += g * wv.transpose();
      dx_acc.commit();
    }
    if (!call.dw.empty()) {
      ConstMatrixMap<C> xm(x_in.data(), rows, d);
      const Vector grad = xm.transpose() * g;
      store_converted(grad.data(), call.dw, true);
    }
  });
}

void CpuBackend::run_op(const TopkArgs& call) {
  const int64_t batch = call.logits.shape[0], seq = call.logits.shape[1], k = call.indices.shape[1];
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<int32_t> order;
    for (int64_t i = 0; i < batch; ++i) {
      select_top<C>(call.logits.ptr<C>() + i * seq, seq, k, call.indices.ptr<int32_t>() + i * k,
                    order);
    }
  });
}

void CpuBackend::run_op(const TopkRaggedArgs& call) {
  const int64_t batch = call.logits.shape[0], seq = call.logits.shape[1],
                k_max = call.indices.shape[1];
  check_index_range("topk_ragged", "call.counts", call.counts, 0, k_max + 1);
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<int32_t> order;
    for (int64_t i = 0; i < batch; ++i) {
      int32_t* row = call.indices.ptr<int32_t>() + i * k_max;
      const int64_t count = call.counts.ptr<int32_t>()[i];
      select_top<C>(call.logits.ptr<C>() + i * seq, seq, count, row, order);
      std::fill(row + count, row + k_max, -1);
    }
  });
}

void CpuBackend::run_op(const TopkMaskArgs& call) {
  const int64_t batch = call.indices.shape[0], k = call.indices.shape[1], seq = call.mask.shape[1];
  check_index_range("topk_mask", "call.indices", call.indices, -1, seq);
  dispatch_compute(call.mask.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<C> values(static_cast<size_t>(batch * seq), C(0));
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = call.indices.ptr<int32_t>()[i * k + j];
        if (p >= 0)
          values[static_cast<size_t>(i * seq + p)] = C(1);
      }
    }
    store_converted(values.data(), call.mask, false);
  });
}

void CpuBackend::run_op(const GatherRowsForwardArgs& call) {
  const auto [batch, seq, d, k, idx] = routed_rows("gather_rows_forward", call.x, call.indices);
  const int64_t row_bytes = d * scalar_bytes(call.x.dtype);
  const char* src = static_cast<const char*>(call.x.data);
  char* dst = static_cast<char*>(call.out.data);
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

void CpuBackend::run_op(const GatherRowsBackwardArgs& call) {
  const RoutedRows rows = routed_rows("gather_rows_backward", call.dx, call.indices);
  dispatch_compute(call.dx.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g(call.dout);
    Output<C> dx_acc(call.dx, OutputMode::accumulate);
    scatter_kept_rows(dx_acc.data(), g.data(), rows, [](int64_t, int64_t) { return C(1); });
    dx_acc.commit();
  });
}

void CpuBackend::run_op(const ScatterAddScaledForwardArgs& call) {
  const RoutedRows rows = routed_rows("scatter_add_scaled_forward", call.x, call.indices);
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> delta_in(call.delta);
    Output<C> x_mod(call.x, OutputMode::modify);
    const C* r = call.router_logits.ptr<C>();
    scatter_kept_rows(x_mod.data(), delta_in.data(), rows, [&](int64_t i, int64_t p) {
      return gate_value(r[i * rows.seq + p], call.gate);
    });
    x_mod.commit();
  });
}

void CpuBackend::run_op(const ScatterAddScaledBackwardArgs& call) {
  const RoutedRows rows = routed_rows("scatter_add_scaled_backward", call.dx, call.indices);
  const int64_t seq = rows.seq, d = rows.d, k = rows.k;
  dispatch_compute(call.dx.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g(call.dx), delta_in(call.delta);
    Output<C> ddelta_acc(call.ddelta, OutputMode::accumulate);
    const C* r = call.router_logits.ptr<C>();
    C* dr = call.drouter_logits.empty() ? nullptr : call.drouter_logits.ptr<C>();
    for (int64_t i = 0; i < rows.batch; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = rows.idx[i * k + j];
        if (p < 0)
          continue;
        const C logit = r[i * seq + p];
        const C* grad_row = g.data() + (i * seq + p) * d;
        const C* delta_row = delta_in.data() + (i * k + j) * d;
        if (ddelta_acc.data())
          add_scaled_row(ddelta_acc.data() + (i * k + j) * d, gate_value(logit, call.gate),
                         grad_row, d);
        if (dr)
          dr[i * seq + p] += gate_derivative(logit, call.gate) * dot_row(grad_row, delta_row, d);
      }
    }
    ddelta_acc.commit();
  });
}

}  // namespace modar::runtime::cpu
