// Time of adding one micro-batch's weight gradients into the main-gradient
// buffer (train.grad_accumulation; docs/cluster.md), and the bytes of the main
// gradients themselves.
//
// fused (default): the wgrad GEMM accumulates into the buffer (beta = 1;
// Megatron-Core / Transformer Engine gradient_accumulation_fusion, apex
// fused_weight_gradient_mlp_cuda, NVIDIA/apex#1297, 2022): no extra pass.
// unfused (Megatron-LM 2021): the GEMM writes a fresh gradient and the DDP
// param hook adds it in, param.main_grad.add_(param.grad)
// (megatron/model/distributed.py, _make_param_hook): per micro-batch and
// parameter, read the fp32 main gradient and the B-byte gradient, write the
// main gradient back, at the elementwise family's bandwidth.
//
// The main gradients are fp32 (4 B) but for fp16 training, where they are
// fp16: Megatron's DDP allocates its gradient buffer in param.dtype unless
// --accumulate-allreduce-grads-in-fp32 is given, which bf16 forces (Megatron-
// LM and Megatron-Core alike; DeepSpeed's fp16 optimizer likewise reduces fp16
// gradients), so fp16 runs accumulate and all-reduce fp16 gradients, and the
// fp16 optimizer copies them into fp32 before unscaling
// (_copy_model_grads_to_main_grads).
#pragma once

#include "modar/config.hpp"
#include "modar/cost_model.hpp"

namespace modar::detail {

inline constexpr double kMainGradBytesPerParam = 4.0;  // fp32 main gradients (memory.cpp)

// Bytes per parameter of the main gradients as accumulated and reduced.
inline double main_grad_bytes_per_param(const Config& config) {
  return config.train.dtype == DType::fp16 ? 2.0 : kMainGradBytesPerParam;
}

// Bytes moved per micro-batch (0 when fused).
inline double grad_accumulation_bytes(double params, const Config& config) {
  if (config.train.grad_accumulation == GradAccumulation::fused || params <= 0.0) {
    return 0.0;
  }
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  return params * (2.0 * main_grad_bytes_per_param(config) + B);
}

inline double grad_accumulation_time_s(double params, const Config& config,
                                       const KernelRates& rates) {
  const double bytes = grad_accumulation_bytes(params, config);
  if (bytes <= 0.0) {
    return 0.0;
  }
  const double bandwidth = rates.bandwidth_of(MemoryFamily::elementwise);
  return (bandwidth > 0.0 ? bytes / bandwidth : 0.0) + rates.launch_overhead_s;
}

// The gradient norm (and clipping) pass once per step (Megatron-LM
// clip_grad_norm_fp32, torch.nn.utils.clip_grad_norm_): read the fp32 main
// gradients for the norm, 4 B per parameter; fp16 training first unscales
// them in place and checks for inf / NaN (Megatron-LM's
// _unscale_main_grads_and_check_for_nan: read + write, 8 B), after copying
// its fp16 main gradients into fp32 (read 2, write 4).
// Scaling by the clip coefficient (another read + write) happens only on
// steps whose norm exceeds the limit and is not counted.
inline double grad_norm_bytes(double params, const Config& config) {
  const bool fp16 = config.train.dtype == DType::fp16;
  return params * (4.0 + (fp16 ? 8.0 + 2.0 + 4.0 : 0.0));
}

inline double grad_norm_time_s(double params, const Config& config, const KernelRates& rates) {
  if (params <= 0.0) {
    return 0.0;
  }
  const double bandwidth = rates.bandwidth_of(MemoryFamily::grad_norm);
  return (bandwidth > 0.0 ? grad_norm_bytes(params, config) / bandwidth : 0.0) +
         rates.launch_overhead_s;
}

}  // namespace modar::detail
