// runtime/cpu/losses.cpp: cross-entropy over the vocabulary and the BCE of the
// MoD auxiliary router loss / causal predictor.
//
// Cross-entropy (fused log-softmax), per row i with target y_i >= 0:
//   lse_i = log sum_v exp(logits[i, v]),  loss = mean_i (lse_i - logits[i, y_i])
// over the N rows whose target is not -1 (ignored rows; loss = 0 when N = 0).
// Backward: dlogits[i, v] += dloss / N (exp(logits[i, v] - lse_i) - [v == y_i]).
// BCE with logits x and targets t in [0, 1], mean over all rows, stable form:
//   l = max(x, 0) - x t + log(1 + exp(-|x|));   dl/dx = sigmoid(x) - t.
// The loss sum accumulates in double whatever the data dtype.
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {

void CpuBackend::run_op(const CrossEntropyForwardArgs& call) {
  const int64_t rows = call.logits.rows(), vocab = call.logits.dim(-1);
  check_index_range("cross_entropy_forward", "call.targets", call.targets, -1, vocab);
  const int32_t* target = call.targets.ptr<int32_t>();
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.logits);
    C* lse_p = call.lse.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(rows * vocab))
    for (int64_t i = 0; i < rows; ++i) {
      const C* row = x_in.data() + i * vocab;
      C row_max = row[0];
      for (int64_t v = 1; v < vocab; ++v)
        row_max = std::max(row_max, row[v]);
      C sum = 0;
      for (int64_t v = 0; v < vocab; ++v)
        sum += std::exp(row[v] - row_max);
      lse_p[i] = row_max + std::log(sum);
    }
    double total = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < rows; ++i) {
      if (target[i] < 0)
        continue;
      total += static_cast<double>(lse_p[i]) - static_cast<double>(x_in[i * vocab + target[i]]);
      ++counted;
    }
    call.loss.ptr<C>()[0] =
        static_cast<C>(counted > 0 ? total / static_cast<double>(counted) : 0.0);
  });
}

void CpuBackend::run_op(const CrossEntropyBackwardArgs& call) {
  const int64_t rows = call.logits.rows(), vocab = call.logits.dim(-1);
  check_index_range("cross_entropy_backward", "call.targets", call.targets, -1, vocab);
  const int32_t* target = call.targets.ptr<int32_t>();
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i)
    counted += target[i] >= 0 ? 1 : 0;
  if (counted == 0)
    return;
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.logits);
    Output<C> dx_acc(call.dlogits, OutputMode::accumulate);
    const C* lse_p = call.lse.ptr<C>();
    const C factor = static_cast<C>(call.dloss / static_cast<double>(counted));
    MODAR_PARALLEL_FOR_IF(worth_threads(rows * vocab))
    for (int64_t i = 0; i < rows; ++i) {
      if (target[i] < 0)
        continue;
      const C* row = x_in.data() + i * vocab;
      C* dst = dx_acc.data() + i * vocab;
      for (int64_t v = 0; v < vocab; ++v)
        dst[v] += factor * std::exp(row[v] - lse_p[i]);
      dst[target[i]] -= factor;
    }
    dx_acc.commit();
  });
}

void CpuBackend::run_op(const BceWithLogitsForwardArgs& call) {
  const int64_t rows = call.logits.numel();
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    const C* x = call.logits.ptr<C>();
    const C* t = call.targets.ptr<C>();
    double total = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      const double xi = x[i];
      total +=
          std::max(xi, 0.0) - xi * static_cast<double>(t[i]) + std::log1p(std::exp(-std::abs(xi)));
    }
    call.loss.ptr<C>()[0] = static_cast<C>(rows > 0 ? total / static_cast<double>(rows) : 0.0);
  });
}

void CpuBackend::run_op(const BceWithLogitsBackwardArgs& call) {
  const int64_t rows = call.logits.numel();
  if (rows == 0)
    return;
  dispatch_compute(call.logits.dtype, [&](auto tag) {
    using C = decltype(tag);
    const C* x = call.logits.ptr<C>();
    const C* t = call.targets.ptr<C>();
    C* dx = call.dlogits.ptr<C>();
    const C factor = static_cast<C>(call.dloss / static_cast<double>(rows));
    for (int64_t i = 0; i < rows; ++i)
      dx[i] += factor * (sigmoid(x[i]) - t[i]);
  });
}

}  // namespace modar::runtime::cpu
