// Time of an attention op under the configured kernel (train.attention_kernel).
//
// flash: the TimingModel's own time (FlashAttention: half square, no scores
// in HBM).  unfused (Megatron-LM before FlashAttention, Narayanan et al. 2021):
// the two batched GEMMs run the whole s_q x s_k square (the causal mask is
// applied to computed scores), at the roofline FLOP rate, plus the score
// matrix's HBM traffic: forward 6 passes of B bytes per score (QK^T write,
// fused scale-mask-softmax read + write, dropout read + write, AV read),
// backward 8 (dropout and softmax backward read P, dP and write dS, dS read by
// the dQ and dK GEMMs); the 1-byte dropout mask is ignored.  docs/cluster.md.
#pragma once

#include "modar/cost_model.hpp"

namespace modar::detail {

inline constexpr double kUnfusedScorePassesForward = 6.0;
inline constexpr double kUnfusedScorePassesBackward = 8.0;

inline double attention_kernel_time_s(const OpRecord& op, const TimingModel& timing,
                                      AttentionKernel kernel, TimingModel::Source* source) {
  if (kernel == AttentionKernel::flash || op.shape.kind != OpKind::attention) {
    return timing.op_time_s(op, source);
  }
  const auto& x = op.shape.dims;
  const double scores = static_cast<double>(x[0]) * static_cast<double>(x[1]) *
                        static_cast<double>(x[3]) * static_cast<double>(x[4]);
  const double d_head = static_cast<double>(x[5]);
  const bool backward = op.pass == Pass::backward;
  const double flops = (backward ? 2.0 : 1.0) * 4.0 * scores * d_head;
  const double bytes = (backward ? kUnfusedScorePassesBackward : kUnfusedScorePassesForward) *
                       static_cast<double>(dtype_bytes(op.shape.dtype)) * scores;
  const DeviceCeilings& c = timing.profile().ceilings;
  *source = TimingModel::Source::roofline;
  return flops / c.roofline_flops(op.shape.dtype) + bytes / c.roofline_bandwidth() +
         3.0 * c.launch_overhead_s;  // GEMM, softmax, dropout (x2 backward: counted once)
}

}  // namespace modar::detail
