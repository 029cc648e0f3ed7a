// runtime/cpu/moe.cpp: the Mixture-of-Experts ops (backend.hpp "Mixture of
// Experts"; docs/runtime_ops.md#mixture-of-experts).
//
//   route       p = softmax(l) per token over E_total experts (real + null);
//               top-k by logit (descending, ties to the lower expert, NaN
//               last); gate_j = p_{e_j} (renormalize: / sum_j p_{e_j}).
//               Backward: dp_{e_j} += dg_j (renormalize: (dg_j - <dg, g>) / S),
//               dl = p (.) (dp - <p, dp>).
//   aux loss    aux = E sum_e f_e P_e (f_e = count_e / (T k), P_e = mean_t p_te);
//               z = mean_t lse_t^2.  d aux / dp_te = E f_e / T;
//               d z / dl_te = 2 lse_t p_te / T.
//   dispatch    assignment (t, j) -> row of the expert-grouped layout or -1
//               (null expert, or over capacity: priority j-major, then token order).
//   permute     out[slot] = x[t] (a pure row copy: bit exact in every dtype);
//               combine out[t] = sum_j g_j y[slot_j].
//   grouped     one gemm op per expert on its row range (exactly the gemm kernel).
// Layout: tokens are rows (x [T, d] or [b, s, d] flattened); logits / probs
// [T, E]; indices / slots [T, k]; expert rows [R, d] grouped by expert.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"
#include "modar/runtime/grouped_gemm_split.hpp"

namespace modar::runtime::cpu {
namespace {

// dst += sum over the kept assignments j of token t of weight(j) src[slot_j]:
// the combine (weight = gate) and the permute's backward (weight = 1).
template <class C, class Weight>
void gather_slot_rows(C* dst, const C* src, const int32_t* slots, int64_t t, int64_t k, int64_t d,
                      Weight weight) {
  for (int64_t j = 0; j < k; ++j) {
    const int64_t slot = slots[t * k + j];
    if (slot < 0)
      continue;
    const C w = weight(j);
    const C* row = src + slot * d;
    for (int64_t c = 0; c < d; ++c)
      dst[c] += w * row[c];
  }
}

// Softmax of one row into p; returns the row's logsumexp.
template <class C>
C softmax_row(const C* l, int64_t experts, C* p) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t e = 0; e < experts; ++e)
    m = std::max(m, l[e]);
  C sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    p[e] = std::exp(l[e] - m);
    sum += p[e];
  }
  for (int64_t e = 0; e < experts; ++e)
    p[e] /= sum;
  return m + std::log(sum);
}

template <class C>
C logsumexp_row(const C* l, int64_t experts) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t e = 0; e < experts; ++e)
    m = std::max(m, l[e]);
  C sum = 0;
  for (int64_t e = 0; e < experts; ++e)
    sum += std::exp(l[e] - m);
  return m + std::log(sum);
}

// dl += p (.) (dp - <p, dp>) for one row.
template <class C>
void softmax_backward_row(const C* p, const C* dp, int64_t experts, C* dl) {
  C inner = 0;
  for (int64_t e = 0; e < experts; ++e)
    inner += p[e] * dp[e];
  for (int64_t e = 0; e < experts; ++e)
    dl[e] += p[e] * (dp[e] - inner);
}

void check_indices_nonnegative(const char* op, const TensorView& indices) {
  check_index_range(op, "indices", indices, 0, std::numeric_limits<int32_t>::max());
}

}  // namespace

void CpuBackend::run_op(const MoeRouteForwardArgs& call) {
  const int64_t tokens = call.logits.dim(0), experts = call.logits.dim(1), k = call.indices.dim(1);
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<int32_t> order(static_cast<size_t>(experts));
    for (int64_t t = 0; t < tokens; ++t) {
      const C* l = call.logits.ptr<C>() + t * experts;
      C* p = call.probs.ptr<C>() + t * experts;
      softmax_row(l, experts, p);
      auto key = [l](int32_t e) {
        return std::isnan(l[e]) ? -std::numeric_limits<C>::infinity() : l[e];
      };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&key](int32_t a, int32_t b) {
                          const C ka = key(a), kb = key(b);
                          return ka != kb ? ka > kb : a < b;
                        });
      int32_t* idx = call.indices.ptr<int32_t>() + t * k;
      C* g = call.gates.ptr<C>() + t * k;
      C sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        idx[j] = order[static_cast<size_t>(j)];
        g[j] = p[idx[j]];
        sum += g[j];
      }
      if (call.params.renormalize) {
        for (int64_t j = 0; j < k; ++j)
          g[j] /= sum;
      }
    }
  });
}

void CpuBackend::run_op(const MoeRouteBackwardArgs& call) {
  const int64_t tokens = call.probs.dim(0), experts = call.probs.dim(1), k = call.indices.dim(1);
  check_index_range("moe_route_backward", "indices", call.indices, 0, experts);
  dispatch_compute(call.probs.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<C> dp(static_cast<size_t>(experts));
    for (int64_t t = 0; t < tokens; ++t) {
      const C* p = call.probs.ptr<C>() + t * experts;
      const int32_t* idx = call.indices.ptr<int32_t>() + t * k;
      const C* g = call.gates.ptr<C>() + t * k;
      const C* dg = call.dgates.ptr<C>() + t * k;
      std::fill(dp.begin(), dp.end(), C(0));
      if (call.params.renormalize) {
        C sum = 0, inner = 0;
        for (int64_t j = 0; j < k; ++j) {
          sum += p[idx[j]];
          inner += dg[j] * g[j];
        }
        for (int64_t j = 0; j < k; ++j)
          dp[static_cast<size_t>(idx[j])] += (dg[j] - inner) / sum;
      } else {
        for (int64_t j = 0; j < k; ++j)
          dp[static_cast<size_t>(idx[j])] += dg[j];
      }
      softmax_backward_row(p, dp.data(), experts, call.dlogits.ptr<C>() + t * experts);
    }
  });
}

void CpuBackend::run_op(const MoeAuxLossForwardArgs& call) {
  const int64_t tokens = call.logits.dim(0), experts = call.logits.dim(1), k = call.indices.dim(1);
  check_index_range("moe_aux_loss_forward", "indices", call.indices, 0, experts);
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    std::vector<double> count(static_cast<size_t>(experts), 0.0), mean_p(count.size(), 0.0);
    const int32_t* idx = call.indices.ptr<int32_t>();
    for (int64_t i = 0; i < tokens * k; ++i)
      count[static_cast<size_t>(idx[i])] += 1.0;
    double z = 0.0;
    for (int64_t t = 0; t < tokens; ++t) {
      const C* p = call.probs.ptr<C>() + t * experts;
      for (int64_t e = 0; e < experts; ++e)
        mean_p[static_cast<size_t>(e)] += static_cast<double>(p[e]);
      const double lse =
          static_cast<double>(logsumexp_row(call.logits.ptr<C>() + t * experts, experts));
      z += lse * lse;
    }
    double aux = 0.0;
    for (int64_t e = 0; e < experts; ++e) {
      aux += (count[static_cast<size_t>(e)] / static_cast<double>(tokens * k)) *
             (mean_p[static_cast<size_t>(e)] / static_cast<double>(tokens));
    }
    C* loss = call.loss.ptr<C>();
    loss[0] = static_cast<C>(static_cast<double>(experts) * aux);
    loss[1] = static_cast<C>(z / static_cast<double>(tokens));
  });
}

void CpuBackend::run_op(const MoeAuxLossBackwardArgs& call) {
  const int64_t tokens = call.logits.dim(0), experts = call.logits.dim(1), k = call.indices.dim(1);
  check_index_range("moe_aux_loss_backward", "indices", call.indices, 0, experts);
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    // d aux / d p_te = E f_e / T (the same for every token).
    std::vector<C> dp(static_cast<size_t>(experts), C(0));
    const int32_t* idx = call.indices.ptr<int32_t>();
    const double per_assignment = call.daux * static_cast<double>(experts) /
                                  (static_cast<double>(tokens * k) * static_cast<double>(tokens));
    for (int64_t i = 0; i < tokens * k; ++i)
      dp[static_cast<size_t>(idx[i])] += static_cast<C>(per_assignment);
    for (int64_t t = 0; t < tokens; ++t) {
      const C* l = call.logits.ptr<C>() + t * experts;
      const C* p = call.probs.ptr<C>() + t * experts;
      C* dl = call.dlogits.ptr<C>() + t * experts;
      if (call.daux != 0.0)
        softmax_backward_row(p, dp.data(), experts, dl);
      if (call.dz != 0.0) {
        const C scale =
            static_cast<C>(2.0 * call.dz / static_cast<double>(tokens)) * logsumexp_row(l, experts);
        for (int64_t e = 0; e < experts; ++e)
          dl[e] += scale * p[e];
      }
    }
  });
}

void CpuBackend::run_op(const MoeDispatchArgs& call) {
  check_indices_nonnegative("moe_dispatch", call.indices);
  const int64_t tokens = call.indices.dim(0), k = call.indices.dim(1), experts = call.counts.dim(0);
  const int32_t* idx = call.indices.ptr<int32_t>();
  int32_t* slots = call.slots.ptr<int32_t>();
  std::vector<int64_t> taken(static_cast<size_t>(experts), 0);
  // Keep / drop in priority order: all first choices, then all second choices...
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t e = idx[t * k + j];
      bool kept = false;
      if (e < experts && (call.capacity == 0 || taken[static_cast<size_t>(e)] < call.capacity)) {
        ++taken[static_cast<size_t>(e)];
        kept = true;
      }
      slots[t * k + j] = kept ? 0 : -1;
    }
  }
  // Rows: expert-major, token order within an expert.
  std::vector<int64_t> cursor(static_cast<size_t>(experts), 0);
  int32_t* counts = call.counts.ptr<int32_t>();
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    cursor[static_cast<size_t>(e)] = offset;
    counts[e] = static_cast<int32_t>(taken[static_cast<size_t>(e)]);
    offset += taken[static_cast<size_t>(e)];
  }
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (slots[i] == 0)
      slots[i] = static_cast<int32_t>(cursor[static_cast<size_t>(idx[i])]++);
  }
}

void CpuBackend::run_op(const MoePermuteForwardArgs& call) {
  const int64_t tokens = call.x.rows(), k = call.slots.dim(1), rows = call.out.dim(0);
  check_index_range("moe_permute_forward", "slots", call.slots, -1, rows);
  const int64_t row_bytes = call.x.dim(-1) * scalar_bytes(call.x.dtype);
  auto* out = static_cast<char*>(call.out.data);
  const auto* x = static_cast<const char*>(call.x.data);
  std::memset(out, 0, static_cast<size_t>(rows * row_bytes));
  const int32_t* slots = call.slots.ptr<int32_t>();
  MODAR_PARALLEL_FOR_IF(worth_threads(tokens * k * call.x.dim(-1)))
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = slots[t * k + j];
      if (slot >= 0)
        std::memcpy(out + slot * row_bytes, x + t * row_bytes, static_cast<size_t>(row_bytes));
    }
  }
}

void CpuBackend::run_op(const MoePermuteBackwardArgs& call) {
  const int64_t tokens = call.dx.rows(), k = call.slots.dim(1), d = call.dx.dim(-1);
  check_index_range("moe_permute_backward", "slots", call.slots, -1, call.dout.dim(0));
  dispatch_compute(call.dx.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> dout(call.dout);
    Output<C> dx(call.dx, OutputMode::accumulate);
    const int32_t* slots = call.slots.ptr<int32_t>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * k * d))
    for (int64_t t = 0; t < tokens; ++t)
      gather_slot_rows(dx.data() + t * d, dout.data(), slots, t, k, d,
                       [](int64_t) { return C(1); });
    dx.commit();
  });
}

void CpuBackend::run_op(const MoeUnpermuteForwardArgs& call) {
  const int64_t tokens = call.out.rows(), k = call.slots.dim(1), d = call.out.dim(-1);
  check_index_range("moe_unpermute_forward", "slots", call.slots, -1, call.y.dim(0));
  dispatch_compute(call.y.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> y(call.y);
    Input<C> gates(call.gates);
    Output<C> out(call.out, OutputMode::overwrite);
    const int32_t* slots = call.slots.ptr<int32_t>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * k * d))
    for (int64_t t = 0; t < tokens; ++t) {
      C* dst = out.data() + t * d;
      std::fill(dst, dst + d, C(0));
      gather_slot_rows(dst, y.data(), slots, t, k, d, [&](int64_t j) { return gates[t * k + j]; });
    }
    out.commit();
  });
}

void CpuBackend::run_op(const MoeUnpermuteBackwardArgs& call) {
  const int64_t tokens = call.dout.rows(), k = call.slots.dim(1), d = call.dout.dim(-1);
  check_index_range("moe_unpermute_backward", "slots", call.slots, -1, call.y.dim(0));
  dispatch_compute(call.y.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> dout(call.dout);
    Input<C> y(call.y);
    Input<C> gates(call.gates);
    Output<C> dy(call.dy, OutputMode::accumulate);
    Output<C> dgates(call.dgates, OutputMode::accumulate);
    const int32_t* slots = call.slots.ptr<int32_t>();
    // Each slot belongs to one (t, j) (dispatch), so the rows of dy are disjoint.
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * k * d))
    for (int64_t t = 0; t < tokens; ++t) {
      const C* g_out = dout.data() + t * d;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = slots[t * k + j];
        if (slot < 0)
          continue;
        if (dy.data() != nullptr)
          add_scaled_row(dy.data() + slot * d, gates[t * k + j], g_out, d);
        if (dgates.data() != nullptr)
          dgates[t * k + j] += dot_row(g_out, y.data() + slot * d, d);
      }
    }
    dy.commit();
    dgates.commit();
  });
}

void CpuBackend::run_op(const GroupedGemmArgs& call) {
  check_index_range("grouped_gemm", "counts", call.counts, 0, call.a.dim(0) + 1);
  detail::split_grouped_gemm(
      call, call.counts.ptr<int32_t>(), [this](const GemmArgs& g) { run_op(g); },
      [this](const FillArgs& f) { run_op(f); }, [this](const ScaleArgs& s) { run_op(s); });
}

}  // namespace modar::runtime::cpu
