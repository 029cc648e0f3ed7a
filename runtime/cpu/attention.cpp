// runtime/cpu/attention.cpp: causal (or full) softmax attention with GQA and
// per-sequence valid lengths, forward and backward.
//
// Layout: q [b, s, H, d_h]; k, v [b, s, G, d_h]; out like q; lse [b, H, s].
// Query head h reads kv head g = h / (H / G).  For one (sequence, head) the
// head's rows are a strided [s, d_h] matrix (row stride H*d_h or G*d_h), which
// Eigen maps without copying (OuterStride).  With n = valid length:
//   S = scale * Q K^T  (n x n), masked to j <= i when causal,
//   lse_i = log sum_j exp(S_ij),  P = exp(S - lse),  O = P V.
// Rows i >= n are padding: out = 0, lse = 0, no gradient.
// Backward (FlashAttention-2 formulation, P recomputed from the saved lse):
//   dV += P^T dO,   dP = dO V^T,   D_i = <dO_i, O_i>,   dS = P (.) (dP - D),
//   dQ += scale dS K,   dK += scale dS^T Q.
// The n x n score matrix is materialised per head: fine for a reference (and
// what the CPU profiler times); memory O(s^2) per thread.
// Threads: the forward runs (sequence, head) pairs in parallel; the backward
// runs (sequence, kv head) pairs in parallel so that heads sharing a kv head
// accumulate dK / dV in one thread.
#include <cmath>
#include <limits>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {
namespace {

struct AttentionDims {
  int64_t batch, seq, heads, kv_heads, d_head, group;
  double scale;
  bool causal;
};

AttentionDims attention_dims(const TensorView& q, const TensorView& k,
                             const AttentionParams& params) {
  AttentionDims dims{};
  dims.batch = q.shape[0];
  dims.seq = q.shape[1];
  dims.heads = q.shape[2];
  dims.d_head = q.shape[3];
  dims.kv_heads = k.shape[2];
  dims.group = dims.heads / dims.kv_heads;
  dims.scale = params.softmax_scale > 0.0 ? params.softmax_scale
                                          : 1.0 / std::sqrt(static_cast<double>(dims.d_head));
  dims.causal = params.causal;
  return dims;
}

std::vector<int64_t> sequence_lengths(const TensorView& valid_lengths, int64_t batch, int64_t seq) {
  std::vector<int64_t> lengths(static_cast<size_t>(batch), seq);
  if (!valid_lengths.empty()) {
    check_index_range("attention", "valid_lengths", valid_lengths, 0, seq + 1);
    for (int64_t i = 0; i < batch; ++i)
      lengths[static_cast<size_t>(i)] = valid_lengths.ptr<int32_t>()[i];
  }
  return lengths;
}

// S = scale * Q K^T for one (sequence, head).
template <class C>
void scaled_scores(const ConstStridedMap<C>& q, const ConstStridedMap<C>& k,
                   const AttentionDims& dims, RowMatrix<C>& p) {
  p.noalias() = q * k.transpose();
  p *= static_cast<C>(dims.scale);
}

// lse_i = log sum over the visible j of exp(S_ij), with the row max subtracted.
template <class C>
void row_log_sum_exp(const RowMatrix<C>& p, int64_t n, bool causal, C* lse) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t visible = causal ? i + 1 : n;
    C row_max = -std::numeric_limits<C>::infinity();
    for (int64_t j = 0; j < visible; ++j)
      row_max = std::max(row_max, p(i, j));
    C sum = 0;
    for (int64_t j = 0; j < visible; ++j)
      sum += std::exp(p(i, j) - row_max);
    lse[i] = row_max + std::log(sum);
  }
}

// S -> P = exp(S - lse) on the visible entries, 0 on the masked ones.
template <class C>
void scores_to_probabilities(RowMatrix<C>& p, int64_t n, bool causal, const C* lse) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t visible = causal ? i + 1 : n;
    for (int64_t j = 0; j < visible; ++j)
      p(i, j) = std::exp(p(i, j) - lse[i]);
    for (int64_t j = visible; j < n; ++j)
      p(i, j) = 0;
  }
}

}  // namespace

void CpuBackend::run_op(const AttentionForwardArgs& call) {
  const AttentionDims dims = attention_dims(call.q, call.k, call.params);
  const std::vector<int64_t> lengths = sequence_lengths(call.valid_lengths, dims.batch, dims.seq);
  dispatch_compute(call.q.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> q_in(call.q), k_in(call.k), v_in(call.v);
    Output<C> out_w(call.out, OutputMode::overwrite);
    C* lse_p = call.lse.ptr<C>();
    const int64_t q_stride = dims.heads * dims.d_head, kv_stride = dims.kv_heads * dims.d_head;
    const int64_t pairs = dims.batch * dims.heads;
    MODAR_PARALLEL_FOR_IF(worth_threads(pairs * dims.seq * dims.seq * dims.d_head))
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int64_t seq_index = pair / dims.heads, head = pair % dims.heads;
      const int64_t kv_head = head / dims.group, n = lengths[static_cast<size_t>(seq_index)];
      const int64_t q_offset = seq_index * dims.seq * q_stride + head * dims.d_head;
      const int64_t kv_offset = seq_index * dims.seq * kv_stride + kv_head * dims.d_head;
      C* lse_row = lse_p + (seq_index * dims.heads + head) * dims.seq;
      StridedMap<C> o(out_w.data() + q_offset, dims.seq, dims.d_head,
                      Eigen::OuterStride<>(q_stride));
      o.setZero();
      for (int64_t i = 0; i < dims.seq; ++i)
        lse_row[i] = 0;
      if (n == 0)
        continue;
      ConstStridedMap<C> qm(q_in.data() + q_offset, n, dims.d_head, Eigen::OuterStride<>(q_stride));
      ConstStridedMap<C> km(k_in.data() + kv_offset, n, dims.d_head,
                            Eigen::OuterStride<>(kv_stride));
      ConstStridedMap<C> vm(v_in.data() + kv_offset, n, dims.d_head,
                            Eigen::OuterStride<>(kv_stride));
      RowMatrix<C> p(n, n);
      scaled_scores<C>(qm, km, dims, p);
      row_log_sum_exp<C>(p, n, dims.causal, lse_row);
      scores_to_probabilities<C>(p, n, dims.causal, lse_row);
      o.topRows(n).noalias() = p * vm;
    }
    out_w.commit();
  });
}

void CpuBackend::run_op(const AttentionBackwardArgs& call) {
  const AttentionDims dims = attention_dims(call.q, call.k, call.params);
  const std::vector<int64_t> lengths = sequence_lengths(call.valid_lengths, dims.batch, dims.seq);
  dispatch_compute(call.q.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> q_in(call.q), k_in(call.k), v_in(call.v), out_in(call.out), dout_in(call.dout);
    Output<C> dq_acc(call.dq, OutputMode::accumulate), dk_acc(call.dk, OutputMode::accumulate),
        dv_acc(call.dv, OutputMode::accumulate);
    const C* lse_p = call.lse.ptr<C>();
    const int64_t q_stride = dims.heads * dims.d_head, kv_stride = dims.kv_heads * dims.d_head;
    const int64_t pairs = dims.batch * dims.kv_heads;
    const C scale = static_cast<C>(dims.scale);
    MODAR_PARALLEL_FOR_IF(worth_threads(pairs * dims.seq * dims.seq * dims.d_head))
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int64_t seq_index = pair / dims.kv_heads, kv_head = pair % dims.kv_heads;
      const int64_t n = lengths[static_cast<size_t>(seq_index)];
      if (n == 0)
        continue;
      const int64_t kv_offset = seq_index * dims.seq * kv_stride + kv_head * dims.d_head;
      ConstStridedMap<C> km(k_in.data() + kv_offset, n, dims.d_head,
                            Eigen::OuterStride<>(kv_stride));
      ConstStridedMap<C> vm(v_in.data() + kv_offset, n, dims.d_head,
                            Eigen::OuterStride<>(kv_stride));
      RowMatrix<C> p(n, n), dp(n, n);
      for (int64_t head = kv_head * dims.group; head < (kv_head + 1) * dims.group; ++head) {
        const int64_t q_offset = seq_index * dims.seq * q_stride + head * dims.d_head;
        const Eigen::OuterStride<> qs(q_stride);
        ConstStridedMap<C> qm(q_in.data() + q_offset, n, dims.d_head, qs);
        ConstStridedMap<C> om(out_in.data() + q_offset, n, dims.d_head, qs);
        ConstStridedMap<C> dom(dout_in.data() + q_offset, n, dims.d_head, qs);
        scaled_scores<C>(qm, km, dims, p);
        scores_to_probabilities<C>(p, n, dims.causal,
                                   lse_p + (seq_index * dims.heads + head) * dims.seq);
        if (dv_acc.data()) {
          StridedMap<C> dvm(dv_acc.data() + kv_offset, n, dims.d_head,
                            Eigen::OuterStride<>(kv_stride));
          dvm.noalias() += p.transpose() * dom;
        }
        dp.noalias() = dom * vm.transpose();
        for (int64_t i = 0; i < n; ++i) {
          const C row_dot = dom.row(i).dot(om.row(i));
          for (int64_t j = 0; j < n; ++j)
            dp(i, j) = p(i, j) * (dp(i, j) - row_dot);
        }
        if (dq_acc.data()) {
          StridedMap<C> dqm(dq_acc.data() + q_offset, n, dims.d_head, qs);
          dqm.noalias() += scale * (dp * km);
        }
        if (dk_acc.data()) {
          StridedMap<C> dkm(dk_acc.data() + kv_offset, n, dims.d_head,
                            Eigen::OuterStride<>(kv_stride));
          dkm.noalias() += scale * (dp.transpose() * qm);
        }
      }
    }
    dq_acc.commit();
    dk_acc.commit();
    dv_acc.commit();
  });
}

}  // namespace modar::runtime::cpu
