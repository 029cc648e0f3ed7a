// Time of an attention op under the configured kernel (train.attention_kernel).
//
// flash: the TimingModel's own time (FlashAttention: half square, no scores
// in HBM).  unfused (Megatron-LM before FlashAttention, Narayanan et al. 2021):
// the two batched GEMMs run the whole s_q x s_k square (the causal mask is
// applied to computed scores), at the roofline FLOP rate, plus the score
// matrix's HBM traffic (Megatron-LM 2021 CoreAttention: baddbmm, fused
// scale-mask-softmax, torch dropout, bmm): forward 6 passes of B bytes per
// score (QK^T write, softmax read + write, dropout read + write, AV read) and
// the dropout mask's 1-byte write; backward 9 passes (dP' write and the
// dropped probabilities read by the AV GEMM's two gradients, dropout backward
// read + write, softmax backward reads P and dP and writes dS, dS read by the
// dQ and dK GEMMs) and the mask's 1-byte read.  docs/cluster.md.
#pragma once

#include "modar/cost_model.hpp"

namespace modar::detail {

inline constexpr double kUnfusedScorePassesForward = 6.0;
inline constexpr double kUnfusedScorePassesBackward = 9.0;
inline constexpr double kDropoutMaskBytes = 1.0;  // torch dropout: a uint8 / bool mask

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
  const double flops = (backward ? 2.0 : 1.0) * 4.0 * scores * d_head;
  const double bytes = ((backward ? kUnfusedScorePassesBackward : kUnfusedScorePassesForward) *
                           static_cast<double>(dtype_bytes(op.shape.dtype)) +
                       kDropoutMaskBytes) *
                      scores;
  const DeviceCeilings& c = timing.profile().ceilings;
  *source = TimingModel::Source::roofline;
  return flops / c.roofline_flops(op.shape.dtype) + bytes / c.roofline_bandwidth() +
         3.0 * c.launch_overhead_s;  // GEMM, softmax, dropout (x2 backward: counted once)
}

}  // namespace modar::detail
