// Time of an attention op under the configured kernel (train.attention_kernel).
//
// flash1 / flash2 / flash3 / triton: a named FlashAttention generation, the
// kernel model's FlashAttention time with the profile's attention rate
// scaled to that generation's published rate (kernel_model.hpp
// flash_generation_factor; GPU kernel-model profiles with a device class).
//
// flash: the TimingModel's own time (FlashAttention: half square, no scores
// in HBM; on a GPU kernel-model profile, the FlashAttention papers' rates;
// with attention dropout the kernel regenerates its mask from the RNG state,
// no extra traffic).  unfused (Megatron-LM before FlashAttention, Narayanan et
// al. 2021): the two batched GEMMs run the whole s_q x s_k square (the causal
// mask is applied to computed scores) and the score matrix makes these passes
// through HBM (Megatron-LM 2021 CoreAttention: baddbmm, fused
// scale-mask-softmax, torch dropout, bmm): forward 4 passes of B bytes per
// score (QK^T write, softmax read + write, AV read), with attention dropout 6
// (+ dropout read + write) and the mask's 1-byte write; backward 7 passes (dP
// write and the probabilities read by the AV GEMM's weight gradient, softmax
// backward reads P and dP and writes dS, dS read by the dQ and dK GEMMs), with
// dropout 9 (+ the dropout backward's read + write) and the mask's 1-byte
// read.  docs/cluster.md.
//
// Roofline profiles: the GEMM FLOPs at the GEMM rate plus every pass at the
// softmax family's bandwidth.  Kernel-model profiles: each batched GEMM by the
// GEMM model (its own reads and writes of the scores inside its memory-bound
// regime: 2 of the forward's passes, 4 of the backward's) plus the other
// passes (forward 4, backward 5, and the mask) at the softmax bandwidth.
#pragma once

#include "cost_model_internal.hpp"
#include "modar/cost_model.hpp"
#include "modar/kernel_model.hpp"

namespace modar::detail {

inline constexpr double kUnfusedScorePassesForward = 4.0;
inline constexpr double kUnfusedScorePassesBackward = 7.0;
inline constexpr double kUnfusedDropoutPasses = 2.0;            // each way, with attention dropout
inline constexpr double kUnfusedGemmScorePassesForward = 2.0;   // QK^T write, AV read
inline constexpr double kUnfusedGemmScorePassesBackward = 4.0;  // dP' write, P' read, dS read x 2

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

// A named FlashAttention generation (flash1 / flash2 / flash3 / triton): the
// kernel model's FlashAttention time at the profile's attention rate times
// the generation's factor (check_attention_kernel has accepted the pair).
inline double flash_generation_time_s(const OpRecord& op, const TimingModel& timing,
                                      AttentionKernel kernel, TimingModel::Source* source) {
  const OpCost cost = op_cost(op.shape, op.pass, AttentionFlops::flash);
  const AttentionDims x = op.shape.as<AttentionDims>();
  const AttentionShape attention{x.sequences, x.heads,    x.kv_heads,    x.query_len,
                                 x.key_len,   x.head_dim, x.causal != 0, op.shape.dtype};
  *source = TimingModel::Source::kernel_model;
  return flash_attention_time_s(
      attention, op.pass == Pass::backward ? Pass::backward : Pass::forward, cost.flops, cost.bytes,
      timing.rates(), flash_generation_factor(timing.profile().kernel.device_class, kernel));
}

inline double attention_kernel_time_s(const OpRecord& op, const TimingModel& timing,
                                      AttentionKernel kernel, bool attention_dropout,
                                      TimingModel::Source* source) {
  if (kernel == AttentionKernel::flash || op.shape.kind != OpKind::attention) {
    return timing.op_time_s(op, source);
  }
  if (kernel != AttentionKernel::unfused) {
    return flash_generation_time_s(op, timing, kernel, source);
  }
  const AttentionDims x = op.shape.as<AttentionDims>();
  const double scores = static_cast<double>(x.sequences) * static_cast<double>(x.heads) *
                        static_cast<double>(x.query_len) * static_cast<double>(x.key_len);
  const double d_head = static_cast<double>(x.head_dim);
  const bool backward = op.pass == Pass::backward;
  const double element_bytes = static_cast<double>(dtype_bytes(op.shape.dtype));
  const KernelRates& rates = timing.rates();
  const double softmax_bandwidth = rates.bandwidth_of(MemoryFamily::softmax);
  const double dropout_passes = attention_dropout ? kUnfusedDropoutPasses : 0.0;
  const double mask_bytes = attention_dropout ? kDropoutMaskBytes : 0.0;
  const double dropout_launches = attention_dropout ? 1.0 : 0.0;
  if (timing.shape_aware()) {
    const double passes = (backward ? kUnfusedScorePassesBackward - kUnfusedGemmScorePassesBackward
                                    : kUnfusedScorePassesForward - kUnfusedGemmScorePassesForward) +
                          dropout_passes;
    const double pass_bytes = (passes * element_bytes + mask_bytes) * scores;
    *source = TimingModel::Source::kernel_model;
    return unfused_attention_gemms_s(op.shape, backward, rates) + pass_bytes / softmax_bandwidth +
           (1.0 + dropout_launches) * rates.launch_overhead_s;  // softmax (+ dropout)
  }
  const double flops = (backward ? 2.0 : 1.0) * 4.0 * scores * d_head;
  const double bytes =
      (((backward ? kUnfusedScorePassesBackward : kUnfusedScorePassesForward) + dropout_passes) *
           element_bytes +
       mask_bytes) *
      scores;
  const bool wide = op.shape.dtype == DType::fp32 || op.shape.dtype == DType::fp64;
  *source = TimingModel::Source::roofline;
  // GEMM, softmax (+ dropout) launches (x2 backward: counted once).
  return flops / (wide ? rates.fp32_flops : rates.gemm_flops) + bytes / softmax_bandwidth +
         (2.0 + dropout_launches) * rates.launch_overhead_s;
}

}  // namespace modar::detail
