// Time of an attention op under the configured kernel (train.attention_kernel).
//
// flash: the TimingModel's own time (FlashAttention: half square, no scores
// in HBM; on a GPU kernel-model profile, the FlashAttention papers' rates).
// unfused (Megatron-LM before FlashAttention, Narayanan et al. 2021): the two
// batched GEMMs run the whole s_q x s_k square (the causal mask is applied to
// computed scores) and the score matrix makes these passes through HBM
// (Megatron-LM 2021 CoreAttention: baddbmm, fused scale-mask-softmax, torch
// dropout, bmm): forward 6 passes of B bytes per score (QK^T write, softmax
// read + write, dropout read + write, AV read) and the dropout mask's 1-byte
// write; backward 9 passes (dP' write and the dropped probabilities read by
// the AV GEMM's two gradients, dropout backward read + write, softmax
// backward reads P and dP and writes dS, dS read by the dQ and dK GEMMs) and
// the mask's 1-byte read.  docs/cluster.md.
//
// Roofline profiles: the GEMM FLOPs at the GEMM rate plus every pass at the
// softmax family's bandwidth.  Kernel-model profiles: each batched GEMM by the
// GEMM model (its own reads and writes of the scores inside its memory-bound
// regime: 2 of the forward's passes, 4 of the backward's) plus the other
// passes (forward 4, backward 5, and the mask) at the softmax bandwidth.
#pragma once

#include "modar/cost_model.hpp"
#include "modar/kernel_model.hpp"

namespace modar::detail {

inline constexpr double kUnfusedScorePassesForward = 6.0;
inline constexpr double kUnfusedScorePassesBackward = 9.0;
inline constexpr double kUnfusedGemmScorePassesForward = 2.0;   // QK^T write, AV read
inline constexpr double kUnfusedGemmScorePassesBackward = 4.0;  // dP' write, P' read, dS read x 2
inline constexpr double kDropoutMaskBytes = 1.0;  // torch dropout: a uint8 / bool mask

// The batched GEMMs of unfused attention on a kernel-model profile.
inline double unfused_attention_gemms_s(const OpShape& shape, bool backward,
                                        const KernelRates& rates) {
  const AttentionDims x = shape.as<AttentionDims>();
  const int64_t batch = x.sequences * x.heads, s_q = x.query_len, s_k = x.key_len, d = x.head_dim;
  const auto time = [&](int64_t m, int64_t n, int64_t k) {
    return gpu_gemm_time({m, n, k, batch, shape.dtype}, rates).seconds;
  };
  if (!backward) {
    return time(s_q, s_k, d) + time(s_q, d, s_k);  // S = Q K^T, O = P' V
  }
  // dV = P'^T dO, dP' = dO V^T, dQ = dS K, dK = dS^T Q.
  return time(s_k, d, s_q) + time(s_q, s_k, d) + time(s_q, d, s_k) + time(s_k, d, s_q);
}

inline double attention_kernel_time_s(const OpRecord& op, const TimingModel& timing,
                                      AttentionKernel kernel, TimingModel::Source* source) {
  if (kernel == AttentionKernel::flash || op.shape.kind != OpKind::attention) {
    return timing.op_time_s(op, source);
  }
  const AttentionDims x = op.shape.as<AttentionDims>();
  const double scores = static_cast<double>(x.sequences) * static_cast<double>(x.heads) *
                        static_cast<double>(x.query_len) * static_cast<double>(x.key_len);
  const double d_head = static_cast<double>(x.head_dim);
  const bool backward = op.pass == Pass::backward;
  const double element_bytes = static_cast<double>(dtype_bytes(op.shape.dtype));
  const KernelRates& rates = timing.rates();
  const double softmax_bandwidth = rates.bandwidth_of(MemoryFamily::softmax);
  if (timing.shape_aware()) {
    const double passes = backward ? kUnfusedScorePassesBackward - kUnfusedGemmScorePassesBackward
                                   : kUnfusedScorePassesForward - kUnfusedGemmScorePassesForward;
    const double pass_bytes = (passes * element_bytes + kDropoutMaskBytes) * scores;
    *source = TimingModel::Source::kernel_model;
    return unfused_attention_gemms_s(op.shape, backward, rates) + pass_bytes / softmax_bandwidth +
           2.0 * rates.launch_overhead_s;  // softmax, dropout
  }
  const double flops = (backward ? 2.0 : 1.0) * 4.0 * scores * d_head;
  const double bytes =
      ((backward ? kUnfusedScorePassesBackward : kUnfusedScorePassesForward) * element_bytes +
       kDropoutMaskBytes) *
      scores;
  const bool wide = op.shape.dtype == DType::fp32 || op.shape.dtype == DType::fp64;
  *source = TimingModel::Source::roofline;
  return flops / (wide ? rates.fp32_flops : rates.gemm_flops) + bytes / softmax_bandwidth +
         3.0 * rates.launch_overhead_s;  // GEMM, softmax, dropout (x2 backward: counted once)
}

}  // namespace modar::detail
