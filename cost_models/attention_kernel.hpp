// Time of an attention op under the configured kernel (train.attention_kernel).
//
// flash: the TimingModel's own time (FlashAttention: half square, no scores
// in HBM; with attention dropout the kernel regenerates its mask from the RNG
// state, no extra traffic).  unfused (Megatron-LM before FlashAttention,
// Narayanan et al. 2021): the two batched GEMMs run the whole s_q x s_k
// square (the causal mask is applied to computed scores), at the roofline
// FLOP rate, plus the score matrix's HBM traffic (Megatron-LM 2021
// CoreAttention: baddbmm, fused scale-mask-softmax, torch dropout, bmm):
// forward 4 passes of B bytes per score (QK^T write, softmax read + write, AV
// read), with attention dropout 6 (+ dropout read + write) and the mask's
// 1-byte write; backward 7 passes (dP write, P read by the AV GEMM's weight
// gradient, softmax backward reads P and dP and writes dS, dS read by the dQ
// and dK GEMMs), with dropout 9 (the dropped probabilities' gradient written
// and read back by the dropout backward) and the mask's 1-byte read.
// docs/cluster.md.
#pragma once

#include "cost_model_internal.hpp"
#include "modar/cost_model.hpp"

namespace modar::detail {

inline constexpr double kUnfusedScorePassesForward = 4.0;
inline constexpr double kUnfusedScorePassesBackward = 7.0;
inline constexpr double kUnfusedDropoutPasses = 2.0;  // each way, with attention dropout

inline double attention_kernel_time_s(const OpRecord& op, const TimingModel& timing,
                                      AttentionKernel kernel, bool attention_dropout,
                                      TimingModel::Source* source) {
  if (kernel == AttentionKernel::flash || op.shape.kind != OpKind::attention) {
    return timing.op_time_s(op, source);
  }
  const auto& x = op.shape.dims;
  const double scores = static_cast<double>(x[0]) * static_cast<double>(x[1]) *
                        static_cast<double>(x[3]) * static_cast<double>(x[4]);
  const double d_head = static_cast<double>(x[5]);
  const bool backward = op.pass == Pass::backward;
  const double flops = (backward ? 2.0 : 1.0) * 4.0 * scores * d_head;
  const double passes = (backward ? kUnfusedScorePassesBackward : kUnfusedScorePassesForward) +
                        (attention_dropout ? kUnfusedDropoutPasses : 0.0);
  const double bytes =
      (passes * static_cast<double>(dtype_bytes(op.shape.dtype)) +
       (attention_dropout ? kDropoutMaskBytes : 0.0)) *
      scores;
  const DeviceCeilings& c = timing.profile().ceilings;
  *source = TimingModel::Source::roofline;
  // GEMM, softmax (+ dropout) launches (x2 backward: counted once).
  return flops / c.roofline_flops(op.shape.dtype) + bytes / c.roofline_bandwidth() +
         (attention_dropout ? 3.0 : 2.0) * c.launch_overhead_s;
}

}  // namespace modar::detail
