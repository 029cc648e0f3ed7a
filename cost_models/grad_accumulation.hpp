// Time of adding one micro-batch's weight gradients into the main-gradient
// buffer (train.grad_accumulation; docs/cluster.md).
//
// fused (default): the wgrad GEMM accumulates into the buffer (beta = 1;
// Megatron-Core / Transformer Engine gradient_accumulation_fusion, apex
// fused_weight_gradient_mlp_cuda, NVIDIA/apex#1297, 2022): no extra pass.
// unfused (Megatron-LM 2021): the GEMM writes a fresh gradient and the DDP
// param hook adds it in, param.main_grad.add_(param.grad)
// (megatron/model/distributed.py, _make_param_hook): per micro-batch and
// parameter, read the fp32 main gradient and the B-byte gradient, write the
// main gradient back, at the elementwise family's bandwidth.
#pragma once

#include "modar/config.hpp"
#include "modar/cost_model.hpp"

namespace modar::detail {

inline constexpr double kMainGradBytesPerParam = 4.0;  // fp32 main gradients (memory.cpp)

// Bytes moved per micro-batch (0 when fused).
inline double grad_accumulation_bytes(double params, const Config& config) {
  if (config.train.grad_accumulation == GradAccumulation::fused || params <= 0.0) {
    return 0.0;
  }
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  return params * (2.0 * kMainGradBytesPerParam + B);
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

}  // namespace modar::detail
