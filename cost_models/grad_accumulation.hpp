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
// The main gradients' dtype is train.grad_reduce_in_fp32: "auto" (default)
// is fp32 but for fp16 training, where it is fp16, as Megatron does: its DDP
// allocates the gradient buffer in param.dtype unless
// --accumulate-allreduce-grads-in-fp32 is given, which bf16 forces (Megatron-
// LM and Megatron-Core alike; DeepSpeed's fp16 optimizer likewise reduces fp16
// gradients); "true" is fp32 for every dtype, "false" the parameters' dtype
// (bf16 with Megatron-Core's --grad-reduce-in-bf16).  Main gradients below
// fp32 are copied into fp32 by the optimizer before it reads them
// (_copy_model_grads_to_main_grads).
#pragma once

#include "modar/config.hpp"
#include "modar/cost_model.hpp"

namespace modar::detail {

inline constexpr double kMainGradBytesPerParam = 4.0;  // fp32 main gradients (memory.cpp)

// Bytes per parameter of the main gradients as accumulated and reduced.
inline double main_grad_bytes_per_param(const Config& config) {
  const TrainConfig& t = config.train;
  const double param_bytes = static_cast<double>(dtype_bytes(t.dtype));
  if (param_bytes >= kMainGradBytesPerParam) {
    return kMainGradBytesPerParam;  // fp32 (or wider) parameters: fp32 main gradients
  }
  switch (t.grad_reduce_in_fp32) {
    case GradReduceInFp32::fp32:
      return kMainGradBytesPerParam;
    case GradReduceInFp32::param_dtype:
      return param_bytes;
    case GradReduceInFp32::by_dtype:
      break;
  }
  return t.dtype == DType::fp16 ? param_bytes : kMainGradBytesPerParam;
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
// _unscale_main_grads_and_check_for_nan: read + write, 8 B); main gradients
// below fp32 are first copied into fp32 (read their bytes, write 4).
// Scaling by the clip coefficient (another read + write) happens only on
// steps whose norm exceeds the limit and is not counted.
inline double grad_norm_bytes(double params, const Config& config) {
  const double main_grad_bytes = main_grad_bytes_per_param(config);
  const double copy_bytes =
      main_grad_bytes < kMainGradBytesPerParam ? main_grad_bytes + kMainGradBytesPerParam : 0.0;
  const double unscale_bytes = config.train.dtype == DType::fp16 ? 8.0 : 0.0;
  return params * (4.0 + unscale_bytes + copy_bytes);
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
